"""The SSRF guard: no outbound connection reaches a private, loopback or link-local address."""

from __future__ import annotations

import ipaddress
import socket

import httpcore


class TargetNotAllowed(Exception):
    """The target resolves to an address Plumb must not connect to."""

    def __init__(self, host: str, address: str):
        super().__init__(f"{host} resolves to {address}, a private, loopback or link-local address")
        self.host = host
        self.address = address


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
