"""A worker's threads share one outbound client; its pool keeps their connections.

httpcore 1.0.9 counted every pooled connection, busy ones too, as idle surplus once there
were more than 20, and closed its idle ones at every pass: a worker of 32 threads opened
a connection for nearly every fetch (DECISIONS.md, "The outbound client is httpx2").
"""

from __future__ import annotations

import threading
import time

from outbound.client import shared_client

THREADS = 28  # more than the 20 connections the pool keeps alive
REQUESTS_EACH = 6


def test_a_workers_threads_keep_their_connections_past_the_keep_alive_limit(http_server):
    connections: set[tuple[str, int]] = set()
    lock = threading.Lock()

    def respond(request):
        with lock:
            connections.add(request.client_address)  # a kept connection keeps its port
        time.sleep(0.05)  # a page answered after 50 ms: the threads' requests overlap
        return 200, {}, b"<html></html>"

    server = http_server(respond=respond)
    client = shared_client(timeout=10, allow_private=True)
    failures: list[BaseException] = []

    def fetch() -> None:
        try:
            for n in range(REQUESTS_EACH):
                client.get(f"{server.url}/{n}").raise_for_status()
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            failures.append(exc)

    threads = [threading.Thread(target=fetch) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert not failures
    # Each thread's connection is reused for its next request; a pool closing the idle
    # ones opened nearly one a request (THREADS * REQUESTS_EACH).
    assert len(connections) < 2 * THREADS, (
        f"{len(connections)} connections for {THREADS * REQUESTS_EACH} requests"
    )
