"""SEO findings with Lighthouse 12.2.3's meaning, one small page per case (issue 34.1).

Lighthouse itself runs in bench/lighthouse_agreement.py, on these cases and real pages;
here each check is pinned on the cases its source (and a Lighthouse run) decided.
"""

from __future__ import annotations

import pytest

from audits import analysis
from audits.analysis import analyze_html
from audits.findings import (
    CHECK_IDS,
    FINDING_MAX_ITEMS,
    FINDING_MAX_TEXT,
    PageInfo,
)
from outbound.integrations.robots import RobotsInfo, availability_of

PAGE = "https://www.example.org/articles/one"


def robots_file(status: int | None, body: str = "") -> RobotsInfo:
    """The page's host's robots.txt as the store gives it: `status` None, no answer."""
    return RobotsInfo("https://www.example.org/robots.txt", status, body, availability_of(status))


HEAD = '<meta name="viewport" content="width=device-width"><title>T</title>'


def findings_of(
    html: str,
    *,
    url: str = PAGE,
    status: int = 200,
    headers: list[tuple[str, str]] | None = None,
    robots: RobotsInfo | None = None,
) -> dict[str, dict]:
    result = analyze_html(
        html.encode(),
        base_url=url,
        page=PageInfo(final_url=url, status_code=status, headers=headers or []),
        robots=robots,
    )
    assert [item["id"] for item in result["findings"]] == list(CHECK_IDS)
    return {item["id"]: item for item in result["findings"]}


def outcome(check: str, html: str, **kwargs) -> str:
    return findings_of(html, **kwargs)[check]["outcome"]


def test_every_finding_has_an_id_an_outcome_a_severity_and_details():
    for item in findings_of(f"<head>{HEAD}</head><body>x</body>").values():
        assert set(item) == {"id", "outcome", "severity", "details"}
        assert item["outcome"] in ("pass", "fail", "not_applicable")
        assert item["severity"] in ("high", "medium", "low")


# --- is-crawlable ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("head", "headers", "expected"),
    [
        ('<meta name="robots" content="noindex">', [], "fail"),
        ('<meta name="robots" content="nofollow, NONE">', [], "fail"),
        ('<meta name="robots" content="nofollow">', [], "pass"),
        ('<meta name="robots" content="unavailable_after: 2001-01-01">', [], "fail"),
        ('<meta name="robots" content="unavailable_after: 2999-01-01">', [], "pass"),
        # Only Googlebot is blocked: the others may index it.
        ('<meta name="googlebot" content="noindex">', [], "pass"),
        ("", [("x-robots-tag", "noindex")], "fail"),
        ("", [("x-robots-tag", "googlebot: noindex")], "pass"),
    ],
)
def test_is_crawlable_fails_only_when_every_bot_is_blocked(head, headers, expected):
    assert outcome("is-crawlable", f"<head>{head}</head>x", headers=headers) == expected


def test_a_robots_meta_in_the_body_is_not_read():
    assert outcome("is-crawlable", 'x<meta name="robots" content="noindex">') == "pass"


def test_robots_txt_blocking_every_bot_fails_is_crawlable_and_a_group_of_its_own_escapes():
    everyone = robots_file(200, "User-agent: *\nDisallow: /articles\n")
    assert outcome("is-crawlable", "x", robots=everyone) == "fail"
    google_allowed = robots_file(
        200, "User-agent: *\nDisallow: /articles\n\nUser-agent: Googlebot\nAllow: /\n"
    )
    item = findings_of("x", robots=google_allowed)["is-crawlable"]
    assert item["outcome"] == "pass"
    assert item["details"]["blocked_user_agents"] == [
        "*",
        "bingbot",
        "DuckDuckBot",
        "archive.org_bot",
    ]
    longest_allow = robots_file(200, "User-agent: *\nDisallow: /articles\nAllow: /articles/one$\n")
    assert outcome("is-crawlable", "x", robots=longest_allow) == "pass"


# --- http-status-code, document-title, meta-description -------------------------------


