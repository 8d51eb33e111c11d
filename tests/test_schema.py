"""The schema tells the truth: schemathesis runs every check, stateful links included,
against /api/schema on the live app, and finds nothing."""

from __future__ import annotations

import base64
import os
import re
import subprocess
import sys

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from audits.api.serializers import WEBHOOK_SECRET_SCHEMA
from audits.models import Audit, Page
from outbound.integrations.webhook import validate_secret
from tests.webhook_helpers import SECRET
from tests.workers import ROOT

TOKEN = "schema-test-token"
TOKEN_USER = "schema"


@pytest.fixture
def open_admission(settings):
    """Submissions are admitted throughout: 429 and 503 stay documented, not what every
    case meets."""
    settings.AUDIT_SUBMIT_BURST = 1_000_000
    settings.AUDIT_SUBMIT_RATE_PER_MINUTE = 1_000_000
    settings.AUDIT_QUEUE_MAX_DEPTH = 1_000_000


@pytest.fixture
def audited_page(django_user_model):
    """A page of the token's user with a callback and a succeeded audit that found changes,
    so reading it checks a full response against the schema."""
    page = Page.objects.create(
        owner=django_user_model.objects.create_user(TOKEN_USER),
        url="https://example.org/",
        domain="example.org",
        callback_url="https://hooks.example.org/plumb",
        callback_secret=SECRET,
        last_changed_at=timezone.now(),
    )
    Audit.objects.create(
        page=page,
        status=Audit.Status.SUCCEEDED,
        finished_at=timezone.now(),
        result={"status_code": 200, "title": "Home", "missing_security_headers": []},
        changes=[
            {"field": "title", "before": "Old", "after": "Home"},
            {
                "field": "broken_links",
                "before": ["https://a.example/"],
                "after": [],
                "added": [],
                "removed": ["https://a.example/"],
            },
        ],  # fmt: skip
    )
    return page


def schemathesis(live_server, workdir, *options: str) -> subprocess.CompletedProcess:
    """`schemathesis run` as a user would, with the repository's schemathesis.toml (run
    from `workdir`, where it keeps its replay data)."""
    command = [
        sys.executable, "-m", "schemathesis.cli", "--config-file", str(ROOT / "schemathesis.toml"),
        "run", f"{live_server.url}/api/schema", "--checks", "all", "--workers", "1",
        "--seed", "15", "--generation-database", "none", "--no-color", *options,
    ]  # fmt: skip
    return subprocess.run(
        command, cwd=workdir, capture_output=True, text=True, timeout=180, env=dict(os.environ)
    )


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("tokens", [{TOKEN_USER: TOKEN}, {}], ids=["with-a-token", "open"])
def test_schemathesis_finds_no_failure(
    tokens, live_server, settings, open_admission, audited_page, redis_client, tmp_path
):
    # With API_TOKENS every operation needs the token; without, submissions and reads by
    # id are open and listings answer 401/403: both as the schema says.
    settings.API_TOKENS = tokens
    headers = ["-H", f"Authorization: Bearer {TOKEN}"] if tokens else []
    # Every phase: examples, coverage (each constraint's edges), fuzzing, stateful (links).
    run = schemathesis(live_server, tmp_path, "--max-examples", "10", *headers)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    # The stateful phase followed the links: submitted audits were read back.
    assert re.search(r"API Links:\s+[1-9]\d* covered", run.stdout), run.stdout[-3000:]
    assert Audit.objects.filter(trigger=Audit.Trigger.SUBMITTED).exists()


@pytest.mark.django_db
@pytest.mark.parametrize("tokens", [{}, {TOKEN_USER: TOKEN}])
def test_each_operation_documents_its_errors_and_its_real_security(settings, tokens):
    """Without API_TOKENS, submitting, reading an audit and the queue are open (`{}`), the
    rest needs a token or a staff login; with them, everything does."""
    settings.API_TOKENS = tokens
    schema = APIClient().get("/api/schema?format=json").json()
    assert schema["openapi"].startswith("3.1")
    open_operations = set()
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            responses = operation["responses"]
            assert {"401", "403"} <= set(responses), (method, path)
            assert responses["401"]["headers"]["WWW-Authenticate"]["required"] is True
            for status in ("429", "503"):
                if status in responses:
                    assert "Retry-After" in responses[status]["headers"], (method, path)
            if "requestBody" in operation:
                assert {"400", "413", "415"} <= set(responses), (method, path)
            if "{" in path:
                assert "404" in responses, (method, path)
            if {} in operation["security"]:
                open_operations.add(f"{method.upper()} {path}")
    if tokens:
        assert open_operations == set()
    else:
        assert open_operations == {
            "POST /api/audits", "GET /api/audits/{audit_id}", "GET /api/queue",
        }  # fmt: skip
    submission = schema["components"]["schemas"]["AuditSubmission"]
    assert submission["properties"]["url"]["minLength"] == 1
    assert submission["additionalProperties"] is False
    assert submission["dependentRequired"] == {
        "callback_url": ["callback_secret"],
        "callback_secret": ["callback_url"],
    }
    links = schema["paths"]["/api/audits"]["post"]["responses"]["202"]["links"]
    assert links["GetAuditById"]["operationId"] == "audits_retrieve"


def test_the_secret_pattern_in_the_schema_accepts_exactly_what_the_api_accepts():
    pattern = re.compile(WEBHOOK_SECRET_SCHEMA["pattern"])
    for size in range(80):
        secret = "whsec_" + base64.b64encode(os.urandom(size)).decode()
        try:
            accepted = validate_secret(secret) == secret
        except ValueError:
            accepted = False
        assert bool(pattern.match(secret)) is accepted, size


@pytest.mark.django_db
def test_a_host_longer_than_dns_allows_is_a_400_not_a_server_error(settings):
    # Found by schemathesis: it reached Page.domain (255 characters) and failed there.
    settings.AUDIT_SUBMIT_BURST = 100
    host = ".".join(["a" * 63] * 4)  # 255 characters
    response = APIClient().post("/api/audits", data={"url": f"https://{host}/"}, format="json")
    assert response.status_code == 400
    assert "longer than 253" in response.json()["fields"]["url"][0]
    assert not Page.objects.exists()
