"""Pages written for the edge cases of each Lighthouse SEO check (bench/lighthouse_agreement.py).

Each page is one case, so a verdict that differs points at that case. A page is
`(html, status, headers)`; every page paints some text (Lighthouse stops at a page that
paints nothing). Pages are served by one of four sites that differ only in their
robots.txt (ROBOTS): `main` (valid rules, a Googlebot group), `errors` (invalid lines),
`missing` (404) and `down` (503). `{origin}` in a page is replaced by its site's origin.
"""

from __future__ import annotations

HEAD = '<meta charset="utf-8"><meta name="viewport" content="width=device-width">'


def page(head: str = "", body: str = "", *, title: str = "A title",
         description: str | None = "A description of the page") -> str:  # fmt: skip
    meta = f'<meta name="description" content="{description}">' if description is not None else ""
    title_tag = f"<title>{title}</title>" if title is not None else ""
    return (
        f"<!doctype html><html lang=en><head>{HEAD}{title_tag}{meta}{head}</head>"
        f"<body><h1>Visible text</h1>{body}</body></html>"
    )


ROBOTS = {
    "main": (
        200,
        "User-agent: *\nDisallow: /private\nAllow: /private/ok$\n\n"
        "User-agent: googlebot\nDisallow: /google-blocked.html\n",
    ),
    "errors": (
        200,
        "# bad lines\nUser-agent: *\nDisallow: /x\nSitemap: /relative.xml\nUnknown-directive: x\n"
        "Disallow: nostart\nAllow: /a$b\n",
    ),
    "missing": (404, "not found"),
    "down": (503, "unavailable"),
}

