"""What Plumb will audit: URL normalization and the private-address guard."""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import httpcore

MAX_URL_LENGTH = 2048
DEFAULT_PORTS = {"http": 80, "https": 443}


class InvalidURL(ValueError):
    """The submitted URL cannot be audited; the message says why."""


class TargetNotAllowed(Exception):
    """The target resolves to an address Plumb must not fetch from."""

    def __init__(self, host: str, address: str):
        super().__init__(f"{host} resolves to {address}, a private, loopback or link-local address")
        self.host = host
        self.address = address


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


def is_public_address(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if ip.version == 6 and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


class GuardedNetworkBackend(httpcore.SyncBackend):
    """Checks the address at connect time, not before: a DNS answer that changes
    between a check and the fetch (rebinding) is still caught, and so is every
    redirect hop, because each hop connects through here."""

    def __init__(self, allow_private: bool):
        self.allow_private = allow_private

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        if self.allow_private:
            return super().connect_tcp(host, port, timeout, local_address, socket_options)
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise httpcore.ConnectError(f"cannot resolve {host}: {exc}") from exc
        addresses = [info[4][0] for info in infos]
        for address in addresses:
            if not is_public_address(address):
                raise TargetNotAllowed(host, address)
        return super().connect_tcp(addresses[0], port, timeout, local_address, socket_options)
