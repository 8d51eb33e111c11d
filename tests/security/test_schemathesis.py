"""Property-based tests of every endpoint in the OpenAPI schema: no 500s, JSON errors."""

from __future__ import annotations

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from config.wsgi import application

schema = schemathesis.openapi.from_wsgi("/api/schema", application)


def error_body_is_json(ctx, response, case):
    """Every 4xx answer is a JSON object naming the error."""
    if 400 <= response.status_code < 500:
        body = response.json()
        assert isinstance(body, dict) and "error" in body, (
            f"4xx without a JSON error body: {response.text!r}"
        )


@pytest.fixture
def keep_test_connection():
    """Do what Django's test client does: requests must not close the test's transaction."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.mark.django_db
@pytest.mark.usefixtures("keep_test_connection")
@schema.parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_endpoint_answers_500_or_a_non_json_error(case):
    case.call_and_validate(checks=[not_a_server_error, error_body_is_json])
