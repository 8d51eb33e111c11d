"""GitHub as a downstream: App JWT, installation tokens, and repository checks.

Three kinds of credentials spend three kinds of bucket, and each call is
admitted and observed under the bucket it spends:

- the App JWT (minting installation tokens): `github-app:<appId>`;
- an installation token: `github-installation:<id>`;
- a personal token (GITHUB_TOKEN): `github-token:<hash>`.

An App-JWT response therefore never clears an installation's exhaustion
backoff. Installation tokens are cached by installation id (not by the raw
token) and minted single-flight across workers under a Redis lock; a refresh
forced by a 401 names the token that was refused and joins a mint already in
flight instead of starting another.

Calls go through the one client factory (so the SSRF guard holds for GITHUB_API_URL
too) and the one sender, one call at a time per credential. Failures raise
`jobs.errors`: Transient for a 5xx, 408, 425 or a broken body, Permanent for any
other 4xx (a plain 403, a refused App JWT), RateLimited when the buckets must wait.

A private repository is reported as GitHub shows it to a visitor without credentials:
not found. The credential may see private repositories (a token with the `repo` scope,
an App installed on them), and a link's outcome is shared by every client that lists
it (audits.linkcheck): whoever submits a page must learn nothing a request to the same
URL would not tell them, not a private repository's existence, nor whether it is archived.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import quote

import httpx2
import jwt
from django.conf import settings

from config.redis import redis_client
from jobs.errors import Permanent, RateLimited, Transient
from outbound.client import OutboundClient, build_client
from outbound.guard import TargetNotAllowed
from outbound.hostslots import SlotLimit, call_lease
from outbound.statuses import classify_status, unwanted_answer
from ratelimit.observations import (
    github_app_key,
    github_installation_key,
    github_token_key,
)

log = logging.getLogger(__name__)

API_VERSION = "2022-11-28"
# A cached token this close to expiry is replaced rather than used.
TOKEN_REFRESH_MARGIN_SECONDS = 300
MINT_LOCK_TIMEOUT_SECONDS = 30
# A repository's JSON is a few kilobytes; a longer answer is cut here and fails to parse.
GITHUB_MAX_BODY_BYTES = 1024 * 1024
REST_RESOURCE = "core"
GRAPHQL_RESOURCE = "graphql"

REPOSITORY_QUERY = """
query($owner: String!, $name: String!) {
  repository(owner: $owner, name: $name) { nameWithOwner url isArchived isPrivate }
}
"""


@dataclass(frozen=True)
class GitHubCredentials:
    api_url: str
    app_id: str = ""
    private_key: str = ""
    installation_id: str = ""
    token: str = ""

    @classmethod
    def from_settings(cls) -> GitHubCredentials | None:
        """The configured credentials; None without any (GitHub links are plain links then)."""
        credentials = cls(
            api_url=settings.GITHUB_API_URL,
            app_id=settings.GITHUB_APP_ID,
            private_key=settings.GITHUB_APP_PRIVATE_KEY,
            installation_id=settings.GITHUB_INSTALLATION_ID,
            token=settings.GITHUB_TOKEN,
        )
        return credentials if credentials.uses_app or credentials.token else None

    @property
    def uses_app(self) -> bool:
        return bool(self.app_id and self.private_key and self.installation_id)

    @property
    def admission_key(self) -> str:
        """The bucket every call made with these credentials (but the App JWT's) spends."""
        if self.uses_app:
            return github_installation_key(self.installation_id)
        return github_token_key(self.token)


def app_jwt(app_id: str, private_key: str, *, now: float | None = None) -> str:
    """The App's JWT: issued a minute in the past against clock drift, valid nine minutes."""
    issued = int(time.time() if now is None else now) - 60
    return jwt.encode(
        {"iat": issued, "exp": issued + 600, "iss": str(app_id)}, private_key, algorithm="RS256"
    )


def serial_slots() -> SlotLimit:
    """One call at a time per credential: GitHub's advice against secondary limits."""
    return SlotLimit(
        "github",
        concurrency=1,
        lease=call_lease(settings.AUDIT_FETCH_TIMEOUT_SECONDS),
        per_credential=True,
    )


def _parsed_body(what: str, response: httpx2.Response) -> dict:
    try:
        body = response.json()
    except ValueError as exc:
        raise Transient(f"{what} answered a body that is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise Transient(f"{what} answered JSON that is not an object")
    return body


def _send(outbound: OutboundClient, request: httpx2.Request, *, key: str, resource: str):
    """One call through the sender; what httpx2 and the guard raise becomes jobs.errors."""
    try:
        return outbound.send(request, key=key, resource=resource)
    except TargetNotAllowed as exc:
        raise Permanent(f"GitHub API: {exc}") from exc
    except (httpx2.TransportError, httpx2.DecodingError) as exc:
        raise Transient(f"GitHub API: {exc.__class__.__name__}: {exc}") from exc


class InstallationTokens:
    """Installation tokens, cached in Redis by installation id and minted once at a time."""

    def __init__(self, credentials: GitHubCredentials, outbound: OutboundClient):
        self.credentials = credentials
        self.outbound = outbound
        self.mints = 0  # by this instance; the tests read the server's count

    @property
    def cache_key(self) -> str:
        return f"github:installation-token:{self.credentials.installation_id}"

    @property
    def lock_key(self) -> str:
        return f"github:installation-token-mint:{self.credentials.installation_id}"

    def cached(self) -> str | None:
        raw = redis_client().get(self.cache_key)
        if raw is None:
            return None
        entry = json.loads(raw)
        if entry["expires_at"] - TOKEN_REFRESH_MARGIN_SECONDS <= time.time():
            return None
        return entry["token"]

    def get(self, *, refused: str | None = None) -> str:
        """A usable token. `refused` is one GitHub just answered 401 to: never return it.

        Whoever holds the lock mints; everyone else waits for the lock and then
        finds the fresh token in the cache, so N workers refreshing at once cost
        one mint. A forced refresh is the same path, so it joins the mint in flight.
        """
        token = self.cached()
        if token is not None and token != refused:
            return token
        with redis_client().lock(
            self.lock_key,
            timeout=MINT_LOCK_TIMEOUT_SECONDS,
            blocking_timeout=MINT_LOCK_TIMEOUT_SECONDS,
        ):
            token = self.cached()
            if token is not None and token != refused:
                return token
            return self._mint()

    def _mint(self) -> str:
        credentials = self.credentials
        request = self.outbound.http.build_request(
            "POST",
            f"{credentials.api_url}/app/installations/{credentials.installation_id}/access_tokens",
            headers={
                "Authorization": f"Bearer {app_jwt(credentials.app_id, credentials.private_key)}",
                "Accept": "application/vnd.github+json",
                "X-GitHub-Api-Version": API_VERSION,
            },
        )
        # The App JWT spends the App's own bucket, never the installation's.
        response = _send(
            self.outbound, request, key=github_app_key(credentials.app_id), resource=REST_RESOURCE
        )
        if response.status_code != 201:
            raise unwanted_answer("minting an installation token", response)
        body = _parsed_body("minting an installation token", response)
        expires_at = datetime.fromisoformat(body["expires_at"].replace("Z", "+00:00")).timestamp()
        redis_client().set(
            self.cache_key,
            json.dumps({"token": body["token"], "expires_at": expires_at}),
            ex=max(1, int(expires_at - time.time())),
        )
        self.mints += 1
        log.info(
            "github.token_minted",
            extra={
                "installation_id": credentials.installation_id,
                "expires_at": body["expires_at"],
            },
        )
        return body["token"]


@dataclass(frozen=True)
class RepositoryStatus:
    exists: bool
    archived: bool | None = None
    full_name: str = ""
    url: str = ""
    via: str = "rest"
    moved: bool = False


class GitHubClient:
    """Calls the GitHub API with the configured credentials, one bucket per credential."""

    def __init__(self, credentials: GitHubCredentials):
        self.credentials = credentials
        self.outbound = OutboundClient(
            build_client(
                timeout=settings.AUDIT_FETCH_TIMEOUT_SECONDS, max_body_bytes=GITHUB_MAX_BODY_BYTES
            ),
            slots=serial_slots(),
        )
        self.tokens = (
            InstallationTokens(credentials, self.outbound) if credentials.uses_app else None
        )

    def close(self) -> None:
        self.outbound.http.close()

    def _token(self, refused: str | None = None) -> str:
        return self.tokens.get(refused=refused) if self.tokens else self.credentials.token

    def request(
        self, method: str, path: str, *, resource: str, json_body: dict | None = None
    ) -> httpx2.Response:
        """One API call admitted against (credentials' key, resource); a 401 refreshes once.

        A retryable answer (5xx, 408, 425) raises Transient; any other answer is returned.
        """
        token = self._token()
        for attempt in range(2):
            request = self.outbound.http.build_request(
                method,
                f"{self.credentials.api_url}{path}",
                json=json_body,
                headers={
                    "Authorization": f"Bearer {token}",
                    "Accept": "application/vnd.github+json",
                    "X-GitHub-Api-Version": API_VERSION,
                },
            )
            response = _send(
                self.outbound, request, key=self.credentials.admission_key, resource=resource
            )
            if response.status_code == 401 and self.tokens is not None and attempt == 0:
                token = self._token(refused=token)
                continue
            if classify_status(response.status_code).retryable:
                raise unwanted_answer(f"{method} {path} answered {response.status_code}", response)
            return response
        return response

    def repository(self, owner: str, name: str) -> RepositoryStatus:
        """Does owner/name exist, and is it archived? REST first, GraphQL if core is spent.

        REST `core` and `graphql` are separate buckets: when core must wait,
        GraphQL may still have room. RateLimited only when both must wait, naming
        the bucket that opens first.
        """
        try:
            return self.repository_via_rest(owner, name)
        except RateLimited as core_limited:
            try:
                return self.repository_via_graphql(owner, name)
            except RateLimited as graphql_limited:
                raise min(core_limited, graphql_limited, key=_retry_at) from None

    def repository_via_rest(self, owner: str, name: str) -> RepositoryStatus:
        response = self.request(
            "GET", f"/repos/{quote(owner, safe='')}/{quote(name, safe='')}", resource=REST_RESOURCE
        )
        missing = RepositoryStatus(exists=False, full_name=f"{owner}/{name}")
        if response.status_code == 404:
            return missing
        if response.status_code in {301, 302, 307, 308}:
            # A renamed repository: whether it is public is the new location's to say.
            response = self._renamed_to(response)
            if response is None or response.status_code == 404:
                return missing
        if response.status_code != 200:
            raise unwanted_answer(
                f"GET /repos/{owner}/{name} answered {response.status_code}", response
            )
        body = _parsed_body(f"GET /repos/{owner}/{name}", response)
        if body.get("private") is not False:
            return missing  # private (or not said): what a visitor without credentials sees
        full_name = body.get("full_name", "")
        return RepositoryStatus(
            exists=True,
            archived=bool(body.get("archived")),
            full_name=full_name,
            url=body.get("html_url", ""),
            moved=full_name.lower() != f"{owner}/{name}".lower(),
        )

    def _renamed_to(self, moved: httpx2.Response) -> httpx2.Response | None:
        """The repository a rename points at (GitHub's `/repositories/<id>`), or None when
        the answer names no location on this API."""
        try:
            location = str(_parsed_body("a rename", moved).get("url") or "")
        except Transient:
            location = ""
        location = location or moved.headers.get("Location", "")
        prefix = f"{self.credentials.api_url}/"
        if not location.startswith(prefix):
            return None
        return self.request("GET", location[len(prefix) - 1 :], resource=REST_RESOURCE)

    def repository_via_graphql(self, owner: str, name: str) -> RepositoryStatus:
        response = self.request(
            "POST",
            "/graphql",
            resource=GRAPHQL_RESOURCE,
            json_body={"query": REPOSITORY_QUERY, "variables": {"owner": owner, "name": name}},
        )
        if response.status_code != 200:
            raise unwanted_answer(f"POST /graphql answered {response.status_code}", response)
        body = _parsed_body("POST /graphql", response)
        repository = (body.get("data") or {}).get("repository")
        if repository is None:
            types = {e.get("type") for e in body.get("errors") or [] if isinstance(e, dict)}
            if "NOT_FOUND" in types:
                return RepositoryStatus(exists=False, full_name=f"{owner}/{name}", via="graphql")
            raise Transient(f"GraphQL answered no repository: {sorted(map(str, types))}")
        if repository.get("isPrivate") is not False:
            return RepositoryStatus(exists=False, full_name=f"{owner}/{name}", via="graphql")
        full_name = repository.get("nameWithOwner", "")
        return RepositoryStatus(
            exists=True,
            archived=bool(repository.get("isArchived")),
            full_name=full_name,
            url=repository.get("url", ""),
            via="graphql",
            moved=full_name.lower() != f"{owner}/{name}".lower(),
        )


def _retry_at(limited: RateLimited) -> float:
    return math.inf if limited.retry_at is None else limited.retry_at
