"""A local HTTP server that behaves like GitHub's API where Plumb uses it, and a page linking out.

`FakeGitHub` serves, on 127.0.0.1:
- POST /app/installations/<id>/access_tokens (App JWT, verified with the App's public
  key): mints an installation token and counts the mints;
- GET /repos/<owner>/<repo> (REST, `core`): a repository's `private` and `archived`, and
  for a renamed one (`renamed`: old name to new) a 301 to GET /repositories/<id>;
- POST /graphql, the `repository(owner:, name:)` query (`graphql`), following renames
  as GitHub's does, with `isPrivate`.
Every credential here sees every repository, private ones included, as a token with the
`repo` scope (or an App installed on all of an owner's repositories) would.
Every credential has real primary buckets per resource (`x-ratelimit-*` headers on
every answer, 403 once spent, GraphQL answering 200 with a RATE_LIMITED error), a
secondary limit can be switched on (403 with Retry-After: 60), and every request is
recorded with the bucket it spent.

`LinkedPage` serves `/` linking to the given URLs, and `/target/<n>` pages that
record when each request came and how many were in flight.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from urllib.parse import urlsplit

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.http_server import LocalServer, QuietHandler


def new_app_key() -> tuple[str, str]:
    """(private PEM, public PEM) of a fresh RSA key for a test App."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    public = (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    return private, public


@dataclass
class Bucket:
    limit: int
    remaining: int
    reset_at: float
    window: float

    def roll(self, now: float) -> None:
        if now >= self.reset_at:
            self.remaining = self.limit
            self.reset_at = math.ceil(now + self.window)


@dataclass
class Seen:
    at: float
    identity: str
    resource: str
    method: str
    path: str
    status: int


@dataclass
class FakeGitHubState:
    app_id: str
    public_key: str
    installation_id: str
    repositories: dict[str, dict]
    renamed: dict[str, str] = field(default_factory=dict)  # old full name -> new (lowercase)
    personal_tokens: set[str] = field(default_factory=set)
    limit: int = 5000
    window: float = 3600.0
    token_lifetime: float = 3600.0
    mint_delay: float = 0.0
    answer_delay: float = 0.0  # every repository answer takes this long (a slow GitHub)
    buckets: dict[tuple[str, str], Bucket] = field(default_factory=dict)
    tokens: dict[str, float] = field(default_factory=dict)  # installation token -> expiry
    secondary_retry_after: dict[str, int] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)
    mints: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


REPO_PATH = re.compile(r"^/repos/([^/]+)/([^/]+)$")
REPO_BY_ID_PATH = re.compile(r"^/repositories/([0-9]+)$")
MINT_PATH = re.compile(r"^/app/installations/([^/]+)/access_tokens$")


