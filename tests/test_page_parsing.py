"""The analysis reads a page the way a browser does: bytes to text by the WHATWG sniffing
order, `document.title`, links resolved as WHATWG URLs; and whatever a page holds, what
it gives is bounded (issues 24 and 26)."""

from __future__ import annotations

import os
import random

import pytest

from audits.analysis import (
    _lexbor_input,
    analyze_html,
    decode_page,
    decoded_chunks,
    resolve_link,
    sniff_encoding,
)
from outbound.urls import MAX_URL_LENGTH
from tests.html_corpus import CorpusUnavailable, corpus_pages
from tests.html_reference import browser_fields

PAGE = "https://www.example.org/articles/one"
FIELDS = ["title", "meta_description", "canonical", "noindex", "h1_count", "external_links"]


def analyze(body: bytes | str, *, charset: str | None = None, url: str = PAGE) -> dict:
    if isinstance(body, str):
        body = body.encode()
    return analyze_html(body, base_url=url, charset=charset)


# --- The corpus: 30 real pages, compared field by field with html5lib -----------------


def test_it_reads_real_pages_as_a_browser_does(settings):
    try:
        pages = corpus_pages()
    except CorpusUnavailable as exc:
        pytest.skip(f"the page corpus could not be downloaded (no network?): {exc}")
    assert len(pages) == 30
    settings.AUDIT_MAX_LINKS = 100_000  # every link compared, not the first few hundred
    disagreements = []
    for name, body in sorted(pages.items()):
        url = f"https://corpus.test/{name}"  # served as text/html, no charset
        ours = analyze(body, url=url)
        browser = browser_fields(decode_page(body).text, url=url)
        disagreements += [
            (name, field, ours[field], browser[field])
            for field in FIELDS
            if ours[field] != browser[field]
        ]
    assert disagreements == []


def test_a_self_closed_html_tag_is_ignored_as_a_browser_ignores_it():
    page = (
        '<html xml:lang="de" /><head><title>Hostile A</title>'
        '<meta name="description" content="A description">'
        '<link rel="canonical" href="https://www.example.org/a"></head>'
        '<body><h1>A</h1><a href="https://one.example/">1</a><a href="https://two.example/">2</a>'
        "</body></html>"
    )
    result = analyze(page)
    assert (result["title"], result["meta_description"], result["canonical"]) == (
        "Hostile A", "A description", "https://www.example.org/a",
    )  # fmt: skip
    assert result["external_links"] == ["https://one.example/", "https://two.example/"]
    assert result["h1_count"] == 1


def test_ie_conditional_comments_around_the_html_tag_are_comments():
    page = (
        '<!DOCTYPE html><!--[if IE 7]><html class="ie7"><![endif]-->'
        '<!--[if !(IE 7)]><!--><html lang="en"><!--<![endif]-->'
        '<head><title>Hostile B</title><meta name="description" content="B description">'
        '<link rel="canonical" href="https://www.example.org/b"></head>'
        '<body><a href="https://one.example/">1</a></body></html>'
    )
    result = analyze(page)
    assert (result["title"], result["meta_description"], result["canonical"]) == (
        "Hostile B", "B description", "https://www.example.org/b",
    )  # fmt: skip
    assert result["external_links"] == ["https://one.example/"]


def test_links_inside_noscript_are_text_as_in_a_browser_with_scripting_on():
    result = analyze('<noscript><a href="https://hidden.example/">x</a></noscript>')
    assert result["external_links"] == []


# --- Bytes to text ---------------------------------------------------------------------


def test_an_undeclared_utf8_page_is_read_as_utf8_not_mojibake():
    result = analyze("<title>GNU Emacs v3.0 \u2013 GNU Project</title>")
    assert result["title"] == "GNU Emacs v3.0 \u2013 GNU Project"
    assert result["encoding"] == "utf-8"


def test_the_http_charset_decides_over_a_meta_one():
    body = "<meta charset='utf-8'><title>\u65e5\u672c\u8a9e\u306e\u30da\u30fc\u30b8</title>"
    result = analyze(body.encode("shift_jis"), charset="Shift_JIS")
    assert result["title"] == "\u65e5\u672c\u8a9e\u306e\u30da\u30fc\u30b8"


def test_a_meta_charset_in_the_first_1024_bytes_is_obeyed():
    body = "<META HTTP-EQUIV='Content-Type' CONTENT='text/html; charset=windows-1251'>"
    body += "<title>\u041f\u0440\u0438\u0432\u0435\u0442</title>"
    assert analyze(body.encode("cp1251"))["title"] == "\u041f\u0440\u0438\u0432\u0435\u0442"


def test_a_meta_charset_past_the_first_1024_bytes_is_not_a_declaration():
    body = f"<!-- {'x' * 1100} --><meta charset='windows-1251'><title>caf\u00e9</title>"
    result = analyze(body.encode())
    assert (result["encoding"], result["title"]) == ("utf-8", "caf\u00e9")


def test_a_bom_decides_over_the_http_charset():
    body = "\ufeff<title>\u00fcber</title>".encode("utf-16le")
    assert analyze(body, charset="iso-8859-1")["title"] == "\u00fcber"


