"""Audits never reach private addresses unless AUDIT_ALLOW_PRIVATE_TARGETS is on."""

from __future__ import annotations

import ipaddress

import pytest

from devstack import demo_site
from devstack.demo_site import DemoSite
from jobs.errors import Permanent
from outbound import guard
from outbound.integrations.page import fetch_page

# Every fetch reads its host's rate-limit observations, which fall back to the database.
pytestmark = pytest.mark.django_db


def fetch(url: str, *, allow_private: bool):
    return fetch_page(
        url, timeout=5, max_bytes=100_000, user_agent="PlumbTest/1", allow_private=allow_private
    )


@pytest.mark.parametrize(
    "address",
    ["127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254", "::1", "fe80::1",
     "fc00::1", "0.0.0.0", "100.64.0.1", "::ffff:127.0.0.1", "224.0.0.1"],
)  # fmt: skip
def test_private_loopback_link_local_and_metadata_addresses_are_not_public(address):
    assert guard.is_public_address(address) is False


@pytest.mark.parametrize("address", ["93.184.215.14", "2606:2800:21f:cb07:6820:80da:af6b:8b2c"])
def test_public_addresses_are_public(address):
    assert guard.is_public_address(address) is True


# One address in each non-global entry of IANA's special-purpose registries (and the IPv6
# blocks outside 2000::/3, Global Unicast), each the guard's decision whatever the Python
# version's `ipaddress` tables say: 3.11.7's got 15 of these wrong, 192.0.0.8 and fec0::1
# taken as public, the IPv6 anycast and AMT addresses refused among them.
NOT_GLOBALLY_REACHABLE = {
    "this network": "0.1.2.3",
    "private use 10/8": "10.255.0.1",
    "shared address space": "100.127.255.254",
    "loopback": "127.8.8.8",
    "link local": "169.254.0.1",
    "private use 172.16/12": "172.31.255.255",
    "IETF protocol assignments": "192.0.0.200",
    "service continuity (DS-Lite)": "192.0.0.1",
    "IPv4 dummy address": "192.0.0.8",
    "NAT64/DNS64 discovery": "192.0.0.171",
    "TEST-NET-1": "192.0.2.1",
    "6to4 relay anycast, deprecated": "192.88.99.1",
    "private use 192.168/16": "192.168.0.1",
    "benchmarking": "198.19.255.1",
    "TEST-NET-2": "198.51.100.7",
    "TEST-NET-3": "203.0.113.7",
    "multicast": "239.255.255.250",
    "reserved": "240.0.0.1",
    "limited broadcast": "255.255.255.255",
    "unspecified": "::",
    "IPv4-mapped of a public address": "::ffff:8.8.8.8",
    "NAT64 local use": "64:ff9b:1::808:808",
    "discard-only": "100::1",
    "IETF protocol assignments 2001::/23": "2001:1ff::1",
    "TURN anycast's neighbour": "2001:1::4",
    "Teredo": "2001:0:808:808::1",
    "benchmarking 2001:2::/48": "2001:2::1",
    "ORCHID, deprecated": "2001:10::1",
    "documentation 2001:db8::/32": "2001:db8::1",
    "documentation 3fff::/20": "3fff:fff::1",
    "segment routing SIDs": "5f00::1",
    "unique local": "fd12:3456::1",
    "link-local": "febf::1",
    "site-local, deprecated": "fec0::1",
    "multicast ff00::/8": "ff02::1",
    "reserved by the IETF 4000::/3": "4000::1",
}
GLOBALLY_REACHABLE = {
    "a public IPv4 address": "93.184.215.14",
    "port control protocol anycast": "192.0.0.9",
    "TURN anycast": "192.0.0.10",
    "AS112-v4": "192.31.196.1",
    "AMT": "192.52.193.1",
    "AS112 direct delegation": "192.175.48.1",
    "public next to shared address space": "100.128.0.1",
    "public next to benchmarking": "198.20.0.1",
    "a public IPv6 address": "2606:2800:21f:cb07:6820:80da:af6b:8b2c",
    "PCP anycast v6": "2001:1::1",
    "TURN anycast v6": "2001:1::2",
    "AMT v6": "2001:3::1",
    "AS112-v6": "2001:4:112::1",
    "ORCHIDv2": "2001:20::1",
    "drone remote ID entity tags": "2001:30::1",
    "AS112 direct delegation v6": "2620:4f:8000::1",
    "public next to documentation 3fff::/20": "3fff:1000::1",
}