class FakeGitHubHandler(QuietHandler):
    @property
    def state(self) -> FakeGitHubState:
        return self.server.state

    def do_GET(self):
        self._handle("GET")

    def do_POST(self):
        self._handle("POST")

    def _handle(self, method: str):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        path = urlsplit(self.path).path
        if method == "POST" and (match := MINT_PATH.match(path)):
            return self._mint(match.group(1))
        identity = self._identity()
        if identity is None:
            return self._send(401, {"message": "Bad credentials"}, path=path, method=method)
        if method == "GET" and (match := REPO_PATH.match(path)):
            return self._rest_repository(identity, method, path, *match.groups())
        if method == "GET" and (match := REPO_BY_ID_PATH.match(path)):
            return self._rest_repository_by_id(identity, method, path, int(match.group(1)))
        if method == "POST" and path == "/graphql":
            return self._graphql(identity, method, path, json.loads(body or b"{}"))
        return self._send(404, {"message": "Not Found"}, path=path, method=method)

    # --- credentials --------------------------------------------------------
    def _bearer(self) -> str:
        return (self.headers.get("Authorization") or "").removeprefix("Bearer ").strip()

    def _identity(self) -> str | None:
        token = self._bearer()
        with self.state.lock:
            expires = self.state.tokens.get(token)
        if expires is not None:
            return f"installation:{self.state.installation_id}" if expires > time.time() else None
        if token in self.state.personal_tokens:
            return f"token:{token}"
        return None

    def _mint(self, installation_id: str):
        state = self.state
        path = f"/app/installations/{installation_id}/access_tokens"
        try:
            claims = jwt.decode(self._bearer(), state.public_key, algorithms=["RS256"])
        except jwt.PyJWTError as exc:
            return self._send(401, {"message": f"bad JWT: {exc}"}, path=path, method="POST")
        if str(claims.get("iss")) != state.app_id or installation_id != state.installation_id:
            return self._send(404, {"message": "Not Found"}, path=path, method="POST")
        identity = f"app:{state.app_id}"
        if refused := self._spend(identity, "core", "POST", path):
            return refused
        time.sleep(state.mint_delay)  # a slow mint makes concurrent refreshes overlap
        with state.lock:
            state.mints += 1
            token = f"ghs_{state.mints}_{uuid.uuid4().hex[:12]}"
            expires = time.time() + state.token_lifetime
            state.tokens[token] = expires
        stamp = datetime.fromtimestamp(expires, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        self._send(
            201, {"token": token, "expires_at": stamp}, identity=identity, resource="core",
            path=path, method="POST",
        )  # fmt: skip

    # --- buckets ------------------------------------------------------------
    def bucket(self, identity: str, resource: str) -> Bucket:
        state = self.state
        now = time.time()
        bucket = state.buckets.setdefault(
            (identity, resource),
            Bucket(state.limit, state.limit, math.ceil(now + state.window), state.window),
        )
        bucket.roll(now)
        return bucket

    def _limit_headers(self, identity: str, resource: str) -> dict[str, str]:
        bucket = self.bucket(identity, resource)
        return {
            "x-ratelimit-limit": str(bucket.limit),
            "x-ratelimit-remaining": str(bucket.remaining),
            "x-ratelimit-used": str(bucket.limit - bucket.remaining),
            "x-ratelimit-reset": str(int(bucket.reset_at)),
            "x-ratelimit-resource": resource,
        }

    def _spend(self, identity: str, resource: str, method: str, path: str):
        """Spend one unit; returns True when a refusal was sent instead."""
        state = self.state
        with state.lock:
            secondary = state.secondary_retry_after.get(identity)
            bucket = self.bucket(identity, resource)
            exhausted = bucket.remaining <= 0
            if not exhausted and secondary is None:
                bucket.remaining -= 1
        if secondary is not None:
            self._send(
                403,
                {"message": "You have exceeded a secondary rate limit. Please wait a few minutes."},
                identity=identity, resource=resource, path=path, method=method,
                extra={"Retry-After": str(secondary)},
            )  # fmt: skip
            return True
        if exhausted and resource != "graphql":
            self._send(
                403, {"message": f"API rate limit exceeded for {identity}."},
                identity=identity, resource=resource, path=path, method=method,
            )  # fmt: skip
            return True
        if exhausted:
            self._send(
                200,
                {"data": None, "errors": [{"type": "RATE_LIMITED", "message": "API rate limit exceeded"}]},
                identity=identity, resource=resource, path=path, method=method,
            )  # fmt: skip
            return True
        return False

    # --- endpoints ----------------------------------------------------------
    def _rest_repository(self, identity, method, path, owner, name):
        if self._spend(identity, "core", method, path):
            return
        time.sleep(self.state.answer_delay)
        key = f"{owner}/{name}".lower()
        if key in self.state.renamed:
            moved_to = f"{self.server.url}/repositories/{self._id_of(self.state.renamed[key])}"
            return self._send(
                301, {"message": "Moved Permanently", "url": moved_to},
                identity=identity, resource="core", path=path, method=method,
                extra={"Location": moved_to},
            )  # fmt: skip
        self._repository_answer(self.state.repositories.get(key), identity, method, path)

    def _id_of(self, full_name: str) -> int:
        return list(self.state.repositories).index(full_name.lower()) + 1

    def _rest_repository_by_id(self, identity, method, path, repository_id):
        if self._spend(identity, "core", method, path):
            return
        names = list(self.state.repositories)
        repository = (
            self.state.repositories[names[repository_id - 1]]
            if 0 < repository_id <= len(names) else None
        )  # fmt: skip
        self._repository_answer(repository, identity, method, path)

    def _repository_answer(self, repository, identity, method, path):
        if repository is None:
            return self._send(404, {"message": "Not Found"}, identity=identity, resource="core",
                              path=path, method=method)  # fmt: skip
        self._send(
            200,
            {"full_name": repository["full_name"], "archived": repository.get("archived", False),
             "private": repository.get("private", False),
             "html_url": f"https://github.com/{repository['full_name']}"},
            identity=identity, resource="core", path=path, method=method,
        )  # fmt: skip

    def _graphql(self, identity, method, path, body):
        if self._spend(identity, "graphql", method, path):
            return
        time.sleep(self.state.answer_delay)
        variables = body.get("variables") or {}
        key = f"{variables.get('owner')}/{variables.get('name')}".lower()
        repository = self.state.repositories.get(self.state.renamed.get(key, key))
        if repository is None:
            payload = {"data": {"repository": None},
                       "errors": [{"type": "NOT_FOUND", "message": "Could not resolve"}]}  # fmt: skip
        else:
            payload = {"data": {"repository": {
                "nameWithOwner": repository["full_name"],
                "url": f"https://github.com/{repository['full_name']}",
                "isArchived": repository.get("archived", False),
                "isPrivate": repository.get("private", False)}}}  # fmt: skip
        self._send(200, payload, identity=identity, resource="graphql", path=path, method=method)

    def _send(self, status, payload, *, path, method, identity="", resource="", extra=None):
        body = json.dumps(payload).encode()
        headers = {"Content-Type": "application/json", "Content-Length": str(len(body))}
        if identity and resource:
            with self.state.lock:
                headers.update(self._limit_headers(identity, resource))
        headers.update(extra or {})
        with self.state.lock:
            self.state.seen.append(Seen(time.time(), identity, resource, method, path, status))
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)


