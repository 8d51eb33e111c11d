"""A GitHub credential that sees private repositories tells no client more than a visitor
without credentials would learn: a private repository is reported as not found, whether
asked by REST, by GraphQL (when REST's bucket is spent) or through a rename."""

from __future__ import annotations

import dataclasses

import pytest

from outbound.integrations.github import GitHubClient, GitHubCredentials
from outbound.integrations.links import check_url

pytestmark = pytest.mark.django_db

REPOSITORIES = {
    "acme/secret": {"full_name": "acme/secret", "private": True, "archived": True},
    "acme/open": {"full_name": "acme/open", "archived": True},
}
RENAMED = {"acme/old-secret": "acme/secret", "acme/old-open": "acme/open"}


@pytest.fixture
def github(fake_github):
    fake_github.state.repositories.update(REPOSITORIES)
    fake_github.state.renamed.update(RENAMED)
    client = GitHubClient(GitHubCredentials.from_settings())
    yield client
    client.close()


def outcome(github: GitHubClient, name: str) -> dict:
    checked = dataclasses.asdict(check_url(f"https://github.com/acme/{name}", github=github))
    checked["github"]["repository"] = "acme/<name>"  # the name asked for, echoed back
    return checked


def test_a_private_repository_is_reported_as_one_that_does_not_exist(github, redis_client):
    missing = outcome(github, "never-was")
    assert missing["status"] == "broken" and missing["github"]["missing"] is True
    assert outcome(github, "secret") == missing
    assert outcome(github, "old-secret") == missing  # renamed, to a private repository
    # A public repository is reported as before: archived, and a rename followed.
    public = outcome(github, "open")
    assert public["status"] == "ok" and public["github"]["archived"] is True
    renamed = outcome(github, "old-open")
    assert renamed["status"] == "redirected"
    assert renamed["final_url"] == "https://github.com/acme/open"


def test_by_graphql_too(github, fake_github, redis_client):
    fake_github.exhaust(fake_github.installation, "core", reset_in=600)
    missing = outcome(github, "never-was")
    assert missing["github"] == {
        "repository": "acme/<name>", "missing": True, "archived": None, "via": "graphql",
    }  # fmt: skip
    assert outcome(github, "secret") == missing
    assert outcome(github, "old-secret") == missing
    assert outcome(github, "open")["github"]["archived"] is True
