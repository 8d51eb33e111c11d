"""`make run` encrypts callback secrets with the key its processes read them with, and a
secret no key decrypts costs its row the secret, never the list the row is in."""

from __future__ import annotations

import base64
import logging
import os
import subprocess
import sys

import pytest
from cryptography.fernet import Fernet
from django.db import connection
from rest_framework.test import APIClient

from audits.models import Audit, Page
from devstack.management.commands.runstack import prepare, stack_environment
from tests.workers import ROOT

PAGE_SECRET = "whsec_" + base64.b64encode(b"plumb-page-secret-0123456789abcd").decode()

# A page stored with its secret in clear, as every checkout before audits 0009 stored it.
SEED_BEFORE_0009 = f"""
from django.db import connection
from django.db.migrations.loader import MigrationLoader
state = MigrationLoader(connection).project_state(("audits", "0008_page_reaudit_nightly_by_choice"))
state.apps.get_model("audits", "Page").objects.create(
    url="https://example.org/", domain="example.org",
    callback_url="https://owner.example/hook", callback_secret={PAGE_SECRET!r},
)
"""
READ_THE_SECRET = """
from audits.models import Page
print("secret=" + Page.objects.get().callback_secret)
"""


def manage(*arguments: str, env: dict[str, str]) -> str:
    result = subprocess.run(
        [sys.executable, "manage.py", *arguments], cwd=ROOT, env=env,
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.slow
def test_make_run_upgrades_stored_secrets_with_the_key_its_processes_use(tmp_path):
    # `make run`: manage.py with DEBUG on and the development key kept in var/.
    make_run = {
        **{k: v for k, v in os.environ.items() if k not in {"SECRET_KEY", "CALLBACK_SECRET_KEYS"}},
        "DEBUG": "true", "PLUMB_VAR_DIR": str(tmp_path),
        "DATABASE_URL": f"sqlite:///{tmp_path / 'plumb.sqlite3'}",
    }  # fmt: skip
    manage("migrate", "audits", "0008", "--verbosity", "0", env=make_run)
    manage("shell", "-c", SEED_BEFORE_0009, env=make_run)

    stack = stack_environment(make_run, tmp_path, demo=False)
    prepare(stack)  # audits 0009 encrypts the stored secret

    # The web and the workers read it: the migration wrote it with the development key,
    # and every list holding the page failed with InvalidToken.
    assert f"secret={PAGE_SECRET}" in manage("shell", "-c", READ_THE_SECRET, env=stack)


@pytest.mark.django_db
def test_a_secret_no_key_decrypts_costs_its_row_the_secret_not_the_list(django_user_model, caplog):
    audits = [
        Audit.objects.create(
            page=Page.objects.create(url=f"https://example.org/{n}", domain="example.org"),
            task_id=f"t{n}",
            callback_url="https://hooks.example/",
            callback_secret=PAGE_SECRET,
        )  # fmt: skip
        for n in range(3)
    ]
    # One row encrypted with a key this process does not have (another SECRET_KEY).
    foreign = Fernet(Fernet.generate_key()).encrypt(PAGE_SECRET.encode()).decode()
    # The id as its column stores it: a uuid on PostgreSQL, 32 hex digits on SQLite.
    foreign_id = Audit._meta.pk.get_db_prep_value(audits[1].id, connection)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE audits_audit SET callback_secret = %s WHERE id = %s", [foreign, foreign_id]
        )
    staff = APIClient()
    staff.force_login(django_user_model.objects.create_user("ops", password="x", is_staff=True))

    with caplog.at_level(logging.ERROR, logger="audits.secrets"):
        listing = staff.get("/api/audits")

    assert listing.status_code == 200
    assert {entry["id"] for entry in listing.json()["results"]} == {str(a.id) for a in audits}
    assert "callback_secret.unreadable" in caplog.messages
    unreadable = Audit.objects.get(id=audits[1].id)
    assert unreadable.callback_secret == ""
    assert Audit.objects.get(id=audits[0].id).callback_secret == PAGE_SECRET
    # Saved again, the row keeps its token: the right key, configured later, still reads it.
    unreadable.save()
    with connection.cursor() as cursor:
        cursor.execute("SELECT callback_secret FROM audits_audit WHERE id = %s", [foreign_id])
        assert cursor.fetchone()[0] == foreign
