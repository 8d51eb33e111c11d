"""The web's bridge from gunicorn's event loop to Django's WSGI handler (config.wsgi_threads).

The server end to end (slow clients, stalled bodies, start-up) is pinned by
tests/security/test_slow_clients.py and tests/test_web_start.py; these pin what the
bridge itself must get right: the environ Django reads, and one response per request.
"""

from __future__ import annotations

import asyncio
import threading

from config.wsgi_threads import WSGIThreads, wsgi_environ

SCOPE = {
    "type": "http",
    "http_version": "1.1",
    "method": "POST",
    "scheme": "http",
    "path": "/api/audits/é",
    "root_path": "",
    "query_string": b"a=1&b=%C3%A9",
    "headers": [
        (b"host", b"plumb.test"),
        (b"content-type", b"application/json"),
        (b"content-length", b"999"),
        (b"cookie", b"a=1"),
        (b"cookie", b"b=2"),
        (b"accept", b"text/html"),
        (b"accept", b"application/json"),
        (b"x_forwarded_for", b"198.51.100.7"),
    ],
    "client": ("192.0.2.1", 51000),
    "server": ("127.0.0.1", 8000),
}


def test_the_environ_is_what_a_wsgi_server_gives_django():
    environ = wsgi_environ(SCOPE, b'{"url": "x"}')
    assert environ["REQUEST_METHOD"] == "POST"
    # PEP 3333: the path's UTF-8 bytes as latin-1 characters, as Django expects them.
    assert environ["PATH_INFO"].encode("latin-1").decode("utf-8") == "/api/audits/é"
    assert environ["QUERY_STRING"] == "a=1&b=%C3%A9"
    assert environ["CONTENT_TYPE"] == "application/json"
    assert environ["CONTENT_LENGTH"] == "12"  # the body read, not the header's claim
    assert environ["wsgi.input"].read() == b'{"url": "x"}'
    assert environ["HTTP_COOKIE"] == "a=1; b=2"
    assert environ["HTTP_ACCEPT"] == "text/html,application/json"
    assert environ["REMOTE_ADDR"] == "192.0.2.1"
    assert (environ["SERVER_NAME"], environ["SERVER_PORT"]) == ("127.0.0.1", "8000")
    # A header spelled with underscores would pass for X-Forwarded-For: dropped.
    assert "HTTP_X_FORWARDED_FOR" not in environ


def test_a_request_is_answered_from_a_thread_with_the_whole_response():
    seen = {}

    class Body(list):
        closed = False

        def close(self):
            Body.closed = True

    def app(environ, start_response):
        seen["thread"] = threading.current_thread().name
        seen["body"] = environ["wsgi.input"].read()
        start_response("201 Created", [("Content-Type", "text/plain"), ("X-Two", "2")])
        return Body([b"made ", b"it"])

    messages = [
        {"type": "http.request", "body": b"he", "more_body": True},
        {"type": "http.request", "body": b"llo", "more_body": False},
    ]
    sent = []

    async def receive():
        return messages.pop(0)

    async def send(message):
        sent.append(message)

    asyncio.run(WSGIThreads(app, threads=1)(SCOPE, receive, send))

    assert seen["body"] == b"hello"
    assert seen["thread"].startswith("wsgi")
    assert sent == [
        {
            "type": "http.response.start",
            "status": 201,
            "headers": [(b"content-type", b"text/plain"), (b"x-two", b"2")],
        },
        {"type": "http.response.body", "body": b"made it"},
    ]
    assert Body.closed
