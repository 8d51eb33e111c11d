"""The SSRF guard: no outbound connection reaches a private, loopback or link-local address."""

from __future__ import annotations

import ipaddress
import os
import queue
import socket
import threading
import time
from concurrent.futures import Future

import httpcore2

# Which addresses are public is decided by this table, not by `ipaddress`'s is_global:
# its tables change between Python releases (3.11.7 takes fec0::/10 and 192.0.0.8 as
# global; later releases rewrote them). Each row is an entry of IANA's registries
# with its "Globally Reachable" column; the most specific row that holds an address
# decides, an address no row holds is public (IPv4) or public only inside 2000::/3,
# IANA's Global Unicast space (IPv6: fec0::/10, site-local, deprecated by RFC 3879, and
# ff00::/8, multicast, are outside it, as is every block reserved by the IETF).
#   IPv4: https://www.iana.org/assignments/iana-ipv4-special-registry/
#         plus 224.0.0.0/4 from the IPv4 Address Space Registry (multicast).
#   IPv6: https://www.iana.org/assignments/iana-ipv6-special-registry/ (2024-10-22), and
#         https://www.iana.org/assignments/ipv6-address-space/ for 2000::/3.
# A row IANA adds outside 2000::/3 is refused already; one inside it needs a row here.
# Rows whose column is N/A: 192.88.99.0/24 (6to4 relay anycast, deprecated by RFC 7526)
# is refused; 2002::/16 (6to4) and 2001::/32 (Teredo) are judged as the other rows
# say (6to4 by the IPv4 address inside it, Teredo inside the refused 2001::/23).
_IPV4_REGISTRY = [
    ("0.0.0.0/8", False),  # "this network", 0.0.0.0/32 "this host" inside it
    ("10.0.0.0/8", False),  # private use
    ("100.64.0.0/10", False),  # shared address space (carrier-grade NAT)
    ("127.0.0.0/8", False),  # loopback
    ("169.254.0.0/16", False),  # link local (cloud metadata services)
    ("172.16.0.0/12", False),  # private use
    ("192.0.0.0/24", False),  # IETF protocol assignments (192.0.0.0/29 DS-Lite, .8 dummy)
    ("192.0.0.9/32", True),  # port control protocol anycast
    ("192.0.0.10/32", True),  # TURN anycast
    ("192.0.0.170/32", False),  # NAT64/DNS64 discovery
    ("192.0.0.171/32", False),  # NAT64/DNS64 discovery
    ("192.0.2.0/24", False),  # documentation (TEST-NET-1)
    ("192.31.196.0/24", True),  # AS112-v4
    ("192.52.193.0/24", True),  # AMT
    ("192.88.99.0/24", False),  # 6to4 relay anycast, deprecated
    ("192.168.0.0/16", False),  # private use
    ("192.175.48.0/24", True),  # AS112 direct delegation
    ("198.18.0.0/15", False),  # benchmarking
    ("198.51.100.0/24", False),  # documentation (TEST-NET-2)
    ("203.0.113.0/24", False),  # documentation (TEST-NET-3)
    ("224.0.0.0/4", False),  # multicast (IPv4 Address Space Registry)
    ("240.0.0.0/4", False),  # reserved, 255.255.255.255/32 limited broadcast inside it
]
_IPV6_REGISTRY = [
    ("::/128", False),  # unspecified
    ("::1/128", False),  # loopback
    ("::ffff:0:0/96", False),  # IPv4-mapped
    ("64:ff9b::/96", True),  # IPv4-IPv6 translation (NAT64): by the IPv4 inside, below
    ("64:ff9b:1::/48", False),  # IPv4-IPv6 translation, local use
    ("100::/64", False),  # discard-only
    ("2001::/23", False),  # IETF protocol assignments (Teredo 2001::/32 inside)
    ("2001:1::1/128", True),  # port control protocol anycast
    ("2001:1::2/128", True),  # TURN anycast
    ("2001:2::/48", False),  # benchmarking
    ("2001:3::/32", True),  # AMT
    ("2001:4:112::/48", True),  # AS112-v6
    ("2001:20::/28", True),  # ORCHIDv2
    ("2001:30::/28", True),  # drone remote ID entity tags
    ("2001:db8::/32", False),  # documentation
    ("2620:4f:8000::/48", True),  # AS112 direct delegation
    ("3fff::/20", False),  # documentation
    ("5f00::/16", False),  # segment routing (SRv6) SIDs
    ("fc00::/7", False),  # unique local
    ("fe80::/10", False),  # link-local unicast
]
_IPV6_GLOBAL_UNICAST = ipaddress.IPv6Network("2000::/3")


def _registry(
    rows: list[tuple[str, bool]],
) -> list[tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, bool]]:
    # Most specific first: the first row that holds an address decides.
    networks = [(ipaddress.ip_network(network), reachable) for network, reachable in rows]
    return sorted(networks, key=lambda row: row[0].prefixlen, reverse=True)