@pytest.mark.parametrize(
    "address", NOT_GLOBALLY_REACHABLE.values(), ids=NOT_GLOBALLY_REACHABLE.keys()
)
def test_every_special_purpose_range_that_is_not_globally_reachable_is_refused(address):
    assert guard.is_public_address(address) is False


@pytest.mark.parametrize("address", GLOBALLY_REACHABLE.values(), ids=GLOBALLY_REACHABLE.keys())
def test_globally_reachable_addresses_stay_public(address):
    assert guard.is_public_address(address) is True


def test_a_name_that_resolves_to_loopback_is_refused_without_saying_what_it_resolves_to(site):
    with pytest.raises(Permanent, match="localhost is not a public address") as refused:
        fetch(site.base_url.replace("127.0.0.1", "localhost") + "/", allow_private=False)
    # The refusal reaches the submitter: no answer of the internal DNS goes with it.
    assert "127.0.0.1" not in str(refused.value)
    assert "::1" not in str(refused.value)


@pytest.mark.parametrize(
    "address",
    [
        "64:ff9b::7f00:1",  # NAT64 of 127.0.0.1
        "64:ff9b::a9fe:a9fe",  # NAT64 of the metadata address 169.254.169.254
        "64:ff9b:1::a00:1",  # local-use NAT64 of 10.0.0.1
        "2002:7f00:1::",  # 6to4 of 127.0.0.1
        "2002:c0a8:101::1",  # 6to4 of 192.168.1.1
        "::127.0.0.1",  # IPv4-compatible
        "::169.254.169.254",
        "::ffff:0:127.0.0.1",  # IPv4-translated (SIIT)
        "2001:0:4136:e378:8000:63bf:80ff:fffe",  # Teredo with client 127.0.0.1
    ],
)
def test_ipv6_forms_that_embed_a_private_ipv4_address_are_not_public(address):
    assert guard.is_public_address(address) is False


@pytest.mark.parametrize("address", ["64:ff9b::808:808", "2002:808:808::1"])
def test_ipv6_forms_that_embed_a_public_ipv4_address_stay_public(address):
    assert guard.is_public_address(address) is True


def test_a_redirect_to_a_private_address_is_refused_at_that_hop(monkeypatch):
    """The first hop is allowed; the redirect target is checked when it connects."""
    inner = DemoSite(host="127.0.0.2").start()
    outer = DemoSite(host="127.0.0.1").start()
    try:
        # Pretend 127.0.0.1 is a public address and 127.0.0.2 the private one.
        monkeypatch.setattr(
            guard,
            "is_public_address",
            lambda a: ipaddress.ip_address(a) == ipaddress.ip_address("127.0.0.1"),
        )
        redirecting = f"{outer.base_url}/out?to={inner.base_url}/"

        def out(handler, query):
            handler._redirect(302, query["to"])

        monkeypatch.setitem(demo_site.ROUTES, "/out", out)
        with pytest.raises(Permanent, match="127.0.0.2"):
            fetch(redirecting, allow_private=False)
        assert outer.hits["/out"] == 1
        assert inner.hits["/"] == 0
    finally:
        inner.stop()
        outer.stop()


def test_the_guard_connects_to_the_address_it_checked(monkeypatch, site):
    """A DNS answer that changes after the check cannot redirect the connection."""
    answers = iter([["127.0.0.1"], ["10.0.0.1"]])
    seen: list[str] = []
    real_getaddrinfo = guard.socket.getaddrinfo

    def rebinding_getaddrinfo(host, port, *args, **kwargs):
        if host == "rebind.test":
            addresses = next(answers)
            seen.extend(addresses)
            return [(2, 1, 6, "", (a, port)) for a in addresses]
        return real_getaddrinfo(host, port, *args, **kwargs)

    monkeypatch.setattr(guard.socket, "getaddrinfo", rebinding_getaddrinfo)
    monkeypatch.setattr(guard, "is_public_address", lambda a: a == "127.0.0.1")
    port = site.server_address[1]
    page = fetch(f"http://rebind.test:{port}/", allow_private=False)
    # One resolution, and the connection went to the vetted address.
    assert page.status_code == 200
    assert seen == ["127.0.0.1"]
