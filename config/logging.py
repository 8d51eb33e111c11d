"""Key/value log lines: `log.info("audit.retry", extra={"audit_id": ..., "delay": ...})`.

The message is an event name; the fields travel in `extra`. Text output reads
`2026-12-02T10:00:00Z INFO audits.tasks audit.retry audit_id=... delay=2.5`,
and LOG_FORMAT=json emits one JSON object per line with the same fields.

Messages, fields and exception messages often carry what a downstream sent (a
receiver's response body, a page's title, a URL). A line break or a terminal control
character in them would let that downstream write lines that look like Plumb's own,
so the text output escapes every control character in them; a traceback keeps its
own line breaks, and only its exceptions' messages are escaped. JSON escapes them
by itself.
"""

from __future__ import annotations

import json
import logging
import traceback
from datetime import UTC, datetime

# Attributes every LogRecord has; anything else on a record came from `extra`.
_STANDARD_ATTRS = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}
_STANDARD_ATTRS |= {"taskName"}

# C0 and C1 controls, DEL, and the Unicode line and paragraph separators.
_CONTROL = [*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029]
_ESCAPES = {code: f"\\u{code:04x}" for code in _CONTROL} | {
    ord("\n"): "\\n",
    ord("\r"): "\\r",
    ord("\t"): "\\t",
}


def escape_controls(text: str) -> str:
    """`text` on one line: every control character written as its escape."""
    return text.translate(_ESCAPES)


def _fields(record: logging.LogRecord) -> dict:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD_ATTRS}


def _text_value(value) -> str:
    text = str(value)
    # Every whitespace character but the space is unprintable, so this is "holds a space
    # or any unprintable character", in C rather than a character at a time.
    if not text or " " in text or not text.isprintable() or "=" in text or '"' in text:
        # JSON's string escapes cover every control character.
        return json.dumps(text)
    return text


def _exception_message(exc: BaseException) -> str:
    name = type(exc).__qualname__
    module = type(exc).__module__
    if module not in {"builtins", "__main__"}:
        name = f"{module}.{name}"
    try:
        text = str(exc)
    except Exception:
        text = "<exception str() failed>"
    return f"{name}: {escape_controls(text)}" if text else name


def format_exception(exc: BaseException, _seen: set[int] | None = None) -> str:
    """The traceback as Python prints it (with its chain), each exception's message escaped."""
    seen = _seen if _seen is not None else set()
    seen.add(id(exc))
    parts = []
    cause, context = exc.__cause__, exc.__context__
    if cause is not None and id(cause) not in seen:
        parts += [
            format_exception(cause, seen),
            "\nThe above exception was the direct cause of the following exception:\n\n",
        ]
    elif context is not None and not exc.__suppress_context__ and id(context) not in seen:
        parts += [
            format_exception(context, seen),
            "\nDuring handling of the above exception, another exception occurred:\n\n",
        ]
    if exc.__traceback__ is not None:
        parts += ["Traceback (most recent call last):\n", *traceback.format_tb(exc.__traceback__)]
    parts.append(_exception_message(exc) + "\n")
    return "".join(parts)


class StructuredFormatter(logging.Formatter):
    def __init__(self, as_json: bool = False):
        super().__init__()
        self.as_json = as_json

    def formatException(self, ei) -> str:  # noqa: N802 (logging's name)
        exc = ei[1]
        if exc is None:
            return super().formatException(ei)
        return format_exception(exc).rstrip("\n")

    def format(self, record: logging.LogRecord) -> str:
        timestamp = datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")
        fields = _fields(record)
        message = record.getMessage()
        if self.as_json:
            payload = {
                "ts": timestamp,
                "level": record.levelname,
                "logger": record.name,
                "event": message,
                **fields,
            }
            if record.exc_info:
                payload["exc"] = self.formatException(record.exc_info)
            return json.dumps(payload, default=str)
        line = f"{timestamp} {record.levelname} {record.name} {escape_controls(message)}"
        if fields:
            line += " " + " ".join(f"{k}={_text_value(v)}" for k, v in fields.items())
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line
