"""Settings refuse to start a production process with a development or weak secret key,
and a production configuration passes `manage.py check --deploy`."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys

import pytest

from devstack.management.commands.runstack import flower_basic_auth, service_secret_key
from tests.workers import ROOT

STRONG_KEY = secrets.token_urlsafe(50)
# What a deployment behind TLS sets (docs/configuration.md); .ci/run checks the same.
PRODUCTION = {
    "DEBUG": "false", "SECRET_KEY": STRONG_KEY, "HSTS_SECONDS": "31536000",
    "HSTS_INCLUDE_SUBDOMAINS": "true", "HSTS_PRELOAD": "true", "SECURE_SSL_REDIRECT": "true",
}  # fmt: skip


def run_check(*options: str, **env) -> subprocess.CompletedProcess:
    clean = {
        k: v for k, v in os.environ.items()
        if k not in {"DEBUG", "SECRET_KEY", "SECURE_COOKIES"} and not k.startswith("HSTS_")
    }  # fmt: skip
    return subprocess.run(
        [sys.executable, "manage.py", "check", *options], cwd=ROOT, env={**clean, **env},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_debug_off_with_the_dev_secret_key_refuses_to_start():
    result = run_check(DEBUG="false")
    assert result.returncode != 0
    assert "SECRET_KEY is the generated development key" in result.stderr


def test_debug_off_with_a_real_secret_key_starts():
    result = run_check(DEBUG="false", SECRET_KEY=STRONG_KEY)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    "key",
    ["x", "x" * 50, "abcd" * 20, STRONG_KEY[:49]],
    # STRONG_KEY is random: ids by position keep xdist's workers collecting the same tests.
    ids=["one-character", "one-repeated-character", "few-distinct-characters", "too-short"],
)
def test_debug_off_with_a_weak_secret_key_refuses_to_start(key):
    result = run_check(DEBUG="false", SECRET_KEY=key)
    assert result.returncode != 0
    assert "SECRET_KEY is too weak" in result.stderr


def test_a_production_configuration_passes_the_deploy_checks():
    result = run_check("--deploy", "--fail-level", "WARNING", **PRODUCTION)
    assert result.returncode == 0, result.stderr


def test_with_debug_off_cookies_are_secure_by_default():
    # W012 and W016 of check --deploy, without any HTTPS setting.
    result = run_check("--deploy", DEBUG="false", SECRET_KEY=STRONG_KEY)
    assert "security.W012" not in result.stderr and "security.W016" not in result.stderr


def test_a_malformed_setting_names_the_variable():
    result = run_check(DEBUG="true", AUDIT_MAX_ATTEMPTS="lots")
    assert result.returncode != 0
    assert "AUDIT_MAX_ATTEMPTS must be an integer" in result.stderr


def test_the_sqlite_database_file_is_private(tmp_path):
    database = tmp_path / "plumb.sqlite3"
    database.touch(mode=0o644)
    database.chmod(0o644)  # as an older checkout left it: world-readable
    result = run_check(
        DEBUG="true", PLUMB_VAR_DIR=str(tmp_path), DATABASE_URL=f"sqlite:///{database}"
    )
    assert result.returncode == 0, result.stderr
    assert database.stat().st_mode & 0o777 == 0o600
    fresh = tmp_path / "fresh.sqlite3"
    run_check(DEBUG="true", PLUMB_VAR_DIR=str(tmp_path), DATABASE_URL=f"sqlite:///{fresh}")
    assert fresh.stat().st_mode & 0o777 == 0o600


def test_the_development_key_file_is_private(tmp_path):
    database = f"sqlite:///{tmp_path / 'plumb.sqlite3'}"
    result = run_check(DEBUG="true", PLUMB_VAR_DIR=str(tmp_path), DATABASE_URL=database)
    assert result.returncode == 0, result.stderr
    key = tmp_path / "dev-secret-key"
    assert key.stat().st_mode & 0o777 == 0o600
    key.chmod(0o644)  # as an older checkout left it: world-readable
    run_check(DEBUG="true", PLUMB_VAR_DIR=str(tmp_path), DATABASE_URL=database)
    assert key.stat().st_mode & 0o777 == 0o600


def test_the_stack_s_secret_files_are_created_private_and_narrowed_when_found_readable(tmp_path):
    previous = os.umask(0)  # the file's own mode must protect it, whatever the umask
    try:
        key = service_secret_key(tmp_path, "")
        login, _ = flower_basic_auth(tmp_path, "")
    finally:
        os.umask(previous)
    for name in ("secret-key", "flower-basic-auth"):
        kept = tmp_path / name
        assert kept.stat().st_mode & 0o777 == 0o600
        kept.chmod(0o644)
    # Read again, the same secrets, owner-only again.
    assert service_secret_key(tmp_path, "") == key
    assert flower_basic_auth(tmp_path, "") == (login, True)
    assert {
        (tmp_path / name).stat().st_mode & 0o777 for name in ("secret-key", "flower-basic-auth")
    } == {0o600}
    assert sorted(path.name for path in tmp_path.iterdir()) == ["flower-basic-auth", "secret-key"]