@pytest.mark.parametrize(("status", "expected"), [(200, "pass"), (204, "pass"), (404, "fail"),
                                                  (410, "fail"), (503, "fail")])  # fmt: skip
def test_http_status_code_fails_4xx_and_5xx(status, expected):
    assert outcome("http-status-code", "x", status=status) == expected


@pytest.mark.parametrize(
    ("html", "expected"),
    [
        ("<title>Hello</title>", "pass"),
        ("<title>&nbsp; &nbsp;</title>", "fail"),
        ("<p>no title</p>", "fail"),
        ("<body><title>In body</title></body>", "pass"),
        ("<body><svg><title>svg only</title></svg></body>", "fail"),
    ],
)
def test_document_title_is_the_first_html_title_with_text(html, expected):
    assert outcome("document-title", html) == expected


@pytest.mark.parametrize(
    ("html", "expected"),
    [
        ('<head><meta name="description" content="Said"></head>', "pass"),
        ('<head><meta name="description" content=" \u00a0 "></head>', "fail"),
        ("<head></head>", "fail"),
        ('<body>x<meta name="description" content="late"></body>', "fail"),
        # Scripting on: a noscript in head does not close it, as in Chrome.
        (
            '<head><noscript><img src=a.png></noscript><meta name="description" content="d"></head>',
            "pass",
        ),
    ],
)
def test_meta_description_is_the_first_in_head_and_not_blank(html, expected):
    assert outcome("meta-description", html) == expected


# --- canonical, hreflang ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("head", "expected", "reason"),
    [
        ('<link rel="canonical" href="https://www.example.org/articles/one">', "pass", None),
        ("", "not_applicable", None),
        ('<link rel="canonical" href="/relative">', "fail", "relative"),
        ('<link rel="canonical" href="http://[bad">', "fail", "relative"),
        (
            '<link rel="canonical" href="https://a.example/x"><link rel="canonical" href="https://a.example/y">',
            "fail",
            "conflicting",
        ),  # fmt: skip
        (
            '<link rel="canonical" href="https://a.example/x"><link rel="canonical" href="https://a.example/x">',
            "pass",
            None,
        ),  # fmt: skip
        ('<link rel="canonical" href="https://www.example.org/">', "fail", "points_to_root"),
        ('<link rel="canonical" href="https://other.example/">', "pass", None),
        # Lighthouse compares rel whole: this is no canonical.
        ('<link rel="canonical nofollow" href="/relative">', "not_applicable", None),
        (
            '<link rel="canonical" href="https://www.example.org/en">'
            '<link rel="alternate" hreflang="en" href="https://www.example.org/en">'
            '<link rel="alternate" hreflang="de" href="https://www.example.org/articles/one">',
            "fail",
            "points_to_another_hreflang",
        ),  # fmt: skip
    ],
)
def test_canonical(head, expected, reason):
    item = findings_of(f"<head>{head}</head>x")["canonical"]
    assert item["outcome"] == expected
    assert item["details"].get("reason") == reason


def test_a_canonical_in_a_link_header_counts_and_one_in_the_body_does_not():
    header = [("link", '<relative/canon>; rel="canonical"')]
    assert outcome("canonical", "x", headers=header) == "fail"
    assert outcome("canonical", 'x<link rel="canonical" href="/relative">') == "not_applicable"


@pytest.mark.parametrize(
    ("head", "expected"),
    [
        ('<link rel="alternate" hreflang="en-US" href="https://a.example/en">', "pass"),
        ('<link rel="alternate" hreflang="x-default" href="https://a.example/">', "pass"),
        ('<link rel="alternate" hreflang="eng" href="https://a.example/en">', "fail"),
        ('<link rel="alternate" hreflang="de" href="/de">', "fail"),
        ('<link rel="alternate" hreflang="de" href="//a.example/de">', "fail"),
        ("", "pass"),
    ],
)
def test_hreflang_needs_a_known_language_and_an_absolute_url(head, expected):
    assert outcome("hreflang", f"<head>{head}</head>x") == expected