class FakeGitHub(LocalServer):
    def __init__(self, **state):
        super().__init__(FakeGitHubHandler)
        self.state = FakeGitHubState(**state)

    # --- what tests set and read ------------------------------------------------
    @property
    def installation(self) -> str:
        return f"installation:{self.state.installation_id}"

    @property
    def app(self) -> str:
        return f"app:{self.state.app_id}"

    def exhaust(self, identity: str, resource: str, *, reset_in: float) -> float:
        """Spend the bucket now; it refills at the whole second `reset_in` seconds from now
        (GitHub's reset is whole epoch seconds), which is returned."""
        with self.state.lock:
            self.state.buckets[(identity, resource)] = Bucket(
                self.state.limit, 0, math.ceil(time.time() + reset_in), self.state.window
            )
            return self.state.buckets[(identity, resource)].reset_at

    def secondary_limit(self, identity: str, retry_after: int = 60) -> None:
        with self.state.lock:
            self.state.secondary_retry_after[identity] = retry_after

    def revoke_tokens(self) -> None:
        with self.state.lock:
            self.state.tokens = {token: 0.0 for token in self.state.tokens}

    def requests(self, *, identity: str | None = None, resource: str | None = None) -> list[Seen]:
        with self.state.lock:
            return [
                seen
                for seen in self.state.seen
                if (identity is None or seen.identity == identity)
                and (resource is None or seen.resource == resource)
            ]


class LinkedPageHandler(QuietHandler):
    def do_GET(self):
        server: LinkedPage = self.server
        path = urlsplit(self.path).path
        if path == "/robots.txt":
            # Counted apart from the link targets' arrivals: tests count link requests.
            with server.lock:
                server.robots_requests += 1
            if server.robots is None:
                return self._send(b"<!doctype html><title>Not found</title>", status=404)
            return self._send(server.robots.encode(), content_type="text/plain")
        if path == "/":
            anchors = "".join(f"<li><a href='{url}'>{url}</a></li>" for url in server.links)
            return self._send(f"<!doctype html><title>Links</title><ul>{anchors}</ul>".encode())
        with server.lock:
            server.in_flight += 1
            server.max_in_flight = max(server.max_in_flight, server.in_flight)
            server.arrivals.append(time.time())
        time.sleep(server.delay)
        # Out of flight before the answer leaves: no client can have it before this runs.
        with server.lock:
            server.in_flight -= 1
        if server.redirect_to:
            self.send_response(302)
            self.send_header("Location", f"{server.redirect_to}{self.path}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self._send(b"<!doctype html><title>Target</title>")

    def _send(self, body: bytes, *, status: int = 200, content_type: str = "text/html"):
        self.send_response(status)
        self.send_header("Content-Type", f"{content_type}; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class LinkedPage(LocalServer):
    """`/` links to `links`; every other path is a link target that records its arrivals
    (and, with `redirect_to`, redirects to the same path there). `/robots.txt` serves
    `robots` (404 when None), counted in `robots_requests`, not in the arrivals."""

    def __init__(
        self,
        links: list[str] | None = None,
        *,
        delay: float = 0.0,
        redirect_to: str = "",
        robots: str | None = None,
    ):
        super().__init__(LinkedPageHandler)
        self.links = list(links or [])
        self.robots = robots
        self.robots_requests = 0
        self.delay = delay
        self.redirect_to = redirect_to
        self.lock = threading.Lock()
        self.in_flight = 0
        self.max_in_flight = 0
        self.arrivals: list[float] = []
