"""An ASGI application that runs a WSGI application in threads, one hop a request.

gunicorn's ASGI worker reads each request on its event loop (a slow client holds a
socket, not a thread); this hands the complete request to a WSGI application in a pool
of threads and sends back its whole response. Django's own ASGI handler crossed from
the loop to a thread and back several times a request (the request signals, each sync
middleware, the view: `sync_to_async`), and that was half of a submission's CPU
(DECISIONS.md, "The web hands complete requests to Django's WSGI handler in threads").

Plumb's responses are small (JSON, HTML pages, static files that whitenoise serves from
memory or disk), so a response is collected in the thread and sent in one message.
Nothing here imports Django: bench/reference/minimal_submit.py serves its view the
same way.
"""

from __future__ import annotations

import asyncio
import io
import sys
from concurrent.futures import ThreadPoolExecutor


class WSGIThreads:
    """Serve `wsgi_app` to ASGI HTTP requests from `threads` threads."""

    def __init__(self, wsgi_app, threads: int):
        self.wsgi_app = wsgi_app
        self.threads = threads
        # Made on first use, in the worker process: a pool made before gunicorn forks
        # (preload_app) would have no threads in the child.
        self._pool: ThreadPoolExecutor | None = None

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            return await _lifespan(receive, send)
        if scope["type"] != "http":
            raise ValueError(f"unsupported ASGI scope {scope['type']!r}")
        body = await _read_body(receive)
        if body is None:
            return  # the client went away before its request was complete
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="wsgi")
        environ = wsgi_environ(scope, body)
        loop = asyncio.get_running_loop()
        status, headers, content = await loop.run_in_executor(self._pool, self._run, environ)
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": content})

    def _run(self, environ: dict) -> tuple[int, list, bytes]:
        started: list = []

        def start_response(status, response_headers, exc_info=None):
            if exc_info and started:
                raise exc_info[1].with_traceback(exc_info[2])
            started[:] = [status, response_headers]
            return _no_write

        result = self.wsgi_app(environ, start_response)
        try:
            content = b"".join(result)
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()
        status, response_headers = started
        headers = [(name.lower().encode("latin-1"), value.encode("latin-1"))
                   for name, value in response_headers]  # fmt: skip
        return int(status.split(" ", 1)[0]), headers, content


def _no_write(data: bytes) -> None:
    raise NotImplementedError("write() is not supported; return the body instead")


async def _read_body(receive) -> bytes | None:
    """The request's whole body (config.asgi.BoundedBody has bounded it in front)."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _lifespan(receive, send):
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def wsgi_environ(scope: dict, body: bytes) -> dict:
    """PEP 3333's environ for an ASGI HTTP scope and its complete body."""
    server = scope.get("server") or ("localhost", 80)
    client = scope.get("client")
    environ = {
        "REQUEST_METHOD": scope["method"],
        # WSGI's strings are bytes decoded as latin-1; Django encodes them back.
        "SCRIPT_NAME": scope.get("root_path", "").encode("utf-8").decode("latin-1"),
        "PATH_INFO": scope["path"].encode("utf-8").decode("latin-1"),
        "QUERY_STRING": scope.get("query_string", b"").decode("latin-1"),
        "SERVER_NAME": str(server[0]),
        "SERVER_PORT": str(server[1] if server[1] is not None else 80),
        "SERVER_PROTOCOL": f"HTTP/{scope.get('http_version', '1.1')}",
        "CONTENT_LENGTH": str(len(body)),
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": scope.get("scheme", "http"),
        "wsgi.input": io.BytesIO(body),
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
    }
    if client:
        environ.update(REMOTE_ADDR=client[0], REMOTE_PORT=str(client[1]))
    for raw_name, raw_value in scope.get("headers", []):
        name = raw_name.decode("latin-1").upper()
        if "_" in name:
            continue  # as gunicorn drops them: X_Forwarded_For must not pass as X-Forwarded-For
        name = name.replace("-", "_")
        value = raw_value.decode("latin-1")
        if name == "CONTENT_LENGTH":
            continue  # the body's own length, above
        if name != "CONTENT_TYPE":
            name = "HTTP_" + name
        # Repeated headers are joined, as a WSGI server does (cookies with "; ").
        if name in environ:
            environ[name] += ("; " if name == "HTTP_COOKIE" else ",") + value
        else:
            environ[name] = value
    return environ