def test_hreflang_reads_link_headers():
    header = [("link", '<https://a.example/de>; rel="alternate"; hreflang="deu"')]
    item = findings_of("x", headers=header)["hreflang"]
    assert item["outcome"] == "fail"
    assert item["details"]["items"][0]["reasons"] == "unexpected_language_code"


# --- robots-txt -----------------------------------------------------------------------------


def test_robots_txt_outcomes_by_status_and_content():
    assert outcome("robots-txt", "x", robots=None) == "not_applicable"
    assert outcome("robots-txt", "x", robots=robots_file(None)) == "fail"
    assert outcome("robots-txt", "x", robots=robots_file(503)) == "fail"
    assert outcome("robots-txt", "x", robots=robots_file(404)) == "not_applicable"
    assert outcome("robots-txt", "x", robots=robots_file(200, "")) == "not_applicable"
    assert (
        outcome("robots-txt", "x", robots=robots_file(200, "User-agent: *\nDisallow: /x\n"))
        == "pass"
    )


def test_robots_txt_errors_are_listed_by_line():
    body = ("# comment\nDisallow: /early\nUser-agent: *\nSitemap: /relative.xml\n"
            "Unknown-directive: x\nDisallow: nostart\nAllow: /a$b\nno colon\n")  # fmt: skip
    item = findings_of("x", robots=robots_file(200, body))["robots-txt"]
    assert item["outcome"] == "fail"
    assert [(row["line"], row["message"]) for row in item["details"]["items"]] == [
        (2, "No user-agent specified"),
        (4, "Invalid sitemap URL"),
        (5, "Unknown directive"),
        (6, 'Pattern should either be empty, start with "/" or "*"'),
        (7, '"$" should only be used at the end of the pattern'),
        (8, "Syntax not understood"),
    ]


# --- crawlable-anchors, link-text ----------------------------------------------------------


@pytest.mark.parametrize(
    ("anchor", "expected"),
    [
        ('<a href="/ok">ok</a>', "pass"),
        ("<a>no href</a>", "fail"),
        ('<a id="x">target</a>', "pass"),
        ('<a name="n">target</a>', "pass"),
        ('<a role="button">button</a>', "pass"),
        ('<a href="javascript:void(0)">js</a>', "fail"),
        ('<a href="javascript: void 0">js</a>', "fail"),
        ('<a href="javascript:go()">js</a>', "pass"),
        ('<a href="file:///etc/passwd" name="n">file</a>', "fail"),
        ('<a href="http://[bad">bad</a>', "fail"),
        ('<a href="">empty</a>', "pass"),
        ('<a href="mailto:x@example.org">mail</a>', "pass"),
    ],
)
def test_crawlable_anchors(anchor, expected):
    assert outcome("crawlable-anchors", anchor) == expected


@pytest.mark.parametrize(
    ("anchor", "expected"),
    [
        ('<a href="/a">Click here</a>', "fail"),
        ('<a href="/b">  READ MORE </a>', "fail"),
        ('<a href="/b">más información</a>', "fail"),
        ('<a href="/b">続きを読む</a>', "fail"),
        ('<a href="/b">The full story</a>', "pass"),
        ('<a href="/c" rel="nofollow">here</a>', "pass"),
        ('<a href="/d" rel="nofollower">here</a>', "pass"),
        ('<a href="/g"><span style="display:none">here</span>visible</a>', "pass"),
        ('<a href="/g"><span style="display: none">x</span>here</a>', "fail"),
        ('<a href="/f" style="display:none">here</a>', "fail"),
        ('<a href="/h">click&nbsp;here</a>', "pass"),
        ('<a href="/i">click  here</a>', "fail"),
        ('<a href="#top">here</a>', "pass"),
        ('<a href="mailto:x@example.org">here</a>', "pass"),
        ('<noscript><a href="/j">here</a></noscript>', "pass"),
        ('<a href="/e" role="button">here</a>', "fail"),
        ('<svg><a href="/svg"><text>here</text></a></svg>', "fail"),
    ],
)
def test_link_text(anchor, expected):
    assert outcome("link-text", anchor) == expected


