"""The ASGI application gunicorn's `asgi` workers serve (`make run`, docker-compose).

An event loop reads each request's line, headers and body, so a client that trickles
them holds a socket, not a worker: with sync workers three such clients took /healthz
down (BENCHMARKS.md, "Slow clients"). The complete request then goes to Django's WSGI
handler in one of `WEB_THREADS` threads (config.wsgi_threads): one hop from the loop to
a thread and back, where Django's ASGI handler made several, half a submission's CPU.

A server reads a whole body before any view or setting looks at it, however large,
and gunicorn only gives up on a body after 30 s without a byte. `BoundedBody` reads
the body first: at most `API_MAX_BODY_BYTES` (no
request Plumb serves needs more), within `WEB_BODY_READ_TIMEOUT_SECONDS`, so a stalled
or endless upload costs one small buffer for a few seconds (BENCHMARKS.md, "Stalled
request bodies"; DECISIONS.md says what a WSGI server would need instead).
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import json
import os

from django.core.wsgi import get_wsgi_application

from config.wsgi_threads import WSGIThreads

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

django_wsgi_application = get_wsgi_application()

from django.conf import settings  # noqa: E402 (after Django is set up)


class BoundedBody:
    """Reads an HTTP request's body before the app sees it: over `max_bytes` (declared or
    counted) it answers 413, not all there within `timeout` seconds 408, each closing the
    connection without calling the app; otherwise the app gets the body as one message."""

    def __init__(self, app, max_bytes: int, timeout: float):
        self.app = app
        self.max_bytes = max_bytes
        self.timeout = timeout
        self._collection: asyncio.TimerHandle | None = None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await self._too_large(send)
        try:
            async with asyncio.timeout(self.timeout):
                message = await self._read_body(receive)
        except TimeoutError:
            self._collect_soon()
            return await _refuse(send, 408, "request_timeout",
                                 f"The request body did not arrive within {self.timeout:g} s.")  # fmt: skip
        if message is None:
            return await self._too_large(send)
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return message

        return await self.app(scope, replay, send)

    async def _read_body(self, receive) -> dict | None:
        """The whole body as one `http.request` message (or the disconnect that cut it
        short, for the app to see as it would); None past `max_bytes`."""
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return message
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}

    def _collect_soon(self):
        """Free, soon, what refused connections leave behind.

        gunicorn keeps what it read ahead of a refused body (up to 512 KiB) in a
        connection object that refers to itself, so it outlives the connection until
        Python's next full collection, which its thresholds put off for thousands of
        connections: 500 refusals kept 178 MB. One collection 0.2 s after a refusal (the
        server has closed the connection by then), at most five a second, frees it; then
        glibc gives the freed pages back."""
        if self._collection is None:
            self._collection = asyncio.get_running_loop().call_later(0.2, self._collect)

    def _collect(self):
        self._collection = None
        gc.collect()
        if malloc_trim is not None:
            malloc_trim(0)

    async def _too_large(self, send):
        self._collect_soon()
        await _refuse(send, 413, "payload_too_large",
                      f"Request body must be at most {self.max_bytes} bytes.")  # fmt: skip


async def _refuse(send, status: int, code: str, message: str):
    """The API's JSON error, on a connection the server then closes (the rest of the
    body is never read)."""
    body = json.dumps({"error": code, "message": message}).encode()
    await send({
        "type": "http.response.start", "status": status,
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ],
    })  # fmt: skip
    await send({"type": "http.response.body", "body": body})


# glibc's, where there is one (not musl): returns freed heap pages to the system.
malloc_trim = getattr(ctypes.CDLL(None), "malloc_trim", None)

application = BoundedBody(
    WSGIThreads(django_wsgi_application, settings.WEB_THREADS),
    settings.API_MAX_BODY_BYTES,
    settings.WEB_BODY_READ_TIMEOUT_SECONDS,
)
# What Django and the app built at start-up lives as long as the process: frozen, a full
# collection (BoundedBody._collect, and Python's own) walks only the rest, in tens of
# milliseconds instead of hundreds, the event loop waiting meanwhile.
gc.collect()
gc.freeze()
