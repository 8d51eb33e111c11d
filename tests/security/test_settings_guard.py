"""Settings refuse to start a production process with the development secret key."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.workers import ROOT


def run_check(**env) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in {"DEBUG", "SECRET_KEY"}}
    return subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=ROOT, env={**clean, **env},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_debug_off_with_the_dev_secret_key_refuses_to_start():
    result = run_check(DEBUG="false")
    assert result.returncode != 0
    assert "SECRET_KEY is the generated development key" in result.stderr


def test_debug_off_with_a_real_secret_key_starts():
    result = run_check(DEBUG="false", SECRET_KEY="x" * 50)
    assert result.returncode == 0, result.stderr


def test_a_malformed_setting_names_the_variable():
    result = run_check(DEBUG="true", AUDIT_MAX_ATTEMPTS="lots")
    assert result.returncode != 0
    assert "AUDIT_MAX_ATTEMPTS must be an integer" in result.stderr
