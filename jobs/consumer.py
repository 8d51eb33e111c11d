"""The worker's consumer, dead-lettering messages it cannot run on their first delivery.

Celery drops such messages with a log line: a body it cannot decode is
acknowledged (`Consumer.on_decode_error`), an unknown task or a message of an
unknown format is rejected (`on_unknown_task`, `on_unknown_message`), and a
body of the wrong shape only fails later, in the pool process, where the task's
own failure handling never sees it. Checking each message before Celery
dispatches it turns all of these into dead letters with the message attached.
Arguments that decode but do not fit the task (missing, wrong type, an audit
that does not exist) are caught by the task itself (PlumbTask), also on the
first delivery.
"""

from __future__ import annotations

import logging

from celery.worker.consumer import Consumer
from vine import promise

from jobs import deadletters

log = logging.getLogger(__name__)


def malformed_reason(message, registered_tasks) -> str | None:
    """Why the worker cannot run this task message, or None if it can.

    Plumb publishes Celery's protocol 2: the task name and id in the headers,
    a body that decodes to (args, kwargs, embed). Decoding honours the
    consumer's accepted content types and is cached on the message, so
    Celery does not decode it a second time.
    """
    headers = message.headers if isinstance(message.headers, dict) else {}
    name = headers.get("task")
    if not name or not headers.get("id"):
        return "not a task message: no task name or id in its headers"
    if name not in registered_tasks:
        return f"unknown task {name!r}"
    try:
        payload = message.decode()
    except Exception as exc:  # noqa: BLE001 - any decoding failure makes it undecodable
        return f"undecodable body ({message.content_type}): {exc.__class__.__name__}: {exc}"
    if not (isinstance(payload, list | tuple) and len(payload) == 3):
        return "body is not (args, kwargs, embed)"
    args, kwargs, embed = payload
    if not isinstance(args, list | tuple) or not isinstance(kwargs, dict):
        return "args is not a list or kwargs is not a mapping"
    if embed is not None and not isinstance(embed, dict):
        return "embed is not a mapping"
    return None


def _raw(message) -> str:
    body = message.body
    if isinstance(body, bytes):
        try:
            body = body.decode("utf-8")
        except UnicodeDecodeError:
            body = repr(body)  # binary (a pickle, say): escaped, so it can be stored and read
    # PostgreSQL text cannot hold NUL.
    body = body.replace("\x00", "\\x00")
    return (
        f"headers: {message.headers!r}\n"
        f"content_type: {message.content_type!r} content_encoding: {message.content_encoding!r}\n"
        f"body: {body}"
    )


class DeadLetteringConsumer(Consumer):
    def create_task_handler(self, promise=promise):
        dispatch = super().create_task_handler(promise)

        def on_task_received(message):
            problem = malformed_reason(message, self.app.tasks)
            if problem is None:
                return dispatch(message)
            self._dead_letter(message, problem)
            return None

        return on_task_received

    def _dead_letter(self, message, problem: str) -> None:
        headers = message.headers if isinstance(message.headers, dict) else {}
        args = kwargs = None
        try:
            payload = message.decode()
            if isinstance(payload, list | tuple) and len(payload) >= 2:
                args, kwargs = payload[0], payload[1]
        except Exception:  # noqa: BLE001, S110 - the raw message is kept instead
            pass
        try:
            deadletters.record_rejected_message(
                task_name=str(headers.get("task") or ""),
                task_id=str(headers.get("id") or ""),
                queue=(message.delivery_info or {}).get("routing_key", ""),
                args=args if isinstance(args, list | tuple) else None,
                kwargs=kwargs if isinstance(kwargs, dict) else None,
                raw_message=_raw(message),
                problem=problem,
            )
        except Exception:
            # Never leave it unacknowledged: with prefetch 1 it would stall the worker.
            log.exception(
                "task.dead_letter_failed", extra={"problem": problem, "raw": _raw(message)}
            )
        message.ack()
