"""outbound.client's one private httpx2 hook, pinned: the pool's network backend.

httpx2 has no public way to choose how connections are opened, so build_client sets
`transport._pool._network_backend` (the SSRF guard and each exchange's deadline live
there). If httpx2 or httpcore2 renamed either attribute, the assignment would still
succeed and silently stop mattering: every connection would skip the guard and the
deadline. These tests fail then, the way tests/test_transport.py pins kombu's method.
"""

from __future__ import annotations

import socket
import time

import httpcore2
import httpx2
import pytest

from outbound import bounded
from outbound.client import build_client
from outbound.guard import GuardedNetworkBackend, TargetNotAllowed

# The httpcore2 whose ConnectionPool was read for this hook: it keeps the backend in
# `_network_backend` and hands it to every connection it opens.
REVIEWED_HTTPCORE = "2.17.0"


def test_the_httpcore_read_for_the_hook_is_the_one_installed():
    assert httpcore2.__version__ == REVIEWED_HTTPCORE, (
        "httpcore2 changed: check that ConnectionPool still opens every connection through "
        "`self._network_backend` (outbound.client.build_client sets it), then update "
        "REVIEWED_HTTPCORE"
    )


def test_the_backend_set_is_the_one_the_pool_holds():
    client = build_client(timeout=1, allow_private=False)
    backend = client._transport._transport._pool._network_backend
    assert isinstance(backend, bounded.DeadlineBackend)
    assert isinstance(backend._backend, GuardedNetworkBackend)


def test_every_connection_goes_through_the_guard(site):
    client = build_client(timeout=2, allow_private=False)
    with pytest.raises(TargetNotAllowed):
        client.get(f"{site.base_url}/")


def test_every_connection_ends_at_the_exchanges_deadline():
    # A server that accepts and never answers: only the backend's deadline ends the wait.
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    client = build_client(timeout=30, allow_private=True)
    request = client.build_request("GET", f"http://127.0.0.1:{port}/")
    request.extensions[bounded.DEADLINE] = time.monotonic() + 1
    started = time.monotonic()
    try:
        with pytest.raises(httpx2.TimeoutException):
            client.send(request)
    finally:
        listener.close()
    assert time.monotonic() - started < 5
