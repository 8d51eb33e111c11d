"""URL normalization: one spelling per page, for submissions and every redirect hop,
and one origin (scheme, host, port) per server, for everything keyed by who is called."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import ada_url

MAX_URL_LENGTH = 2048
# DNS names are at most 253 characters; a longer host can only be a mistake (and must
# not reach Page.domain, 255 characters).
MAX_HOST_LENGTH = 253
# The most a host spelled in ASCII without %-escapes grows by when normalized: an IPv4
# address written short is dotted (`2` is `0.0.0.2`, as WHATWG URLs and inet_aton read it).
MAX_HOST_GROWTH = 6
DEFAULT_PORTS = {"http": 80, "https": 443}


class InvalidURL(ValueError):
    """The submitted URL cannot be audited; the message says why."""


@dataclass(frozen=True)
class NormalizedURL:
    url: str
    domain: str


@dataclass(frozen=True)
class Origin:
    """Who a URL talks to: the key of its breaker, slots, rate-limit bucket and slow start.

    `host` is normalized (`normalize_host`); `port` is always there, the scheme's
    default filled in. `str()` is the WHATWG serialization (`http://example.org`,
    `http://example.org:8080`, `http://[::1]:8080`): one spelling, readable in the admin.
    """

    scheme: str
    host: str
    port: int

    def __str__(self) -> str:
        if self.port == DEFAULT_PORTS[self.scheme]:
            return f"{self.scheme}://{self.host}"
        return f"{self.scheme}://{self.host}:{self.port}"


def origin_of(url: str) -> Origin:
    """The origin of an http(s) URL, however its host is spelled (case, a trailing dot,
    Unicode or punycode, IPv4 and IPv6 forms). Raises InvalidURL."""
    scheme, host, port, _parts = _split(str(url))
    return Origin(scheme, host, port or DEFAULT_PORTS[scheme])


@functools.lru_cache(maxsize=4096)
def origin_key(url: str) -> str:
    """`str(origin_of(url))`: the one spelling every per-origin key is made of.

    Remembered per process for the last few thousand URLs: an outbound call asks it for
    its bucket and its slot, a task for its breaker, each parsing the URL through ada
    otherwise (a pure function of the string; an InvalidURL is raised again each time)."""
    return str(origin_of(url))


def origin_key_or_none(url: str) -> str | None:
    """`origin_key(url)`, or None for a stored URL that no longer parses (one accepted
    before hosts were read as WHATWG reads them): a breaker's key, where None means no
    breaker and the run fails on its own, saying why."""
    try:
        return origin_key(url)
    except InvalidURL:
        return None


def normalize_host(host: str) -> str:
    """A host as a browser resolves it (WHATWG URL, through ada: lowercase, IDNA
    A-labels by UTS 46, IPv4 numbers in dotted decimal, IPv6 compressed and
    bracketed), without the root's trailing dot: `Victim.COM.` is `victim.com`.

    `host` is a URL's host alone (urlsplit's `hostname`: an IPv6 address without
    brackets). Raises InvalidURL."""
    bracketed = f"[{host}]" if ":" in host else host
    try:
        parsed = ada_url.parse_url(f"http://{bracketed}/")
    except ValueError:
        raise InvalidURL("Has a host name that is not valid.") from None
    normalized = parsed["hostname"]
    # A character WHATWG reads as the end of the host ("\\") would move the rest elsewhere.
    if parsed["host"] != normalized or parsed["pathname"] != "/" or parsed["search"]:
        raise InvalidURL("Has a host name that is not valid.")
    if parsed["host_type"] == ada_url.HostType.DEFAULT:
        normalized = normalized.removesuffix(".")
        if "" in normalized.split("."):
            raise InvalidURL("Has a host name that is not valid.")
    return normalized


def normalize_url(raw: str) -> NormalizedURL:
    """One spelling per page: lowercase scheme and host, no default port, no fragment."""
    if not isinstance(raw, str):
        raise InvalidURL("Must be a string.")
    text = raw.strip()
    if not text:
        raise InvalidURL("Must not be empty.")
    if len(text) > MAX_URL_LENGTH:
        raise InvalidURL(f"Must be at most {MAX_URL_LENGTH} characters.")
    if any(ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in text):
        raise InvalidURL("Must not contain spaces or control characters.")
    scheme, host, port, parts = _split(text)
    if len(host) > MAX_HOST_LENGTH:
        raise InvalidURL(f"Has a host name longer than {MAX_HOST_LENGTH} characters.")
    netloc = host
    if port is not None and port != DEFAULT_PORTS[scheme]:
        netloc = f"{host}:{port}"
    if parts.username is not None:
        userinfo = parts.username + (f":{parts.password}" if parts.password is not None else "")
        netloc = f"{userinfo}@{netloc}"
    path = parts.path or "/"
    url = urlunsplit((scheme, netloc, path, parts.query, ""))
    if len(url) > MAX_URL_LENGTH:
        raise InvalidURL(f"Must be at most {MAX_URL_LENGTH} characters.")
    return NormalizedURL(url=url, domain=host)


def _split(text: str):
    """(scheme, normalized host, port or None, urlsplit's parts) of an http(s) URL."""
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise InvalidURL(f"Is not a valid URL ({exc}).") from None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise InvalidURL("Only http and https URLs can be audited.")
    if not parts.hostname:
        raise InvalidURL("Must include a host name.")
    return scheme, normalize_host(parts.hostname), port, parts
