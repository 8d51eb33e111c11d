"""Every admin list answers, under each of its filters' choices and a search, on the database
the suite runs on: an operator's filter that the database cannot run is a 500 (the failing-check
filter was one on SQLite, `make run`'s database)."""

from __future__ import annotations

import pytest
from django.apps import apps
from django.contrib import admin
from django.test import RequestFactory
from django.urls import reverse

from audits import submission
from outbound.urls import normalize_url

pytestmark = [pytest.mark.django_db, pytest.mark.both_databases]

REGISTERED = [
    (model, admin.site.get_model_admin(model))
    for model in sorted(apps.get_models(), key=lambda model: model._meta.label)
    if admin.site.is_registered(model)
]


def filter_queries(model_admin, admin_user) -> list[str]:
    """The query string of every choice of every list filter, as the list page links them."""
    request = RequestFactory().get("/")
    request.user = admin_user
    changelist = model_admin.get_changelist_instance(request)
    filters, *_ = changelist.get_filters(request)
    return [choice["query_string"] for spec in filters for choice in spec.choices(changelist)]


@pytest.mark.parametrize(
    "model_admin", [model_admin for _, model_admin in REGISTERED],
    ids=[model._meta.label for model, _ in REGISTERED],
)  # fmt: skip
def test_each_filter_choice_and_a_search_answer(model_admin, admin_client, admin_user):
    submission.submit_audit(normalize_url("https://example.org/"))
    meta = model_admin.model._meta
    url = reverse(f"admin:{meta.app_label}_{meta.model_name}_changelist")
    queries = filter_queries(model_admin, admin_user)
    if model_admin.search_fields:
        queries.append("?q=example")
    for query in ["", *queries]:
        response = admin_client.get(url + query)
        assert response.status_code == 200, (query, response.content[:500])
