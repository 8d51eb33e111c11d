"""One origin per server: the key of breakers, slots, rate-limit buckets and slow starts."""

from __future__ import annotations

import pytest

from outbound.client import admission_key_for_url
from outbound.urls import InvalidURL, Origin, normalize_url, origin_key, origin_of


@pytest.mark.parametrize(
    ("url", "origin"),
    [
        # Case, and the root's trailing dot, are spellings of one host.
        ("http://victim.com/", "http://victim.com"),
        ("HTTP://Victim.COM./a?b#c", "http://victim.com"),
        ("http://victim.com.:80/", "http://victim.com"),
        ("http://LOCALHOST.:8080/", "http://localhost:8080"),
        # The scheme's default port is filled in, and left out of the spelling.
        ("https://victim.com:443/", "https://victim.com"),
        ("http://victim.com:443/", "http://victim.com:443"),
        ("https://victim.com:80/", "https://victim.com:80"),
        # Another port, or another scheme, is another origin.
        ("http://victim.com:27900/", "http://victim.com:27900"),
        ("https://victim.com/", "https://victim.com"),
        # IDNA as WHATWG URL parsing does it (UTS 46, not IDNA 2003's ß -> ss).
        ("http://BÜCHER.example./", "http://xn--bcher-kva.example"),
        ("http://xn--bcher-kva.example/", "http://xn--bcher-kva.example"),
        ("http://faß.de/", "http://xn--fa-hia.de"),
        ("http://ex%41mple.com/", "http://example.com"),
        # IPv4 in any form a browser accepts, one dotted-decimal spelling.
        ("http://127.0.0.1./", "http://127.0.0.1"),
        ("http://0x7f.1:8000/", "http://127.0.0.1:8000"),
        # IPv6 compressed, lowercase, always bracketed.
        ("http://[::1]:8080/", "http://[::1]:8080"),
        ("http://[0:0:0:0:0:0:0:1]/", "http://[::1]"),
        ("http://[::FFFF:1.2.3.4]:81/", "http://[::ffff:102:304]:81"),
        ("http://[2001:DB8::1]:443/", "http://[2001:db8::1]:443"),
        # Credentials are not part of who is called.
        ("http://user:pw@Victim.com.:81/", "http://victim.com:81"),
    ],
)
def test_every_spelling_of_an_origin_has_one_key(url, origin):
    assert origin_key(url) == origin


def test_the_origin_has_its_parts_and_the_default_port():
    assert origin_of("HTTPS://Victim.COM./x") == Origin("https", "victim.com", 443)
    assert origin_of("http://[::1]:8080/") == Origin("http", "[::1]", 8080)


@pytest.mark.parametrize(
    "url",
    [
        "ftp://victim.com/",
        "http:///path",
        "http://a..b/",
        "http://victim.com../",
        "http://./",
        "http://a\\b.com/",  # WHATWG ends the host at the backslash
        "http://exa<mple.com/",
        "http://victim.com:99999/",
        "http://[::1/",
    ],
)
def test_a_url_with_no_origin_is_refused(url):
    with pytest.raises(InvalidURL):
        origin_of(url)


def test_a_page_url_and_its_domain_use_the_origins_host():
    normalized = normalize_url("http://User@Victim.COM.:8080/a?b#c")
    assert normalized.url == "http://User@victim.com:8080/a?b"
    assert normalized.domain == "victim.com"
    assert normalize_url("http://[::FFFF:1.2.3.4]/").domain == "[::ffff:102:304]"
    assert normalize_url("http://victim.com.:80/").url == normalize_url("http://victim.com").url


def test_rate_limit_buckets_are_per_origin():
    assert admission_key_for_url("http://Victim.com.:8080/x") == "host:http://victim.com:8080"
    assert admission_key_for_url("http://victim.com/") != admission_key_for_url(
        "http://victim.com:8080/"
    )
    assert admission_key_for_url("http://victim.com/") != admission_key_for_url(
        "https://victim.com/"
    )