# --- image-alt -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("image", "expected"),
    [
        ('<img src="1.png">', "fail"),
        ('<img src="2.png" alt=" ">', "fail"),
        ('<img src="7.png" alt="">', "pass"),
        ('<img src="3.png" title="titled">', "pass"),
        ('<img src="4.png" role="presentation">', "pass"),
        ('<img src="8.png" aria-label="">', "fail"),
        ('<span id="l">Label</span><img src="9.png" aria-labelledby="l">', "pass"),
        ('<img src="5.png" hidden>', "not_applicable"),
        ('<img src="6.png" aria-hidden="true">', "not_applicable"),
        ('<div style="display:none"><img src="6.png"></div>', "not_applicable"),
        # An ancestor hidden by any of the ways: Lexbor's `:not(:is(a, b) *)` missed some.
        ('<div aria-hidden="true"><a><img src="6.png"></a></div>', "not_applicable"),
        ('<div hidden><img src="6.png"></div><img src="7.png" alt="x">', "pass"),
        ('<noscript><img src="n.png"></noscript>', "not_applicable"),
        ("<p>no image</p>", "not_applicable"),
    ],
)
def test_image_alt(image, expected):
    assert outcome("image-alt", image) == expected


# --- Plumb's own: viewport, mixed-content, structured-data -------------------------------


@pytest.mark.parametrize(
    ("head", "expected"),
    [
        ('<meta name="viewport" content="width=device-width, initial-scale=1">', "pass"),
        ('<meta name="viewport" content="initial-scale=1">', "pass"),
        ('<meta name="viewport" content="user-scalable=no">', "fail"),
        ("", "fail"),
    ],
)
def test_viewport(head, expected):
    assert outcome("viewport", f"<head>{head}</head>x") == expected


def test_mixed_content_on_https_pages_only():
    html = '<img src="http://cdn.example/a.png"><link rel="stylesheet" href="http://cdn.example/s.css"><a href="http://x.example/">a link is no subresource</a>'
    item = findings_of(html)["mixed-content"]
    assert item["outcome"] == "fail"
    assert item["details"]["items"] == ["http://cdn.example/a.png", "http://cdn.example/s.css"]
    assert outcome("mixed-content", '<img src="//cdn.example/a.png">') == "pass"
    assert outcome("mixed-content", html, url="http://www.example.org/") == "not_applicable"


def test_structured_data_that_does_not_parse_fails():
    good = '<script type="application/ld+json">{"@type": "Article"}</script>'
    bad = '<script type="application/ld+json">{"@type": "Article",}</script>'
    assert outcome("structured-data", good) == "pass"
    item = findings_of(good + bad)["structured-data"]
    assert item["outcome"] == "fail"
    assert item["details"]["blocks"] == 2
    assert item["details"]["items"][0]["block"] == 2
    assert outcome("structured-data", "<p>none</p>") == "not_applicable"


# --- Bounds, and pages with no tree ----------------------------------------------------------


def test_details_are_bounded_whatever_the_page_holds():
    anchors = "".join(f'<a href="/{"x" * 500}{n}">here</a>' for n in range(5000))
    item = findings_of(anchors)["link-text"]
    assert item["details"]["count"] == 5000
    assert len(item["details"]["items"]) == FINDING_MAX_ITEMS
    assert all(len(row["href"]) <= FINDING_MAX_TEXT for row in item["details"]["items"])


def test_a_page_nested_past_the_bound_is_read_without_a_tree(settings, monkeypatch):
    monkeypatch.setattr(analysis, "UNGAUGED_MAX_TAGS", 0)  # gauged however small
    settings.AUDIT_MAX_TREE_DEPTH = 100
    html = "<title>Deep</title>" + "<div>" * 150 + '<a href="https://x.example/">x</a>'
    result = analyze_html(html.encode(), base_url=PAGE, page=PageInfo(PAGE, 503, []))
    by_id = {item["id"]: item for item in result["findings"]}
    assert result["title"] == "Deep"
    assert result["external_links"] == ["https://x.example/"]
    assert by_id["http-status-code"]["outcome"] == "fail"
    assert by_id["document-title"] == {
        "id": "document-title", "outcome": "not_applicable", "severity": "medium",
        "details": {"reason": "too_deep"},
    }  # fmt: skip


