"""Tripwires: each private name of a library that the product relies on, pinned to the
version reviewed, so an upgrade that renames or rewrites it fails here, loudly and by
name, instead of silently turning a fix off (the pattern of tests/test_transport.py,
kombu's `Channel._brpop_read`, and tests/test_httpx_hook.py, httpcore2's
`_network_backend`). A failure says what to re-read; then update the pin.

Each pins the library's code by the sha256 of its source where the product relies on
what that code does, and by name and signature where it relies only on being called.
"""

from __future__ import annotations

import hashlib
import inspect

import webencodings
from celery.worker import loops
from celery.worker.consumer import Consumer
from celery.worker.request import Request
from django.conf import settings
from drf_spectacular.openapi import AutoSchema
from html5lib._inputstream import EncodingParser
from kombu.transport.redis import PRIORITY_STEPS, Channel
from redis.connection import AbstractConnection
from redis.sentinel import SentinelManagedConnection

from audits.api.schema import PlumbAutoSchema
from config.celery_app import app, queue_list_keys
from config.redis import FailoverAwareConnection
from jobs.consumer import DeadLetteringConsumer
from jobs.task import PlumbRequest


def sha256_of_source(function) -> str:
    return hashlib.sha256(inspect.getsource(function).encode()).hexdigest()


# --- Celery: jobs.task.PlumbRequest (DECISIONS.md, "A hard time limit dead-letters with
# the request's own context (one private attribute)") ---------------------------------

# celery 5.7.0's Request.on_timeout, reviewed: for a hard limit it calls the task's
# on_failure in the worker's main process (where the task's request stack is empty),
# which is why PlumbRequest pushes `self._context` around it.
REVIEWED_ON_TIMEOUT = "3d26ce896008646dca770156ca4028a2e6569d0dbcd3f7ba282b0aa7666fcbc9"
# ... and Request._context, a cached Context built from the message's request dict and
# embed: the attempt count (`retries`) and headers PlumbTask's failure hooks read.
REVIEWED_CONTEXT = "d5c28db447e15732b26dcdb816a228b88cf14b11d3c7fee5b9038c7e67fdc28c"


def test_celerys_request_context_is_the_version_reviewed():
    assert sha256_of_source(Request._context.func) == REVIEWED_CONTEXT, (
        "celery changed Request._context: check that it is still the task's Context "
        "(retries, headers) that jobs.task.PlumbRequest.on_timeout pushes, then update "
        "REVIEWED_CONTEXT"
    )


def test_celerys_request_on_timeout_is_the_version_reviewed():
    assert sha256_of_source(Request.on_timeout) == REVIEWED_ON_TIMEOUT, (
        "celery changed Request.on_timeout: check that jobs.task.PlumbRequest still needs "
        "(and still works by) pushing the request's context around it, then update "
        "REVIEWED_ON_TIMEOUT"
    )
    assert list(inspect.signature(PlumbRequest.on_timeout).parameters) == list(
        inspect.signature(Request.on_timeout).parameters
    )


def test_every_plumb_task_runs_with_plumbs_request():
    for name in ("audits.run_audit", "webhooks.deliver", "reaudit.place"):
        assert app.tasks[name].Request is PlumbRequest, name


# --- Celery: jobs.consumer.DeadLetteringConsumer ---------------------------------------

# celery 5.7.0's Consumer.create_task_handler (public in name, not documented as a
# hook), reviewed: it returns the `on_task_received(message)` the event loop calls for
# every message, which DeadLetteringConsumer wraps to check the message first.
REVIEWED_CREATE_TASK_HANDLER = "292c5a681f10ade7181d68b4fc129daa67ca551461a246300d60f9a7ec2310de"


def test_celerys_task_handler_is_the_version_reviewed_and_the_loops_call_it():
    assert sha256_of_source(Consumer.create_task_handler) == REVIEWED_CREATE_TASK_HANDLER, (
        "celery changed Consumer.create_task_handler: check that jobs.consumer's wrapper "
        "still sees every message before Celery dispatches it, then update "
        "REVIEWED_CREATE_TASK_HANDLER"
    )
    # Both event loops take their message callback from it.
    for loop in (loops.asynloop, loops.synloop):
        assert "obj.create_task_handler()" in inspect.getsource(loop), loop.__name__
    assert settings.CELERY_WORKER_CONSUMER == "jobs.consumer:DeadLetteringConsumer"
    assert DeadLetteringConsumer.create_task_handler is not Consumer.create_task_handler


# --- kombu: config.celery_app.queue_list_keys (the backlog's Lua reads these keys) ------


def test_the_queue_keys_read_are_the_lists_kombu_writes():
    # kombu's private Channel._q_for_pri names the list of each priority step; the
    # backlog and /metrics read those lists by name.
    channel = object.__new__(Channel)
    options = settings.CELERY_BROKER_TRANSPORT_OPTIONS
    channel.priority_steps = options.get("priority_steps", PRIORITY_STEPS)
    prefix = options.get("global_keyprefix", "")
    steps = sorted(set(channel.priority_steps))
    assert queue_list_keys("audits") == [
        prefix + channel._q_for_pri("audits", step) for step in steps
    ], "kombu names its priority lists otherwise now: update config.celery_app.queue_list_keys"


# --- redis-py: config.redis.FailoverAwareConnection (DECISIONS.md, Sentinel) -----------


def test_redis_py_reconnects_through_the_private_connect_it_overrides():
    # FailoverAwareConnection asks the sentinels for the master in `_connect`, because a
    # retry inside a command reconnects through connect_check_health -> _connect, not
    # through SentinelManagedConnection.connect.
    assert "_connect" in vars(FailoverAwareConnection)
    assert inspect.signature(SentinelManagedConnection._connect).parameters.keys() == {"self"}
    source = inspect.getsource(AbstractConnection.connect_check_health)
    assert "self._connect" in source, (
        "redis-py no longer reconnects through _connect: check where a retry reconnects, "
        "and move FailoverAwareConnection's master lookup there"
    )
    ours = inspect.signature(FailoverAwareConnection.connect_check_health).parameters
    theirs = inspect.signature(AbstractConnection.connect_check_health).parameters
    assert list(ours) == list(theirs)


# --- html5lib: audits.analysis.decode_page's <meta> prescan -----------------------------


def test_html5libs_private_prescan_reads_a_meta_charset():
    # html5lib._inputstream is an underscored module (DECISIONS.md, page encodings).
    found = EncodingParser(b"<html><head><meta charset='shift_jis'><title>").getEncoding()
    assert found == webencodings.lookup("shift_jis")
    assert EncodingParser(b"<html><head><title>none</title>").getEncoding() is None


# --- drf-spectacular: audits.api.schema.PlumbAutoSchema ---------------------------------


def test_drf_spectaculars_private_serializer_mapping_is_still_what_it_overrides():
    # PlumbAutoSchema adds additionalProperties and dependentRequired to request bodies
    # in AutoSchema._map_basic_serializer (tests/test_schema.py checks the result).
    assert "_map_basic_serializer" in vars(PlumbAutoSchema)
    assert list(inspect.signature(AutoSchema._map_basic_serializer).parameters) == [
        "self", "serializer", "direction",
    ]  # fmt: skip
