"""URL normalization: one spelling per page, for submissions and every redirect hop."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

MAX_URL_LENGTH = 2048
# DNS names are at most 253 characters; a longer host can only be a mistake (and must
# not reach Page.domain, 255 characters).
MAX_HOST_LENGTH = 253
DEFAULT_PORTS = {"http": 80, "https": 443}


class InvalidURL(ValueError):
    """The submitted URL cannot be audited; the message says why."""


@dataclass(frozen=True)
class NormalizedURL:
    url: str
    domain: str


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
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise InvalidURL(f"Is not a valid URL ({exc}).") from None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise InvalidURL("Only http and https URLs can be audited.")
    host = parts.hostname
    if not host:
        raise InvalidURL("Must include a host name.")
    try:
        host = host.encode("idna").decode("ascii").lower() if not _is_ip(host) else host
    except UnicodeError:
        raise InvalidURL("Has a host name that is not valid.") from None
    if len(host) > MAX_HOST_LENGTH:
        raise InvalidURL(f"Has a host name longer than {MAX_HOST_LENGTH} characters.")
    host_for_netloc = f"[{host}]" if ":" in host else host
    netloc = host_for_netloc
    if port is not None and port != DEFAULT_PORTS[scheme]:
        netloc = f"{host_for_netloc}:{port}"
    if parts.username is not None:
        userinfo = parts.username + (f":{parts.password}" if parts.password is not None else "")
        netloc = f"{userinfo}@{netloc}"
    path = parts.path or "/"
    url = urlunsplit((scheme, netloc, path, parts.query, ""))
    if len(url) > MAX_URL_LENGTH:
        raise InvalidURL(f"Must be at most {MAX_URL_LENGTH} characters.")
    return NormalizedURL(url=url, domain=host)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