@pytest.mark.parametrize(
    "node",
    [
        pytest.param("<p>x</p>", id="elements"),
        # A comment is a node of the tree as an element is (5 MiB of them made 155 MiB).
        pytest.param("<!-- c -->", id="comments"),
    ],
)
def test_a_page_of_more_nodes_than_the_bound_is_read_without_a_tree(settings, monkeypatch, node):
    monkeypatch.setattr(analysis, "UNGAUGED_MAX_TAGS", 0)
    settings.AUDIT_MAX_TREE_ELEMENTS = 50
    html = "<title>Many</title>" + node * 60 + '<a href="https://x.example/">here</a>'
    result = analyze_html(html.encode(), base_url=PAGE)
    by_id = {item["id"]: item for item in result["findings"]}
    assert result["external_links"] == ["https://x.example/"]
    assert by_id["link-text"]["details"] == {"reason": "too_many_elements"}


def test_a_page_of_more_stray_lt_than_the_bound_is_read_without_a_tree(monkeypatch):
    # Each `<` opening no tag is a parse error Lexbor keeps a record of.
    monkeypatch.setattr(analysis, "UNGAUGED_MAX_TAGS", 0)
    monkeypatch.setattr(analysis, "MAX_PARSE_ERRORS", 50)
    html = "<title>Stray</title>" + "a < b </> " * 30 + '<a href="https://x.example/">here</a>'
    result = analyze_html(html.encode(), base_url=PAGE)
    by_id = {item["id"]: item for item in result["findings"]}
    assert result["title"] == "Stray"
    assert result["external_links"] == ["https://x.example/"]
    assert by_id["link-text"]["details"] == {"reason": "too_many_parse_errors"}


def test_a_page_of_few_stray_lt_keeps_its_tree(monkeypatch):
    monkeypatch.setattr(analysis, "UNGAUGED_MAX_TAGS", 0)
    html = "<title>Stray</title>" + "a < b " * 30 + '<a href="https://x.example/">here</a>'
    by_id = {item["id"]: item for item in analyze_html(html.encode(), base_url=PAGE)["findings"]}
    assert by_id["link-text"]["outcome"] != "not_applicable"


@pytest.mark.parametrize(
    ("nuls", "title"),
    [(10, "a" + "\ufffd" * 10 + "b"), (200, "ab")],
    ids=["few, parsed as a browser parses them", "past the bound, dropped"],
)
def test_a_page_past_the_bound_on_parse_errors_has_its_nuls_dropped(monkeypatch, nuls, title):
    # Each NUL is a parse error Lexbor keeps a record of (5 MiB of them took 88 MiB). A
    # browser shows U+FFFD for one in a title and drops one from body text; past
    # MAX_PARSE_ERRORS every NUL is dropped before the parse.
    monkeypatch.setattr(analysis, "MAX_PARSE_ERRORS", 100)
    html = b"<title>a" + b"\x00" * nuls + b"b</title><p>text</p>"
    assert analyze_html(html, base_url=PAGE)["title"] == title


def test_a_page_of_few_tags_is_not_gauged_and_one_of_many_is(monkeypatch):
    gauged = []
    real = analysis.DepthGauge

    class Counting(real):
        def __init__(self):
            super().__init__()
            gauged.append(self)

    monkeypatch.setattr(analysis, "DepthGauge", Counting)
    analyze_html(b"<title>t</title><p>x</p>", base_url=PAGE)
    assert gauged == []
    analyze_html(b"<p>x</p>" * (analysis.UNGAUGED_MAX_TAGS // 2 + 1), base_url=PAGE)
    assert len(gauged) == 1 and gauged[0].nodes > analysis.UNGAUGED_MAX_TAGS // 2
