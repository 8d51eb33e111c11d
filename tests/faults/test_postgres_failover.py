"""The PostgreSQL primary dies under load and its streaming replica is promoted.

The stack is given a multi-host DATABASE_URL (both servers, target_session_attrs=
read-write), as a deployment with a standby would be: after the promotion, new
connections find the promoted replica by themselves. Every audit accepted with 202
before, during or after finishes; a submission while no server accepts writes is a
503 with Retry-After, never a 500.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import httpx2
import pytest

from bench.pgcluster import PgCluster
from tests.faults.outages import WebProcess
from tests.workers import ROOT, wait_for

pytestmark = pytest.mark.slow


class Submitter(threading.Thread):
    """Submits an audit every 100 ms until stopped, keeping every answer."""

    def __init__(self, web: WebProcess, page_url: str):
        super().__init__(daemon=True)
        self.web, self.page_url = web, page_url
        self.answers: list[httpx2.Response] = []
        self.stopped = threading.Event()

    def run(self):
        number = 0
        while not self.stopped.wait(0.1):
            number += 1
            self.answers.append(self.web.submit(f"{self.page_url}?n={number}"))

    def finish(self) -> list[httpx2.Response]:
        self.stopped.set()
        self.join(timeout=30)
        return self.answers


def audit_status(web: WebProcess, audit_id: str) -> str:
    return httpx2.get(f"{web.url}/api/audits/{audit_id}", timeout=10).json()["status"]


def test_promoting_the_replica_under_load_loses_no_accepted_audit(site, start_worker, settings):
    cluster = PgCluster().start()
    try:
        cluster.create_database("plumb")
        database_url = cluster.database_url("plumb")
        env = {**os.environ, "DEBUG": "true", "DATABASE_URL": database_url, "REDIS_URL": settings.REDIS_URL,
               "AUDIT_ALLOW_PRIVATE_TARGETS": "true", "DB_CONNECT_TIMEOUT_SECONDS": "2",
               # One address submits the whole load: no per-address refusals here.
               "AUDIT_SUBMIT_BURST": "10000"}  # fmt: skip
        subprocess.run([sys.executable, "manage.py", "migrate", "--verbosity", "0"],
                       cwd=ROOT, env=env, check=True, timeout=120)  # fmt: skip
        web = WebProcess(env)
        try:
            worker = start_worker("audits", concurrency=2, env={"DATABASE_URL": database_url,
                                                                "DB_CONNECT_TIMEOUT_SECONDS": "2"})  # fmt: skip
            load = Submitter(web, f"{site.base_url}/noindex")
            load.start()
            wait_for(
                lambda: len(load.answers) >= 15, timeout=30, message="submissions before the fault"
            )

            cluster.primary.stop("immediate")
            # No server accepts writes until the promotion: a clear refusal, nothing written.
            refused = web.submit(f"{site.base_url}/noindex?during=gap")
            cluster.replica.promote()
            wait_for(
                lambda: len(load.answers) >= 30,
                timeout=60,
                message="submissions after the promotion",
            )
            answers = load.finish()

            assert refused.status_code == 503, refused.text
            assert refused.json()["error"] == "database_unavailable"
            assert "Retry-After" in refused.headers
            assert {answer.status_code for answer in answers} <= {202, 503}, [
                (a.status_code, a.text[:200]) for a in answers if a.status_code not in (202, 503)
            ]
            accepted = [answer.json()["id"] for answer in answers if answer.status_code == 202]
            assert len(accepted) >= 20
            for audit_id in accepted:
                wait_for(lambda a=audit_id: audit_status(web, a) == "succeeded", timeout=60,
                         message=f"accepted audit {audit_id} to succeed", show=[worker])  # fmt: skip
            # Accepted after the promotion: the workers and web use the promoted replica.
            after = web.submit(f"{site.base_url}/noindex?after=promotion")
            assert after.status_code == 202
            wait_for(lambda: audit_status(web, after.json()["id"]) == "succeeded", timeout=30,
                     message="a submission after the promotion", show=[worker])  # fmt: skip
        finally:
            web.stop()
    finally:
        cluster.close()