_SPECIAL_PURPOSE = {4: _registry(_IPV4_REGISTRY), 6: _registry(_IPV6_REGISTRY)}

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
    for network, globally_reachable in _SPECIAL_PURPOSE[ip.version]:
        if ip in network:
            return globally_reachable
    return ip.version == 4 or ip in _IPV6_GLOBAL_UNICAST


def is_public_address(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if ip.version == 6:
        # An IPv6 form of a private IPv4 address is as private as the address itself.
        return _is_public(ip) and all(_is_public(inner) for inner in embedded_ipv4(ip))
    return _is_public(ip)


class LookupThreads:
    """The threads that run this process's name lookups (getaddrinfo), each kept for the
    next lookup once its own is answered.

    A thread started for every lookup cost about 200 us of CPU a lookup on the 2-core VM,
    a sixth of a page fetch by name (bench/dns_lookups.py). A lookup takes an idle thread
    when there is one and starts a new one only when there is none, so no lookup ever
    waits behind another: one the resolver never answers holds its own thread until the
    resolver's own timeout, as before (a pool of a fixed size would queue every name
    behind the hung ones). A thread idle for `idle_seconds` ends.
    """

    def __init__(self, idle_seconds: float = 60.0):
        self.idle_seconds = idle_seconds
        self._lock = threading.Lock()
        # The inbox of each thread waiting for a lookup, the most recently idle last.
        self._idle: list[queue.SimpleQueue] = []

    def lookup(self, host: str, port: int) -> Future[list]:
        """getaddrinfo's answer for (host, port) as it comes, from a thread of its own."""
        answer: Future[list] = Future()
        with self._lock:
            inbox = self._idle.pop() if self._idle else None
        if inbox is None:
            inbox = queue.SimpleQueue()
            threading.Thread(target=self._serve, args=(inbox,), name="plumb-resolve",
                             daemon=True).start()  # fmt: skip
        inbox.put((host, port, answer))
        return answer

    def idle(self) -> int:
        """Threads waiting for a lookup."""
        with self._lock:
            return len(self._idle)

    def _serve(self, inbox: queue.SimpleQueue) -> None:
        while True:
            try:
                host, port, answer = inbox.get(timeout=self.idle_seconds)
            except queue.Empty:
                with self._lock:
                    if any(waiting is inbox for waiting in self._idle):
                        self._idle.remove(inbox)
                        return
                continue  # taken for a lookup just as it gave up waiting: serve it
            try:
                answer.set_result(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
            except Exception as exc:  # the caller's to judge; this thread serves on
                answer.set_exception(exc)
            with self._lock:
                self._idle.append(inbox)


_lookups = LookupThreads()


def _forget_inherited_lookup_threads() -> None:
    # A forked child has none of its parent's threads: it starts its own.
    global _lookups
    _lookups = LookupThreads(_lookups.idle_seconds)


os.register_at_fork(after_in_child=_forget_inherited_lookup_threads)


def lookup_threads() -> LookupThreads:
    """This process's LookupThreads."""
    return _lookups


def resolve(host: str, port: int, timeout: float | None) -> list[str]:
    """The addresses `host` resolves to, within `timeout`.

    getaddrinfo blocks for as long as the system resolver likes (resolv.conf's 5 s a
    try, times attempts, times nameservers) and cannot be interrupted, so it runs in
    another thread (LookupThreads) that this call stops waiting for at the timeout: a
    lookup is part of connecting, and the exchange's deadline covers it. An abandoned
    lookup ends by itself at the resolver's own timeout, holding no other lookup up.
    """
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        pass
    else:
        return [host]  # a literal address: nothing to look up
    answer = _lookups.lookup(host, port)
    try:
        infos = answer.result(timeout)
    except TimeoutError:  # the wait's (an OSError too, so first)
        raise httpcore2.ConnectTimeout(
            f"resolving {host} took longer than {timeout:.1f} s"
        ) from None
    except Exception as exc:
        # Raised here, in an except block, so the gaierror stays the failure's context
        # even after httpcore2's pool re-raises it `from None`: a name that does not
        # exist (EAI_NONAME) is a broken link, not a retry (integrations.links).
        raise httpcore2.ConnectError(f"cannot resolve {host}: {exc}") from exc
    addresses = [info[4][0] for info in infos]
    if not addresses:
        raise httpcore2.ConnectError(f"cannot resolve {host}: no address")
    return addresses


class GuardedNetworkBackend(httpcore2.SyncBackend):
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
                raise httpcore2.ConnectTimeout(f"connecting to {host} timed out")
            try:
                return super().connect_tcp(address, port, left, local_address, socket_options)
            except httpcore2.ConnectError as exc:
                last_error = exc
        raise last_error
