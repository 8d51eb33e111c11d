"""kombu's Redis transport: a queue entry that is not a message is dead-lettered, and
every command of a channel goes through one Redis client.

A worker pops a queue entry (BRPOP) and reads kombu's JSON envelope from it
before Celery sees anything. In stock kombu 5.7 an entry that is not an envelope
raises out of the event loop and the worker stops ("Unrecoverable error:
JSONDecodeError"), with the entry already gone from Redis: one stray LPUSH takes
a worker down and leaves no trace.

Two hooks, neither a copy of kombu's code:

- `Channel.Message`, kombu's public per-channel message class, is a subclass
  whose constructor raises `UnreadableEnvelope` (with the decoded payload) when
  the payload is JSON but not an envelope (no properties, a body its
  body_encoding cannot decode). kombu builds the message before it hands it to a
  consumer or rejects it, so such an entry never reaches Celery.
- `Channel._brpop_read`, private, is where kombu decodes the popped entry and
  delivers it. The override calls kombu's own method and catches only the two
  failures of reading the entry: `json.JSONDecodeError` from kombu's decode
  (whose `doc` is the whole entry as text) and `UnreadableEnvelope`. kombu's
  `finally` has already run (the poll state is reset), so the entry is
  dead-lettered and the worker goes on. Exceptions from a consumer's callback,
  connection errors and `Empty` pass through unchanged.

kombu 5.7 builds a new `redis.Redis` for each command a channel sends outside its
event loop (`conn_or_acquire`: every publish, every acknowledgement, every event),
and building one costs more than the command (bench/profile_breakdown.py: 9 % of an
audit worker's CPU). `Channel.conn_or_acquire`, public, hands out one client per
channel instead; a redis-py client is safe to share between threads, and a new one
is made when kombu replaces the channel's pool after a disconnect.

`SentinelTransport` is kombu's Sentinel transport (REDIS_SENTINELS) with the same
hooks: its channel is this module's `Channel` with kombu's `SentinelChannel` behind it,
and its connections are `config.redis.FailoverAwareConnection`, so a BRPOP on a master
that is demoted (UNBLOCKED) or a write it refuses (READONLY, NOREPLICAS) is a lost
connection, which Celery reconnects, rather than a channel error, which stops the worker.

Not covered, as in stock kombu: JSON that carries kombu's own type markers
(`{"__type__": ..., "__value__": ...}`) whose value fails to decode.

`tests/test_transport.py` pins the private hook: it fails when a kombu upgrade
changes `kombu.transport.redis.Channel._brpop_read`, which must then be reviewed.
"""

from __future__ import annotations

import json
import logging
from contextlib import contextmanager

from kombu.transport import redis, virtual
from kombu.utils.json import dumps
from redis.exceptions import ConnectionError

from config.redis import FailoverAwareConnection
from jobs.deadletters import record_rejected_message

log = logging.getLogger(__name__)

# What a dead letter (and, if it cannot be written, the log) keeps of an entry.
RAW_ENTRY_LIMIT = 64 * 1024


class UnreadableEnvelope(Exception):
    """A popped entry decoded as JSON, but kombu cannot read it as a message envelope."""

    def __init__(self, payload, problem: Exception):
        super().__init__(f"{problem.__class__.__name__}: {problem}")
        self.payload = payload
        self.problem = problem


class Message(virtual.Message):
    def __init__(self, payload, channel=None, **kwargs):
        try:
            super().__init__(payload, channel=channel, **kwargs)
        except Exception as exc:  # noqa: BLE001 - building a message is pure: anything is the payload's fault
            raise UnreadableEnvelope(payload, exc) from exc


class Channel(redis.Channel):
    Message = Message
    _shared_client = None

    @contextmanager
    def conn_or_acquire(self, client=None):
        if client:
            yield client
            return
        if self.connection is None or self.connection.client is None:
            # The broker connection is already torn down (Celery closes it after losing
            # Redis, and kombu then restores the unacked messages through here). There is
            # nothing to build a client from: kombu's own path raised AttributeError on
            # `_connparams` and Celery stopped the worker ("Unrecoverable error"). A
            # connection error is what Celery's close ignores and recovers from; the
            # messages stay in the unacked hash, where `restore_visible` finds them after
            # the visibility timeout, and a Redis that came back empty is the
            # reconciler's (PostgreSQL holds what is owed).
            raise ConnectionError("the broker connection of this channel is closed")
        shared = self._shared_client
        if shared is None or shared.connection_pool is not self.pool:
            shared = self._shared_client = self._create_client()
        yield shared

    def _brpop_read(self, **options):
        try:
            return super()._brpop_read(**options)
        except json.JSONDecodeError as exc:
            self._dead_letter_entry(exc.doc, exc)
        except UnreadableEnvelope as exc:
            self._dead_letter_entry(dumps(exc.payload), exc.problem)
        return True  # kombu's answer when it has read an entry

    def _dead_letter_entry(self, raw: str, problem: Exception) -> None:
        # kombu does not say which queue the entry came from; each Plumb worker
        # consumes one queue (-Q), so this names it exactly there.
        queue = ",".join(self.active_queues)
        raw = raw[:RAW_ENTRY_LIMIT].replace("\x00", "\\x00")  # PostgreSQL text cannot hold NUL
        try:
            record_rejected_message(
                task_name="", task_id="", queue=queue, args=None, kwargs=None,
                raw_message=f"queue entry: {raw}",
                problem=f"not a message envelope: {problem.__class__.__name__}: {problem}",
            )  # fmt: skip
        except Exception:
            # The entry is already off the queue: log it rather than stop the worker.
            log.exception("task.dead_letter_failed", extra={"queue": queue, "raw": raw})


class Transport(redis.Transport):
    Channel = Channel


class SentinelChannel(Channel, redis.SentinelChannel):
    connection_class = FailoverAwareConnection


class SentinelTransport(redis.SentinelTransport):
    Channel = SentinelChannel
