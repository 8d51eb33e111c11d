from __future__ import annotations

from collections.abc import Callable

import pytest
import redis
from django.conf import settings

from devstack.demo_site import DemoSite
from tests import database
from tests.http_server import Answer, LocalServer, QuietHandler, Scripted
from tests.private_redis import PrivateRedis
from tests.workers import WorkerProcess, started_worker

# A committing test empties the tables with DELETEs instead of Django's flush (tests/database.py).
database.install()
# Django's advice for a test suite: a fast password hasher. Production's PBKDF2 (1,000,000
# iterations) costs 0.21 s of CPU a hash here, and the suite's admin users and logins make
# about sixty; no test is about the hash itself.
settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def _allow_private_targets(settings):
    # The test downstreams live on 127.0.0.1; tests of the guard pass allow_private=False.
    settings.AUDIT_ALLOW_PRIVATE_TARGETS = True


@pytest.fixture(autouse=True)
def _no_slow_start(settings):
    # Tests compress production's waits (retries 0.2 s apart against a host that fails);
    # the slow start's 2 fetches a second to a host that has not answered is tuned for
    # the real ones. Its own tests turn it on (and start_worker's workers follow suit).
    settings.PAGE_FETCH_WARMUP_RATE = 0


@pytest.fixture
def http_server():
    """Start test downstreams (tests/http_server.py) on 127.0.0.1, stopped when the test ends:
    `http_server(Receiver())` starts any LocalServer and returns it;
    `http_server(respond=fn)` starts one answering every request with `fn(request)`."""
    started: list[LocalServer] = []

    def start(
        server: LocalServer | None = None,
        *,
        respond: Callable[[QuietHandler], Answer] | None = None,
    ) -> LocalServer:
        server = (server or LocalServer(respond=respond)).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def scripted(redis_client, http_server):
    """scripted((429, {"Retry-After": "1"}, None), (200, {}, None)): a started Scripted
    server (tests/http_server.py) answering those in turn."""
    return lambda *script: http_server(Scripted(list(script)))


@pytest.fixture
def site():
    """The demo site on a free port on 127.0.0.1: a real HTTP downstream."""
    server = DemoSite().start()
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def _empty_redis():
    """Every test starts from an empty test Redis: no bucket, count or queued message
    of one test leaks into the next."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.flushdb()
    client.close()


@pytest.fixture
def redis_client(_empty_redis):
    """The test Redis database (empty when the test starts)."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    yield client
    client.close()


@pytest.fixture
def start_worker(transactional_db, redis_client):
    """Start real `celery worker` subprocesses of the test's own, ended when it ends:
    start_worker("audits", env={...}). For a test that kills its worker or watches what a
    start does; tests that can share one ask for a `module_worker` (tests/workers.py)."""
    started: list[WorkerProcess] = []

    def start(queue: str, **options) -> WorkerProcess:
        worker = started_worker(queue, **options)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.end()  # at once: the test is over (WorkerProcess.end)


@pytest.fixture(scope="module")
def kept_workers():
    """The module's running `module_worker`s, by fixture name, ended with the module."""
    kept: dict[str, WorkerProcess] = {}
    yield kept
    for worker in kept.values():
        worker.end()


@pytest.fixture(autouse=True)
def _only_requested_workers(request, kept_workers):
    """A module's shared worker runs only during the tests that ask for it: another test's
    messages, or a test's own worker beside it, are not its to take."""
    for name in [name for name in kept_workers if name not in request.fixturenames]:
        kept_workers.pop(name).end()


@pytest.fixture
def start_private_redis():
    """Start redis-servers of the test's own (tests/private_redis.py), each on a free port,
    stopped when the test ends: start_private_redis("--maxmemory-policy", "allkeys-lru")."""
    started: list[PrivateRedis] = []

    def start(*options: str) -> PrivateRedis:
        server = PrivateRedis(*options)
        started.append(server)
        return server.start()

    yield start
    for server in started:
        server.remove()


@pytest.fixture
def private_redis(start_private_redis) -> PrivateRedis:
    """A redis-server of the test's own, with the default settings."""
    return start_private_redis()


APP_ID = "4242"
INSTALLATION_ID = "77"


@pytest.fixture(scope="session")
def app_key_pair():
    from tests.fake_github import new_app_key

    return new_app_key()


@pytest.fixture
def fake_github(app_key_pair, settings):
    """A GitHub-like API on 127.0.0.1, with Plumb's GitHub App settings pointing at it.

    `fake_github.worker_env` holds the same settings for `start_worker`.
    """
    from tests.fake_github import FakeGitHub

    private_key, public_key = app_key_pair
    server = FakeGitHub(
        app_id=APP_ID,
        public_key=public_key,
        installation_id=INSTALLATION_ID,
        repositories={
            f"plumb/repo{n}": {"full_name": f"plumb/repo{n}", "archived": n == 1} for n in range(8)
        },
    ).start()
    github = {
        "GITHUB_API_URL": server.url,
        "GITHUB_APP_ID": APP_ID,
        "GITHUB_APP_PRIVATE_KEY": private_key,
        "GITHUB_INSTALLATION_ID": INSTALLATION_ID,
    }
    for name, value in github.items():
        setattr(settings, name, value)
    server.worker_env = github
    yield server
    server.stop()
