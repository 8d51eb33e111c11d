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