# (site, path) -> (html, status, headers)
PAGES: dict[tuple[str, str], tuple[str, int, list[tuple[str, str]]]] = {
    # is-crawlable
    ("main", "/good.html"): (
        page(
            '<link rel="canonical" href="{origin}/good.html">',
            '<a href="/other">Other article</a><img src="a.png" alt="A">',
        ),
        200,
        [],
    ),  # fmt: skip
    ("main", "/meta-noindex.html"): (page('<meta name="robots" content="noindex">'), 200, []),
    ("main", "/meta-none.html"): (page('<meta name="robots" content="nofollow, NONE">'), 200, []),
    ("main", "/meta-nofollow.html"): (page('<meta name="robots" content="nofollow">'), 200, []),
    ("main", "/meta-googlebot.html"): (page('<meta name="googlebot" content="noindex">'), 200, []),
    ("main", "/meta-unavailable-past.html"): (
        page('<meta name="robots" content="unavailable_after: 2001-01-01">'),
        200,
        [],
    ),  # fmt: skip
    ("main", "/meta-in-body.html"): (page(body='<meta name="robots" content="noindex">'), 200, []),
    ("main", "/xrt-noindex.html"): (page(), 200, [("X-Robots-Tag", "noindex")]),
    ("main", "/xrt-googlebot.html"): (page(), 200, [("X-Robots-Tag", "googlebot: noindex")]),
    ("main", "/xrt-otherbot.html"): (page(), 200, [("X-Robots-Tag", "otherbot: noindex")]),
    ("main", "/private/page.html"): (page(), 200, []),
    ("main", "/private/ok"): (page(), 200, []),
    ("main", "/google-blocked.html"): (page(), 200, []),
    # http-status-code
    ("main", "/gone.html"): (page(), 410, []),
    ("main", "/error.html"): (page(), 503, []),
    ("main", "/not-found.html"): (page(), 404, []),
    # document-title
    ("main", "/no-title.html"): (page(title=None), 200, []),
    ("main", "/blank-title.html"): (page(title="&nbsp; &nbsp;"), 200, []),
    ("main", "/body-title.html"): (page(title=None, body="<title>In body</title>"), 200, []),
    ("main", "/svg-title-only.html"): (
        page(title=None, body="<svg><title>svg title</title></svg>"),
        200,
        [],
    ),  # fmt: skip
    # meta-description
    ("main", "/no-description.html"): (page(description=None), 200, []),
    ("main", "/blank-description.html"): (page(description="  \u00a0 "), 200, []),
    ("main", "/body-description.html"): (
        page(description=None, body='<meta name="description" content="late">'),
        200,
        [],
    ),  # fmt: skip
    ("main", "/noscript-head.html"): (
        page('<noscript><img src="x.png"></noscript>', title="NS", description=None).replace(
            "</head>", '<meta name="description" content="after noscript"></head>'
        ),
        200,
        [],
    ),  # fmt: skip
    # canonical
    ("main", "/canon-relative.html"): (page('<link rel="canonical" href="/relative">'), 200, []),
    ("main", "/canon-multiple.html"): (
        page(
            '<link rel="canonical" href="https://example.com/a">'
            '<link rel="canonical" href="https://example.com/b">'
        ),
        200,
        [],
    ),  # fmt: skip
    ("main", "/canon-duplicate.html"): (
        page(
            '<link rel="canonical" href="https://example.com/a">'
            '<link rel="canonical" href="https://example.com/a">'
        ),
        200,
        [],
    ),  # fmt: skip
    ("main", "/canon-root.html"): (page('<link rel="canonical" href="{origin}/">'), 200, []),
    ("main", "/canon-other-site-root.html"): (
        page('<link rel="canonical" href="https://example.com/">'),
        200,
        [],
    ),  # fmt: skip
    ("main", "/canon-nofollow.html"): (
        page('<link rel="canonical nofollow" href="/relative-but-ignored">'),
        200,
        [],
    ),  # fmt: skip
    ("main", "/canon-hreflang.html"): (
        page(
            '<link rel="canonical" href="https://example.com/en">'
            '<link rel="alternate" hreflang="en" href="https://example.com/en">'
            '<link rel="alternate" hreflang="de" href="{origin}/canon-hreflang.html">'
        ),
        200,
        [],
    ),  # fmt: skip
    ("main", "/canon-header-relative.html"): (
        page(),
        200,
        [("Link", '<relative/canon>; rel="canonical"')],
    ),
    ("main", "/canon-in-body.html"): (
        page(body='<link rel="canonical" href="/relative">'),
        200,
        [],
    ),
    ("main", "/canon-bad-url.html"): (page('<link rel="canonical" href="http://[bad">'), 200, []),
    # hreflang
    ("main", "/hreflang-good.html"): (
        page(
            '<link rel="alternate" hreflang="en-US" href="https://example.com/en">'
            '<link rel="alternate" hreflang="x-default" href="https://example.com/">'
        ),
        200,
        [],
    ),  # fmt: skip
    ("main", "/hreflang-bad-code.html"): (
        page('<link rel="alternate" hreflang="eng" href="https://example.com/en">'),
        200,
        [],
    ),  # fmt: skip
    ("main", "/hreflang-relative.html"): (
        page('<link rel="alternate" hreflang="de" href="/de">'),
        200,
        [],
    ),  # fmt: skip
    ("main", "/hreflang-protocol-relative.html"): (
        page('<link rel="alternate" hreflang="de" href="//example.com/de">'),
        200,
        [],
    ),  # fmt: skip
    ("main", "/hreflang-header.html"): (
        page(),
        200,
        [("Link", '<https://example.com/de>; rel="alternate"; hreflang="deu"')],
    ),  # fmt: skip
    ("main", "/hreflang-in-body.html"): (
        page(body='<link rel="alternate" hreflang="zz-bad" href="/x">'),
        200,
        [],
    ),  # fmt: skip
    # link-text
    ("main", "/link-click-here.html"): (page(body='<a href="/a">Click here</a>'), 200, []),
    ("main", "/link-read-more-spaced.html"): (page(body='<a href="/b">  READ MORE </a>'), 200, []),
    ("main", "/link-spanish.html"): (page(body='<a href="/b">más información</a>'), 200, []),
    ("main", "/link-nofollow.html"): (page(body='<a href="/c" rel="nofollow">here</a>'), 200, []),
    ("main", "/link-hidden-span.html"): (
        page(body='<a href="/g"><span style="display:none">here</span>visible</a>'),
        200,
        [],
    ),  # fmt: skip
    ("main", "/link-hidden-self.html"): (
        page(body='<a href="/f" style="display:none">here</a>'),
        200,
        [],
    ),  # fmt: skip
    ("main", "/link-nbsp.html"): (page(body='<a href="/h">click&nbsp;here</a>'), 200, []),
    ("main", "/link-two-spaces.html"): (page(body='<a href="/i">click  here</a>'), 200, []),
    ("main", "/link-fragment.html"): (page(body='<a href="#top">here</a>'), 200, []),
    ("main", "/link-mailto.html"): (page(body='<a href="mailto:x@example.com">here</a>'), 200, []),
    ("main", "/link-noscript.html"): (
        page(body='<noscript><a href="/j">here</a></noscript>'),
        200,
        [],
    ),
    ("main", "/link-svg.html"): (
        page(body='<svg><a href="/svg"><text>here</text></a></svg>'),
        200,
        [],
    ),
    ("main", "/link-role-button.html"): (page(body='<a href="/e" role="button">here</a>'), 200, []),
    # crawlable-anchors
    ("main", "/anchor-no-href.html"): (page(body="<a>no href</a>"), 200, []),
    ("main", "/anchor-id.html"): (page(body='<a id="x">target</a>'), 200, []),
    ("main", "/anchor-name.html"): (page(body='<a name="n">target</a>'), 200, []),
    ("main", "/anchor-js-void.html"): (page(body='<a href="javascript:void(0)">js</a>'), 200, []),
    ("main", "/anchor-js-void-spaced.html"): (
        page(body='<a href="javascript: void 0">js</a>'),
        200,
        [],
    ),
    ("main", "/anchor-js-other.html"): (page(body='<a href="javascript:go()">js</a>'), 200, []),
    ("main", "/anchor-file.html"): (
        page(body='<a href="file:///etc/passwd" name="n">file</a>'),
        200,
        [],
    ),
    ("main", "/anchor-bad-url.html"): (page(body='<a href="http://[bad">bad</a>'), 200, []),
    ("main", "/anchor-empty-href.html"): (page(body='<a href="">empty</a>'), 200, []),
    ("main", "/anchor-role.html"): (page(body='<a role="button">button</a>'), 200, []),
    # image-alt
    ("main", "/img-missing-alt.html"): (page(body='<img src="1.png">'), 200, []),
    ("main", "/img-space-alt.html"): (page(body='<img src="2.png" alt=" ">'), 200, []),
    ("main", "/img-empty-alt.html"): (page(body='<img src="7.png" alt="">'), 200, []),
    ("main", "/img-title.html"): (page(body='<img src="3.png" title="titled">'), 200, []),
    ("main", "/img-presentation.html"): (
        page(body='<img src="4.png" role="presentation">'),
        200,
        [],
    ),
    ("main", "/img-hidden.html"): (page(body='<img src="5.png" hidden>'), 200, []),
    ("main", "/img-aria-hidden.html"): (page(body='<img src="6.png" aria-hidden="true">'), 200, []),
    ("main", "/img-empty-aria-label.html"): (page(body='<img src="8.png" aria-label="">'), 200, []),
    ("main", "/img-labelledby.html"): (
        page(body='<span id="l">Label</span><img src="9.png" aria-labelledby="l">'),
        200,
        [],
    ),  # fmt: skip
    ("main", "/img-in-noscript.html"): (
        page(body='<noscript><img src="n.png"></noscript>'),
        200,
        [],
    ),
    # Parser shapes (issue 34.3)
    ("main", "/xml-lang.html"): (
        '<html xml:lang="de" /><head><meta charset="utf-8"><title>Hostile A</title>'
        '<meta name="description" content="Hostile A description">'
        '<link rel="canonical" href="{origin}/xml-lang.html"></head>'
        '<body><h1>A</h1><a href="/one">One article</a></body></html>',
        200,
        [],
    ),  # fmt: skip
    ("main", "/iecc.html"): (
        '<!DOCTYPE html><!--[if IE 7]><html class="ie7"><![endif]-->'
        '<!--[if !(IE 7)]><!--><html lang="en"><!--<![endif]-->'
        '<head><meta charset="utf-8"><title>Hostile B</title>'
        '<meta name="description" content="Hostile B description">'
        '<link rel="canonical" href="{origin}/iecc.html"></head>'
        '<body><h1>B</h1><a href="/two">Two articles</a></body></html>',
        200,
        [],
    ),  # fmt: skip
    # robots-txt
    ("errors", "/page.html"): (page(), 200, []),
    ("errors", "/x"): (page(), 200, []),
    ("missing", "/page.html"): (page(), 200, []),
    ("down", "/page.html"): (page(), 200, []),
}
