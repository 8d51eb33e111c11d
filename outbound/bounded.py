"""Every exchange bounded: one deadline over connect, headers and body, and a cap on the
decoded body. `outbound.client.build_client` puts both under every client it makes.

httpx2's timeouts are per operation: a server that sends a header byte every few
seconds never trips a read timeout, and httpx2 inflates every chunk of a
`Content-Encoding: gzip, gzip` body whole, through every stacked coding (1,827 bytes
on the wire became 1 GiB). So:

- `DeadlineBackend` wraps the connection pool's network backend: every connect, TLS
  handshake, read and write gets at most the time left before the exchange's
  deadline, and none once it has passed (httpcore2 raises its own timeout errors,
  which httpx2 maps to `httpx2.TimeoutException`). The deadline reaches the socket
  through a context variable set around each step of the exchange: httpx2's sync
  client does all of a request's I/O in the calling thread.
- `BoundedTransport` sets that deadline (the request's `plumb_deadline` extension,
  or the client's whole timeout from now, whichever is sooner) and decodes the body
  itself from the raw bytes: at most `max_codings` stacked codings (gzip, deflate),
  each inflated through `zlib.decompressobj` in pieces of at most CHUNK_BYTES, and the
  decoded bytes cut at the body cap (the request's `plumb_max_body_bytes`, or the
  client's). It removes Content-Encoding (and the encoded Content-Length) so httpx2
  decodes nothing again, keeps the codings in the response's `plumb_content_encoding`
  extension and sets `plumb_truncated` when the cap cut the body.

A coding Plumb does not decode, or more codings than allowed, raises
`httpx2.DecodingError` when the body is read: the status and headers stay usable.
"""

from __future__ import annotations

import contextvars
import itertools
import math
import time
import zlib
from collections.abc import Callable, Iterable, Iterator

import httpcore2
import httpx2

# Request extensions: when the exchange must be over (time.monotonic()), and the cap
# on its decoded body; response extensions: the codings decoded, and whether the
# cap cut the body.
DEADLINE = "plumb_deadline"
MAX_BODY_BYTES = "plumb_max_body_bytes"
CONTENT_ENCODING = "plumb_content_encoding"
TRUNCATED = "plumb_truncated"

# The most one inflate step produces: the memory a body costs beyond the caller's
# own copy, whatever its compression ratio.
CHUNK_BYTES = 64 * 1024
IDENTITY = "identity"


def accept_encoding(max_codings: int) -> str:
    """What to ask for: the codings decoded here, or none at all."""
    return "gzip, deflate" if max_codings > 0 else IDENTITY


# --- The deadline at the socket ------------------------------------------------------

_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "outbound_deadline", default=None
)


def _within_deadline(timeout: float | None, error: type[Exception]) -> float | None:
    """`timeout`, shortened to the time left before the exchange's deadline."""
    deadline = _deadline.get()
    if deadline is None:
        return timeout
    left = deadline - time.monotonic()
    if left <= 0:
        raise error("the exchange's deadline passed")
    return left if timeout is None else min(timeout, left)


