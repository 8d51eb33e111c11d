"""The database goes away for a while: /healthz says so, workers retry and recover."""

from __future__ import annotations

import contextlib
import os
import socket
import threading

import httpx
import pytest
from django.db import connection

from audits import submission
from audits.models import Audit
from config import devservices
from outbound.urls import normalize_url
from tests.faults.test_redis_restart import WebProcess
from tests.workers import database_url_for_workers, wait_for

pytestmark = [pytest.mark.slow]


class CuttableProxy:
    """A TCP proxy to the database that can drop every connection and refuse new ones."""

    def __init__(self, target: tuple[str, int]):
        self.target = target
        self.port = devservices.free_port()
        self.listener = socket.create_server(("127.0.0.1", self.port))
        self.open = threading.Event()
        self.open.set()
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if not self.open.is_set():
                client.close()
                continue
            upstream = socket.create_connection(self.target)
            with self.lock:
                self.sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(source, sink):
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def cut(self):
        self.open.clear()
        with self.lock:
            for s in self.sockets:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
            self.sockets.clear()

    def restore(self):
        self.open.set()

    def close(self):
        self.cut()
        self.listener.close()


@pytest.fixture
def db_proxy(transactional_db):
    if connection.vendor != "postgresql":
        pytest.skip("the database outage test needs PostgreSQL (SQLite is a file, not a server)")
    db = connection.settings_dict
    proxy = CuttableProxy((db["HOST"] or "127.0.0.1", int(db["PORT"] or 5432)))
    yield proxy
    proxy.close()


def via(proxy: CuttableProxy) -> str:
    return database_url_for_workers().replace(
        f":{connection.settings_dict['PORT'] or 5432}/", f":{proxy.port}/"
    )


def test_healthz_reports_the_database_and_recovers(db_proxy):
    web = WebProcess({**os.environ, "DEBUG": "true", "DATABASE_URL": via(db_proxy)})
    try:
        assert httpx.get(f"{web.url}/healthz", timeout=10).status_code == 200
        db_proxy.cut()
        down = httpx.get(f"{web.url}/healthz", timeout=30)
        assert down.status_code == 503
        assert down.json()["checks"]["database"].startswith("error")
        assert down.json()["checks"]["redis"] == "ok"
        db_proxy.restore()
        wait_for(lambda: httpx.get(f"{web.url}/healthz", timeout=10).status_code == 200,
                 timeout=30, message="/healthz to recover")  # fmt: skip
    finally:
        web.stop()


def test_a_worker_retries_through_a_database_outage_and_finishes_the_audit(
    db_proxy, site, start_worker
):
    worker = start_worker(
        "audits", env={"DATABASE_URL": via(db_proxy), "RETRY_BACKOFF_BASE_SECONDS": "1"}
    )
    db_proxy.cut()
    # Accepted while the workers cannot reach the database (the web process can).
    audit = submission.submit_audit(normalize_url(f"{site.base_url}/noindex"))
    wait_for(lambda: "task.outage_wait" in worker.output(), timeout=30,
             message="the worker to wait the outage out")  # fmt: skip
    assert Audit.objects.get(id=audit.id).status == "queued"

    db_proxy.restore()
    wait_for(lambda: Audit.objects.get(id=audit.id).status == "succeeded", timeout=60,
             message="the audit to finish once the database is back")  # fmt: skip
    assert site.hits["/noindex"] == 1


def test_a_submission_while_the_database_is_away_gets_503_and_can_retry(db_proxy, site):
    web = WebProcess({**os.environ, "DEBUG": "true", "DATABASE_URL": via(db_proxy)})
    try:
        db_proxy.cut()
        refused = web.submit(f"{site.base_url}/noindex?during=outage")
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"] == "database_unavailable"
        assert 5 <= int(refused.headers["Retry-After"]) <= 15

        db_proxy.restore()
        wait_for(lambda: web.submit(f"{site.base_url}/noindex?after=outage").status_code == 202,
                 timeout=30, message="submissions to be accepted again")  # fmt: skip
        assert not Audit.objects.filter(page__url__contains="during=outage").exists()
    finally:
        web.stop()


def test_a_pooled_connection_is_checked_before_use_after_a_database_restart(db_proxy):
    web = WebProcess(
        {**os.environ, "DEBUG": "true", "DATABASE_URL": via(db_proxy), "DB_POOL_MAX_SIZE": "2"}
    )
    try:
        before = httpx.get(f"{web.url}/healthz", timeout=10)
        assert before.status_code == 200, before.text
        # Every connection the pool holds dies, as in a restart or failover; then the
        # database is back before the next request.
        db_proxy.cut()
        db_proxy.restore()
        # The very first request after it gets a live connection.
        first = httpx.get(f"{web.url}/healthz", timeout=30)
        assert first.status_code == 200, first.text
    finally:
        web.stop()
