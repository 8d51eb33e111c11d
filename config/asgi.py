"""The ASGI application gunicorn's `asgi` workers serve (`make run`, docker-compose).

An event loop reads each request's line, headers and body, so a client that trickles
them holds a socket, not a worker: with sync workers three such clients took /healthz
down (BENCHMARKS.md, "Slow clients"). Django's views stay synchronous.

Django's ASGI handler reads a whole body into a temporary file before any view or
setting looks at it, however large; `BoundedBody` refuses one over
`ASGI_MAX_BODY_BYTES` first, so an endless or huge upload costs neither memory nor disk.
"""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

django_application = get_asgi_application()

from django.conf import settings  # noqa: E402 (after Django is set up)

TOO_LARGE = b'{"error": "payload_too_large", "detail": "Request body is too large."}'


class BoundedBody:
    """Reads an HTTP request's body (at most `max_bytes`) before the app sees it;
    past that, answers 413 and never calls the app."""

    def __init__(self, app, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await self._refuse(send)
        messages, size = [], 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break  # a disconnect: the app sees it as it would
            size += len(message.get("body", b""))
            if size > self.max_bytes:
                return await self._refuse(send)
            if not message.get("more_body", False):
                break

        async def replay():
            return messages.pop(0) if messages else await receive()

        return await self.app(scope, replay, send)

    @staticmethod
    async def _refuse(send):
        await send({
            "type": "http.response.start", "status": 413,
            "headers": [(b"content-type", b"application/json"), (b"connection", b"close")],
        })  # fmt: skip
        await send({"type": "http.response.body", "body": TOO_LARGE})


application = BoundedBody(django_application, settings.ASGI_MAX_BODY_BYTES)
