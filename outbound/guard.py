"""The SSRF guard: no outbound connection reaches a private, loopback or link-local address."""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from concurrent.futures import Future

import httpcore

# IPv6 prefixes whose last 32 bits are an IPv4 address a gateway, a relay or the host's
# own stack may connect to: NAT64 (RFC 6052, and the local-use /48 of RFC 8215), the
# IPv4-compatible form (::a.b.c.d, deprecated but still parsed) and SIIT's
# IPv4-translated form (::ffff:0:a.b.c.d). ::ffff:a.b.c.d, 6to4 and Teredo have their
# own accessors in `ipaddress`.
_EMBEDS_IPV4_IN_LAST_32_BITS = [
    ipaddress.IPv6Network("64:ff9b::/96"),
    ipaddress.IPv6Network("64:ff9b:1::/48"),
    ipaddress.IPv6Network("::/96"),
    ipaddress.IPv6Network("::ffff:0:0:0/96"),
]


class TargetNotAllowed(Exception):
    """The target is, or resolves to, an address Plumb must not connect to.

    The message names the host that was refused and never the address it resolved to:
    it reaches the submitter (an audit's error, a delivery's), and an answer of the
    internal DNS is not theirs to read (OWASP SSRF prevention: no resolution oracle).
    """

    def __init__(self, host: str):
        super().__init__(f"{host} is not a public address: private, loopback and link-local "
                         "destinations are refused")  # fmt: skip
        self.host = host


def embedded_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address carries inside it (none for a plain one)."""
    found = [ip.ipv4_mapped, ip.sixtofour, *(ip.teredo or ())]
    for network in _EMBEDS_IPV4_IN_LAST_32_BITS:
        if ip in network:
            found.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    return [address for address in found if address is not None]


def _is_public(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    return ip.is_global and not ip.is_multicast


def is_public_address(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if ip.version == 6:
        # An IPv6 form of a private IPv4 address is as private as the address itself.
        return _is_public(ip) and all(_is_public(inner) for inner in embedded_ipv4(ip))
    return _is_public(ip)


def resolve(host: str, port: int, timeout: float | None) -> list[str]:
    """The addresses `host` resolves to, within `timeout`.

    getaddrinfo blocks for as long as the system resolver likes (resolv.conf's 5 s a
    try, times attempts, times nameservers) and cannot be interrupted, so it runs in a
    daemon thread of its own that this call stops waiting for at the timeout: a lookup
    is part of connecting, and the exchange's deadline covers it. A thread a lookup,
    not a pool: nothing to rebuild after a fork, and an abandoned lookup ends by itself
    at the resolver's own timeout.
    """
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        pass
    else:
        return [host]  # a literal address: nothing to look up
    answer: Future[list] = Future()

    def lookup() -> None:
        try:
            answer.set_result(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except OSError as exc:
            answer.set_exception(exc)

    threading.Thread(target=lookup, name="plumb-resolve", daemon=True).start()
    try:
        infos = answer.result(timeout)
    except TimeoutError:  # the wait's (an OSError too, so first)
        raise httpcore.ConnectTimeout(
            f"resolving {host} took longer than {timeout:.1f} s"
        ) from None
    except OSError as exc:
        # Raised here, in an except block, so the gaierror stays the failure's context
        # even after httpcore's pool re-raises it `from None`: a name that does not
        # exist (EAI_NONAME) is a broken link, not a retry (integrations.links).
        raise httpcore.ConnectError(f"cannot resolve {host}: {exc}") from exc
    addresses = [info[4][0] for info in infos]
    if not addresses:
        raise httpcore.ConnectError(f"cannot resolve {host}: no address")
    return addresses


class GuardedNetworkBackend(httpcore.SyncBackend):
    """Checks the address at connect time, not before: a DNS answer that changes
    between a check and the fetch (rebinding) is still caught, and so is every
    redirect hop, because each hop connects through here. The lookup itself is
    bounded by the connect timeout (`resolve`), private targets allowed or not."""

    def __init__(self, allow_private: bool):
        self.allow_private = allow_private

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        started = time.monotonic()
        addresses = resolve(host, port, timeout)
        if not self.allow_private and not all(map(is_public_address, addresses)):
            raise TargetNotAllowed(host)
        # Each address in the resolver's order, as socket.create_connection tries them
        # ("localhost" is ::1 first, and a server may listen on 127.0.0.1 only), within
        # what is left of the one timeout.
        for address in addresses:
            left = None if timeout is None else timeout - (time.monotonic() - started)
            if left is not None and left <= 0:
                raise httpcore.ConnectTimeout(f"connecting to {host} timed out")
            try:
                return super().connect_tcp(address, port, left, local_address, socket_options)
            except httpcore.ConnectError as exc:
                last_error = exc
        raise last_error