class DeadlineStream(httpcore2.NetworkStream):
    def __init__(self, stream: httpcore2.NetworkStream):
        self._stream = stream

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max_bytes, _within_deadline(timeout, httpcore2.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._stream.write(buffer, _within_deadline(timeout, httpcore2.WriteTimeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(self, ssl_context, server_hostname=None, timeout=None):
        timeout = _within_deadline(timeout, httpcore2.ConnectTimeout)
        return DeadlineStream(self._stream.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str):
        return self._stream.get_extra_info(info)


class DeadlineBackend(httpcore2.NetworkBackend):
    """Wraps a network backend (the SSRF guard's) so every stream minds the deadline."""

    def __init__(self, backend: httpcore2.NetworkBackend):
        self._backend = backend

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        timeout = _within_deadline(timeout, httpcore2.ConnectTimeout)
        stream = self._backend.connect_tcp(host, port, timeout, local_address, socket_options)
        return DeadlineStream(stream)

    def connect_unix_socket(self, path, timeout=None, socket_options=None):
        timeout = _within_deadline(timeout, httpcore2.ConnectTimeout)
        return DeadlineStream(self._backend.connect_unix_socket(path, timeout, socket_options))

    def sleep(self, seconds: float) -> None:
        self._backend.sleep(seconds)


# --- Decoding, bounded -----------------------------------------------------------------


def _inflate(chunks: Iterable[bytes], wbits: int, check: Callable[[], None]) -> Iterator[bytes]:
    """Inflate lazily: each step takes only the input it needs for CHUNK_BYTES of output
    (the rest waits in `unconsumed_tail`), so nothing ever holds more than that."""
    decoder = zlib.decompressobj(wbits)
    for chunk in chunks:
        data = chunk
        while data and not decoder.eof:
            check()
            out = decoder.decompress(data, CHUNK_BYTES)
            data = decoder.unconsumed_tail
            if out:
                yield out
        if decoder.eof:
            return  # whatever follows the stream is ignored, as httpx2 does
    # Output zlib still holds once the input is used up, a piece at a time.
    while not decoder.eof:
        check()
        out = decoder.decompress(b"", CHUNK_BYTES)
        if not out:
            break
        yield out


def _gzip(chunks: Iterable[bytes], check: Callable[[], None]) -> Iterator[bytes]:
    return _inflate(chunks, zlib.MAX_WBITS | 16, check)


def _deflate(chunks: Iterable[bytes], check: Callable[[], None]) -> Iterator[bytes]:
    """`deflate` is meant to be zlib-wrapped, but servers send raw deflate too (httpx2
    and browsers accept both): the first bytes say which."""
    chunks = iter(chunks)
    first = b""
    for first in chunks:
        if first:
            break
    try:
        zlib.decompressobj().decompress(first, 1)
        wbits = zlib.MAX_WBITS
    except zlib.error:
        wbits = -zlib.MAX_WBITS
    return _inflate(itertools.chain([first], chunks), wbits, check)


DECODERS = {"gzip": _gzip, "x-gzip": _gzip, "deflate": _deflate}


def content_codings(headers: httpx2.Headers) -> list[str]:
    """The codings applied to the body, in the order they were applied."""
    codings = [c.strip().lower() for c in headers.get_list("content-encoding", split_commas=True)]
    return [c for c in codings if c and c != IDENTITY]


class BoundedBody(httpx2.SyncByteStream):
    """The body decoded from the raw stream, cut at `max_bytes`, ended at `deadline`."""

    def __init__(
        self,
        raw: httpx2.SyncByteStream,
        *,
        codings: list[str],
        max_codings: int,
        max_bytes: int,
        deadline: float,
        extensions: dict,
    ):
        self._raw = raw
        self.codings = codings
        self.max_codings = max_codings
        self.max_bytes = max_bytes
        self.deadline = deadline
        self.extensions = extensions

    def _check(self) -> None:
        if time.monotonic() > self.deadline:
            raise httpx2.ReadTimeout("the exchange's deadline passed while reading the body")

    def _raw_chunks(self) -> Iterator[bytes]:
        chunks = iter(self._raw)
        while True:
            # Each read waits at most until the deadline (DeadlineStream).
            token = _deadline.set(self.deadline)
            try:
                chunk = next(chunks, None)
            finally:
                _deadline.reset(token)
            if chunk is None:
                return
            self._check()
            yield chunk

    def _refusal(self) -> str | None:
        if len(self.codings) > self.max_codings:
            return (
                f"Content-Encoding {', '.join(self.codings)!r} stacks {len(self.codings)} "
                f"codings; at most {self.max_codings} are decoded"
            )
        unknown = [c for c in self.codings if c not in DECODERS]
        if unknown:
            return f"Content-Encoding {', '.join(unknown)!r} is not one Plumb decodes"
        return None

    def __iter__(self) -> Iterator[bytes]:
        refusal = self._refusal()
        if refusal is not None:
            raise httpx2.DecodingError(refusal)
        decoded: Iterable[bytes] = self._raw_chunks()
        for coding in reversed(self.codings):  # the last applied is undone first
            decoded = DECODERS[coding](decoded, self._check)
        room = self.max_bytes
        try:
            for chunk in decoded:
                self._check()
                if len(chunk) > room:
                    if room:
                        yield chunk[:room]
                    self.extensions[TRUNCATED] = True
                    return
                room -= len(chunk)
                yield chunk
        except zlib.error as exc:
            raise httpx2.DecodingError(f"cannot decode the {self.codings} body: {exc}") from None

    def close(self) -> None:
        self._raw.close()


class BoundedTransport(httpx2.BaseTransport):
    """An httpx2 transport whose every exchange has a deadline and a bounded decoded body."""

    def __init__(
        self,
        transport: httpx2.BaseTransport,
        *,
        total_seconds: float,
        max_body_bytes: int,
        max_codings: int,
    ):
        self._transport = transport
        self.total_seconds = total_seconds
        self.max_body_bytes = max_body_bytes
        self.max_codings = max_codings

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        deadline = min(
            request.extensions.get(DEADLINE, math.inf), time.monotonic() + self.total_seconds
        )
        left = deadline - time.monotonic()
        if left <= 0:
            raise httpx2.ConnectTimeout("the exchange's deadline passed before it started")
        # Waiting for a pooled connection is bounded by the deadline too.
        request.extensions["timeout"] = {
            name: left if value is None else min(value, left)
            for name, value in request.extensions.get("timeout", {}).items()
        }
        token = _deadline.set(deadline)
        try:
            response = self._transport.handle_request(request)
        finally:
            _deadline.reset(token)
        codings = content_codings(response.headers)
        if codings:
            response.extensions[CONTENT_ENCODING] = codings
            # The body below is decoded: httpx2 must not decode it again, and the
            # encoded length no longer describes it.
            del response.headers["content-encoding"]
            if "content-length" in response.headers:
                del response.headers["content-length"]
        response.stream = BoundedBody(
            response.stream,
            codings=codings,
            max_codings=self.max_codings,
            max_bytes=request.extensions.get(MAX_BODY_BYTES, self.max_body_bytes),
            deadline=deadline,
            extensions=response.extensions,
        )
        return response

    def close(self) -> None:
        self._transport.close()
