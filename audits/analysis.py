"""What an audit reports about a fetched page."""

from __future__ import annotations

import codecs
from urllib.parse import urljoin, urlsplit

import lxml.html

from outbound.integrations.page import FetchedPage

HTML_CONTENT_TYPES = {"text/html", "application/xhtml+xml"}
SKIPPED_LINK_SCHEMES = ("javascript:", "mailto:", "tel:", "data:", "#")


def missing_security_headers(page: FetchedPage) -> list[str]:
    wanted = ["content-security-policy", "x-content-type-options", "referrer-policy"]
    if urlsplit(page.final_url).scheme == "https":
        wanted.insert(0, "strict-transport-security")
    return [name for name in wanted if name not in page.headers]


def analyze_html(body: bytes, *, base_url: str, charset: str | None = None) -> dict:
    # lxml's tree, walked once over the few tags an audit reads: a fifth of the CPU
    # BeautifulSoup spent on the same page (DECISIONS.md, "Throughput").
    parser = lxml.html.HTMLParser(encoding=_known_encoding(charset))
    root = lxml.html.document_fromstring(body, parser=parser) if body.strip() else None
    title = description = canonical_href = base_href = None
    robots: list[str] = []
    hrefs: list[str] = []
    h1_count = 0
    elements = root.iter("title", "meta", "link", "base", "a", "h1") if root is not None else ()
    for element in elements:
        tag = element.tag
        if tag == "a":
            href = element.get("href")
            if href is not None:
                hrefs.append(href)
        elif tag == "h1":
            h1_count += 1
        elif tag == "meta":
            name = (element.get("name") or "").lower()
            if name == "description" and description is None:
                description = (element.get("content") or "").strip()
            elif name in {"robots", "googlebot"}:
                robots.append((element.get("content") or "").lower())
        elif tag == "link":
            rel = (element.get("rel") or "").lower().split()
            if "canonical" in rel and canonical_href is None:
                canonical_href = element.get("href") or ""
        elif tag == "title" and title is None:
            title = "".join(part.strip() for part in element.itertext())
        elif tag == "base" and base_href is None and element.get("href") is not None:
            base_href = element.get("href")
    base = urljoin(base_url, base_href) if base_href is not None else base_url

    own_host = urlsplit(base_url).netloc.lower()
    internal: set[str] = set()
    external: set[str] = set()
    for raw in hrefs:
        href = raw.strip()
        if not href or href.lower().startswith(SKIPPED_LINK_SCHEMES):
            continue
        target = urljoin(base, href).split("#", 1)[0]
        parts = urlsplit(target)
        if parts.scheme not in {"http", "https"}:
            continue
        (internal if parts.netloc.lower() == own_host else external).add(target)

    return {
        "title": title,
        "meta_description": description,
        "canonical": urljoin(base, canonical_href) if canonical_href else None,
        "noindex": any("noindex" in content for content in robots),
        "h1_count": h1_count,
        "link_counts": {"internal": len(internal), "external": len(external)},
        "external_links": sorted(external),
    }


def _known_encoding(charset: str | None) -> str | None:
    """The page's declared charset if Python knows it, else None (lxml then reads the page's own)."""
    if not charset:
        return None
    try:
        return codecs.lookup(charset).name
    except LookupError:
        return None


def audit_result(page: FetchedPage) -> dict:
    """The JSON stored on a finished audit."""
    result = {
        "requested_url": page.requested_url,
        "final_url": page.final_url,
        "redirects": page.redirects,
        "status_code": page.status_code,
        "ttfb_ms": page.ttfb_ms,
        "total_ms": page.total_ms,
        "bytes": len(page.body),
        "truncated": page.truncated,
        "content_type": page.content_type,
        "is_html": page.content_type in HTML_CONTENT_TYPES,
        "missing_security_headers": missing_security_headers(page),
    }
    header_noindex = "noindex" in page.headers.get("x-robots-tag", "").lower()
    if result["is_html"]:
        result.update(analyze_html(page.body, base_url=page.final_url, charset=page.charset))
        result["noindex"] = result["noindex"] or header_noindex
    else:
        result.update(
            {
                "title": None,
                "meta_description": None,
                "canonical": None,
                "noindex": header_noindex,
                "h1_count": 0,
                "link_counts": {"internal": 0, "external": 0},
                "external_links": [],
            }
        )
    return result
