from __future__ import annotations

from collections.abc import Callable

import pytest
import redis
from django.conf import settings

from devstack.demo_site import DemoSite
from tests import database
from tests.http_server import Answer, LocalServer, QuietHandler, Scripted
from tests.private_redis import PrivateRedis
from tests.workers import WorkerProcess

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


def _worker_starter(started: list[WorkerProcess], **defaults):
    def start(
        queue: str,
        *,
        concurrency: int | None = 1,
        pool: str | None = None,
        env: dict | None = None,
        options: list[str] | None = None,
    ) -> WorkerProcess:
        # As in the test process (_no_slow_start): tests that want the slow start say so.
        env = {"PAGE_FETCH_WARMUP_RATE": "0", **defaults, **(env or {})}
        worker = WorkerProcess(
            queue, concurrency=concurrency, pool=pool, env=env, options=options
        ).start()
        started.append(worker)
        return worker

    return start


@pytest.fixture
def start_worker(transactional_db, redis_client):
    """Start real `celery worker` subprocesses: start_worker("audits", env={...})."""
    started: list[WorkerProcess] = []
    yield _worker_starter(started)
    for worker in started:
        worker.end()  # at once: the test is over (WorkerProcess.end)


@pytest.fixture(scope="module")
def start_module_worker(django_db_setup):
    """start_worker for a whole module: a worker started once and shared by its tests, for
    a module whose tests use the same kind of worker and none kills or reconfigures it
    (a start costs 3-4 s). A test using one asks for `transactional_db` itself; the
    per-test Redis flush and table truncation happen under the running worker, which
    consumes the next test's messages as it did the first's.

    Its reconciler ticks once, at the start: a tick after a flush finds its mark gone and
    publishes again everything owed (Redis "came back empty"), which a test counting
    attempts or requests would see. Reconciling is the fault tests' subject, not these."""
    started: list[WorkerProcess] = []
    yield _worker_starter(started, RECONCILE_INTERVAL_SECONDS=str(24 * 3600))
    for worker in started:
        worker.end()


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
