"""Every `extra` key in the code is one logging accepts.

logging raises `KeyError: "Attempt to overwrite 'thread' in LogRecord"` for an `extra` key
that names a LogRecord attribute, at the moment of logging. In an error handler that
exception escapes the handler: the delayed-store waker logged its failed ticks with
`extra={"thread": ...}` and died at the first Redis hiccup.
"""

from __future__ import annotations

import ast
import logging
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ["audits", "config", "devstack", "jobs", "observability", "outbound", "ratelimit",
            "reaudit", "webhooks"]  # fmt: skip
# What makeRecord refuses: the record's own attributes, plus "message" and "asctime".
RESERVED = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


def _extra_keys(source: str):
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        for keyword in node.keywords:
            if keyword.arg == "extra" and isinstance(keyword.value, ast.Dict):
                for key in keyword.value.keys:
                    if isinstance(key, ast.Constant) and isinstance(key.value, str):
                        yield node.lineno, key.value


def test_no_extra_key_overwrites_a_log_record_attribute():
    clashes = [
        f"{path.relative_to(ROOT)}:{line}: {key!r}"
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        for line, key in _extra_keys(path.read_text())
        if key in RESERVED
    ]
    assert clashes == []


def test_the_scan_finds_a_clash():
    # The scan itself must be able to fail: a call like the waker's old one is found.
    source = 'log.exception("worker_thread.failed", extra={"thread": name})\n'
    assert [key for _, key in _extra_keys(source)] == ["thread"]
    assert "thread" in RESERVED
