"""A committing test leaves the next one empty tables, its content types and permissions kept
(tests/database.py), and the Django hook replaced for it is the version reviewed."""

from __future__ import annotations

import hashlib
import inspect

import pytest
from django.contrib.contenttypes.models import ContentType
from django.test import TransactionTestCase

from audits.models import Page
from tests import database

# sha256 of `inspect.getsource(django.test.TransactionTestCase._fixture_teardown)` in Django
# 5.2, reviewed for tests/database.py: for each database, a flush (TRUNCATE of the apps'
# tables, then post_migrate unless available_apps or a serialized rollback), and nothing else.
REVIEWED_FIXTURE_TEARDOWN = "c274615fd69186e1b9616e9d0cc0144f5643ae4a820ea62194d7a333e3fe3da1"


def test_the_django_hook_replaced_is_the_version_reviewed():
    source = inspect.getsource(database.DJANGO_FIXTURE_TEARDOWN)
    assert hashlib.sha256(source.encode()).hexdigest() == REVIEWED_FIXTURE_TEARDOWN, (
        "Django changed TransactionTestCase._fixture_teardown: check that tests/database.py "
        "still does everything it does for this suite, then update REVIEWED_FIXTURE_TEARDOWN"
    )


@pytest.mark.django_db(transaction=True)
def test_a_committing_tests_teardown_empties_the_tables_and_keeps_the_content_types():
    Page.objects.create(url="https://example.org/")
    page_type = ContentType.objects.get_for_model(Page)
    # What pytest-django runs when a transactional test ends (its _post_teardown).
    TransactionTestCase(methodName="__init__")._fixture_teardown()
    assert not Page.objects.exists()
    assert ContentType.objects.get_for_model(Page).id == page_type.id
    assert ContentType.objects.filter(id=page_type.id).exists()