def test_a_page_that_wrongly_declares_utf16_keeps_its_title_description_and_links():
    body = (
        "<meta charset='utf-16'><title>Caf\u00e9</title><meta name=description content='Menu'>"
        "<a href='https://other.example/'>x</a>"
    )
    result = analyze(body.encode())
    assert result["title"] == "Caf\u00e9"
    assert result["meta_description"] == "Menu"
    assert result["external_links"] == ["https://other.example/"]


def test_an_unknown_http_charset_falls_back_to_the_page_s_own():
    body = "<meta charset='windows-1252'><title>na\u00efve</title>".encode("cp1252")
    assert analyze(body, charset="utf8mb4")["title"] == "na\u00efve"


@pytest.mark.parametrize(
    ("codec", "text"),
    [
        ("shift_jis", "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3067\u3059\u3002"),
        ("gb18030", "\u8fd9\u662f\u4e00\u4e2a\u4e2d\u6587\u7684\u6587\u672c\u3002"),
        ("euc-kr", "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8\uc785\ub2c8\ub2e4."),
        (
            "cp1251",
            "\u042d\u0442\u043e \u0440\u0443\u0441\u0441\u043a\u0438\u0439 \u0442\u0435\u043a\u0441\u0442.",
        ),
    ],
)
def test_an_undeclared_legacy_page_is_detected(codec, text):
    body = f"<title>{text}</title><p>{text * 40}</p>".encode(codec)
    assert analyze(body)["title"] == text


def test_an_xhtml_page_with_an_xml_encoding_declaration_is_read():
    body = "<?xml version='1.0' encoding='iso-8859-1'?><html><head><title>Caf\u00e9</title>"
    assert analyze(body.encode("latin-1"), charset="iso-8859-1")["title"] == "Caf\u00e9"


def test_invalid_bytes_become_replacement_characters_and_the_rest_is_read():
    body = b"<title>ok \xff\xfe\xc3 there</title><h1>h</h1><a href='https://x.example/'>x</a>"
    result = analyze(body, charset="utf-8")
    assert result["title"] == "ok \ufffd\ufffd\ufffd there"
    assert (result["h1_count"], result["external_links"]) == (1, ["https://x.example/"])


@pytest.mark.parametrize(
    ("body", "own_bytes"),
    [
        # Valid UTF-8 with a character outside the BMP and a U+FFFD of its own.
        ("<title>\U0001f600 \ufffd ok</title><h1>h</h1>".encode(), True),
        # A BOM: the bytes after it.
        (b"\xef\xbb\xbf<title>\xc3\xa9 \xef\xbf\xbd</title><h1>h</h1>", True),
        # An invalid byte beside a U+FFFD of the page's own: the decoded text.
        (b"<title>\xff \xef\xbf\xbd</title><h1>h</h1>", False),
        (b"<title>\xe0\xef\xbf\xbd</title><h1>h</h1>", False),
    ],
)
def test_a_utf8_page_is_parsed_from_its_own_bytes_only_when_they_decode_unchanged(body, own_bytes):
    sniffed = sniff_encoding(body)
    chunks = list(decoded_chunks(body, sniffed))
    source = _lexbor_input(body, sniffed, chunks)
    text = "".join(chunks)
    assert isinstance(source, bytes) is own_bytes
    if own_bytes:
        assert source == text.encode()  # the very bytes selectolax would have made
    assert analyze(body)["title"] == text.split("<title>")[1].split("</title>")[0]


def test_nul_bytes_do_not_end_the_page():
    body = b"<title>a\x00b</title><meta name=description content=d>\x00<h1>h</h1>"
    body += b"<link rel=canonical href=/c><a href='https://x.example/'>x</a>"
    result = analyze(body)
    assert result["meta_description"] == "d"
    assert result["canonical"] == "https://www.example.org/c"
    assert (result["h1_count"], result["external_links"]) == (1, ["https://x.example/"])


# --- document.title --------------------------------------------------------------------


def test_the_title_collapses_whitespace_as_document_title_does():
    title = "\n  Emacs   v3.0\n\t- GNU Project \r\n"
    assert analyze(f"<title>{title}</title>")["title"] == "Emacs v3.0 - GNU Project"


def test_a_non_breaking_space_is_not_collapsed():
    assert analyze("<title> a\u00a0 b </title>")["title"] == "a\u00a0 b"


def test_an_svg_title_is_not_the_document_title():
    body = "<body><svg><title>Menu icon</title></svg><h1>Hi</h1></body>"
    assert analyze(body)["title"] is None
    body = "<body><svg><title>Menu icon</title></svg></body><title>Page</title>"
    assert analyze(body)["title"] == "Page"


# --- Links, resolved as a browser resolves them ----------------------------------------


def test_links_resolve_against_the_base_href():
    body = "<base href='https://cdn.example/docs/'><a href='page?x=1#top'>p</a>"
    assert analyze(body)["external_links"] == ["https://cdn.example/docs/page?x=1"]


