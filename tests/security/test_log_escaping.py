"""What a downstream sends cannot write lines of its own into Plumb's log."""

from __future__ import annotations

import io
import json
import logging

import pytest

from config.logging import StructuredFormatter
from jobs.errors import Permanent
from outbound.integrations import webhook

pytestmark = pytest.mark.django_db

FORGED = "2026-12-04T10:00:00.000+00:00 INFO webhooks.tasks webhook.delivered delivery_id=forged"


@pytest.fixture
def refusing_receiver(http_server):
    """A receiver that refuses every delivery with a body that imitates a log line."""

    def refuse(request):
        request.body()
        return 400, {}, f"no thanks\n{FORGED}\r\n\x1b[2Kcleared".encode()

    return f"{http_server(respond=refuse).url}/hook"


def log_output(as_json: bool, emit) -> str:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(StructuredFormatter(as_json=as_json))
    logger = logging.getLogger("tests.log_escaping")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        emit(logger)
    finally:
        logger.removeHandler(handler)
    return stream.getvalue()


@pytest.mark.parametrize("as_json", [False, True])
def test_a_receivers_body_in_a_traceback_cannot_forge_a_log_line(refusing_receiver, as_json):
    def emit(logger):
        try:
            webhook.post(refusing_receiver, body="{}", headers={})
        except Permanent as exc:
            # As Celery logs a task's failure: the message and the traceback.
            logger.error("Task failed: %s", exc, exc_info=True, extra={"error": str(exc)})

    output = log_output(as_json, emit)
    lines = output.splitlines()
    assert not [line for line in lines if line.startswith(FORGED)], output
    assert "\x1b" not in output
    # What the receiver said is still there to read, escaped.
    assert "no thanks\\n2026-12-04" in output


def test_a_traceback_keeps_its_chain_and_its_own_line_breaks():
    def emit(logger):
        try:
            try:
                raise ValueError("inner\nline")
            except ValueError as inner:
                raise Permanent("outer\nline") from inner
        except Permanent:
            logger.exception("failed")

    output = log_output(False, emit)
    assert "ValueError: inner\\nline" in output
    assert "The above exception was the direct cause of the following exception:" in output
    assert "jobs.errors.Permanent: outer\\nline" in output
    assert output.count("Traceback (most recent call last):") == 2


@pytest.mark.parametrize(
    "value",
    [
        "two words",
        "tab\there",
        "no\xa0break",
        "line\u2028separator",
        "bell\x07",
        "a=b",
        'say "x"',
        "",
    ],
)
def test_a_field_that_could_be_read_as_two_is_quoted(value):
    line = log_output(False, lambda log: log.info("event", extra={"field": value}))
    assert line.rstrip("\n").endswith(f" field={json.dumps(value)}")


def test_a_plain_field_is_written_as_it_is():
    line = log_output(False, lambda log: log.info("event", extra={"audit_id": "3f2a9c1e-7b1d"}))
    assert line.rstrip("\n").endswith(" audit_id=3f2a9c1e-7b1d")
