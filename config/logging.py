"""Key/value log lines: `log.info("audit.retry", extra={"audit_id": ..., "delay": ...})`.

The message is an event name; the fields travel in `extra`. Text output reads
`2026-12-02T10:00:00Z INFO audits.tasks audit.retry audit_id=... delay=2.5`,
and LOG_FORMAT=json emits one JSON object per line with the same fields.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

# Attributes every LogRecord has; anything else on a record came from `extra`.
_STANDARD_ATTRS = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}


def _fields(record: logging.LogRecord) -> dict:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD_ATTRS}


def _text_value(value) -> str:
    text = str(value)
    if not text or any(c.isspace() for c in text) or "=" in text or '"' in text:
        return json.dumps(text)
    return text


class StructuredFormatter(logging.Formatter):
    def __init__(self, as_json: bool = False):
        super().__init__()
        self.as_json = as_json

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
        line = f"{timestamp} {record.levelname} {record.name} {message}"
        if fields:
            line += " " + " ".join(f"{k}={_text_value(v)}" for k, v in fields.items())
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line