def test_non_ascii_links_are_percent_encoded_as_utf8_with_an_idna_host():
    body = "<meta charset=windows-1252><a href='https://b\u00fccher.example/st\u00e4dte?q=\u00e9 t'>x</a>"
    assert analyze(body.encode("cp1252"))["external_links"] == [
        "https://xn--bcher-kva.example/st%C3%A4dte?q=%C3%A9%20t"
    ]


def test_tabs_and_newlines_inside_an_href_are_dropped_as_a_browser_does():
    assert resolve_link(PAGE, " https://x.example/a\n/b\t ") == "https://x.example/a/b"


def test_links_that_are_no_http_urls_are_not_links():
    body = (
        "<a href='mailto:a@b.c'>m</a><a href='javascript:void(0)'>j</a><a href='http://[bad'>b</a>"
    )
    result = analyze(body + "<a href='#top'>t</a><a href='ftp://x.example/'>f</a>")
    assert result["link_counts"] == {"internal": 0, "external": 0}


# --- Hostile pages: every one gives a bounded result ------------------------------------


def test_links_over_the_cap_are_counted_not_kept(settings):
    settings.AUDIT_MAX_LINKS = 300
    body = "".join(f"<a href='https://site{i}.example/'>{i}</a>" for i in range(100_000))
    result = analyze(body)
    assert len(result["external_links"]) == 300
    # The first 300 in the page are the ones kept.
    assert set(result["external_links"]) == {f"https://site{i}.example/" for i in range(300)}
    assert result["links_over_cap"] == 99_700
    assert result["link_counts"]["external"] == 100_000


def test_a_link_longer_than_a_stored_url_may_be_is_counted_and_skipped():
    long_link = "https://x.example/" + "a" * 100_000
    result = analyze(f"<a href='{long_link}'>long</a><a href='https://y.example/'>y</a>")
    assert result["external_links"] == ["https://y.example/"]
    assert result["links_too_long"] == 1
    assert all(len(url) <= MAX_URL_LENGTH for url in result["external_links"])


def test_a_long_title_and_description_are_clipped():
    result = analyze(
        f"<title>{'t' * 50_000}</title><meta name=description content='{'d' * 50_000}'>"
    )
    assert len(result["title"]) <= 1024 and len(result["meta_description"]) <= 1024


def test_a_tree_nested_a_million_deep_is_read_to_its_end():
    # No tree is built, so no nesting limit stops the read: a browser reads on too.
    body = "<title>Deep</title><a href='https://before.example/'>b</a>"
    body += "<div>" * 1_000_000 + "<a href='https://after.example/'>a</a>"
    result = analyze(body)
    assert result["title"] == "Deep"
    assert result["external_links"] == ["https://after.example/", "https://before.example/"]


def test_links_before_a_late_base_resolve_on_it_as_in_the_dom():
    body = (
        "<a href='one'>1</a><p>text</p><base href='https://cdn.example/docs/'><a href='two'>2</a>"
    )
    assert analyze(body)["external_links"] == [
        "https://cdn.example/docs/one",
        "https://cdn.example/docs/two",
    ]


def test_internal_links_over_the_cap_are_counted_not_kept(settings):
    settings.AUDIT_MAX_LINKS = 50
    # The shape of the security review's page: 200,000 same-host anchors.
    body = "".join(f"<a href=/p/{i}>x</a>" for i in range(200_000))
    result = analyze(body + "<a href='https://other.example/'>o</a><a href=/p/1>again</a>")
    assert result["link_counts"] == {"internal": 200_000, "external": 1}
    assert result["links_truncated"] is True
    assert (result["external_links"], result["links_over_cap"]) == (["https://other.example/"], 0)


def test_a_link_repeated_within_the_cap_counts_once(settings):
    settings.AUDIT_MAX_LINKS = 300
    body = "<a href='https://x.example/'>x</a>" * 1000 + "<a href=/a>a</a>" * 1000
    result = analyze(body)
    assert result["link_counts"] == {"internal": 1, "external": 1}
    assert result["links_truncated"] is False


def test_a_title_of_megabytes_is_collected_within_bounds_and_clipped_as_before():
    words = "  word\n" * 200_000
    result = analyze(f"<title>{words}</title><h1>h</h1>")
    expected = " ".join(["word"] * 200_000)
    assert result["title"] == expected[:1023] + "\u2026"
    assert result["h1_count"] == 1
    assert analyze(f"<title>{' ' * 100_000}a{' ' * 100_000}b</title>")["title"] == "a b"


def test_a_binary_body_sent_as_html_gives_a_result():
    body = random.Random(24).randbytes(2 * 1024 * 1024)
    result = analyze(body)
    assert len(result["external_links"]) <= 300
    result = analyze(os.urandom(4096), charset="utf-8")
    assert isinstance(result["h1_count"], int)


def test_an_empty_or_blank_body_gives_empty_fields():
    for body in (b"", b"   \n", b"\xef\xbb\xbf"):
        result = analyze(body)
        assert (result["title"], result["h1_count"], result["external_links"]) == (None, 0, [])
