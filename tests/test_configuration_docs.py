"""Every environment variable the code reads has a row in docs/configuration.md."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE_DIRS = [
    "config",
    "jobs",
    "outbound",
    "audits",
    "reaudit",
    "ratelimit",
    "observability",
    "webhooks",
    "bin",
    "bench",
]
READS = [
    re.compile(r'env_(?:str|bool|int|float|list|named_secrets)\(\s*"([A-Z][A-Z0-9_]+)"'),
    re.compile(r'(?:environ|env)\.(?:get|setdefault)\(\s*"([A-Z][A-Z0-9_]+)"'),
    re.compile(r'environ\[\s*"([A-Z][A-Z0-9_]+)"\s*\]'),
]
# Variables of other programs that Plumb passes through but does not define.
# PROMETHEUS_MULTIPROC_DIR: set only by bench/metrics_overhead.py, to measure the mode
# Plumb does not use (DECISIONS.md, "Observability").
NOT_PLUMB_SETTINGS = {
    "DJANGO_SETTINGS_MODULE",
    "CI",
    "PYTHONUNBUFFERED",
    "PROMETHEUS_MULTIPROC_DIR",
}


def settings_read_by_the_code() -> set[str]:
    names: set[str] = set()
    for directory in SOURCE_DIRS:
        for path in (ROOT / directory).rglob("*"):
            if path.is_file() and (path.suffix == ".py" or path.parent.name == "bin"):
                text = path.read_text(errors="ignore")
                for pattern in READS:
                    names.update(pattern.findall(text))
    return names - NOT_PLUMB_SETTINGS


def setting_rows() -> list[str]:
    text = (ROOT / "docs" / "configuration.md").read_text()
    return re.findall(r"^\| `([A-Z][A-Z0-9_]+)` \|", text, flags=re.MULTILINE)


def documented_settings() -> set[str]:
    return set(setting_rows())


def test_every_setting_read_by_the_code_has_a_row():
    missing = settings_read_by_the_code() - documented_settings()
    assert not missing, f"add rows to docs/configuration.md for: {sorted(missing)}"


def test_each_setting_has_one_row():
    # Two rows drift apart: one gets the new default or caveat and the other still reads true.
    rows = setting_rows()
    twice = sorted({name for name in rows if rows.count(name) > 1})
    assert not twice, f"docs/configuration.md has more than one row for: {twice}"


def test_every_documented_setting_is_read_by_the_code():
    stale = documented_settings() - settings_read_by_the_code()
    assert not stale, f"docs/configuration.md documents settings nothing reads: {sorted(stale)}"


def test_the_scan_finds_settings():
    # Guards the test itself: a broken pattern would find nothing and pass.
    assert {
        "DATABASE_URL",
        "REDIS_URL",
        "AUDIT_MAX_ATTEMPTS",
        "TEST_REDIS_URL",
    } <= settings_read_by_the_code()
