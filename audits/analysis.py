"""What an audit reports about a fetched page."""

from __future__ import annotations

from urllib.parse import urljoin, urlsplit

from bs4 import BeautifulSoup

from outbound.integrations.page import FetchedPage

HTML_CONTENT_TYPES = {"text/html", "application/xhtml+xml"}
SKIPPED_LINK_SCHEMES = ("javascript:", "mailto:", "tel:", "data:", "#")


def missing_security_headers(page: FetchedPage) -> list[str]:
    wanted = ["content-security-policy", "x-content-type-options", "referrer-policy"]
    if urlsplit(page.final_url).scheme == "https":
        wanted.insert(0, "strict-transport-security")
    return [name for name in wanted if name not in page.headers]


def analyze_html(body: bytes, *, base_url: str, charset: str | None = None) -> dict:
    soup = BeautifulSoup(body, "lxml", from_encoding=charset)
    base_tag = soup.find("base", href=True)
    base = urljoin(base_url, base_tag["href"]) if base_tag else base_url

    title = soup.title.get_text(strip=True) if soup.title else None
    description = soup.find("meta", attrs={"name": lambda v: v and v.lower() == "description"})
    canonical = soup.find(
        "link", rel=lambda v: v and "canonical" in [r.lower() for r in _as_list(v)]
    )
    robots = soup.find_all(
        "meta", attrs={"name": lambda v: v and v.lower() in {"robots", "googlebot"}}
    )

    own_host = urlsplit(base_url).netloc.lower()
    internal: set[str] = set()
    external: set[str] = set()
    for anchor in soup.find_all("a", href=True):
        href = anchor["href"].strip()
        if not href or href.lower().startswith(SKIPPED_LINK_SCHEMES):
            continue
        target = urljoin(base, href).split("#", 1)[0]
        parts = urlsplit(target)
        if parts.scheme not in {"http", "https"}:
            continue
        (internal if parts.netloc.lower() == own_host else external).add(target)

    return {
        "title": title,
        "meta_description": (description.get("content") or "").strip() if description else None,
        "canonical": urljoin(base, canonical["href"])
        if canonical and canonical.get("href")
        else None,
        "noindex": any("noindex" in (tag.get("content") or "").lower() for tag in robots),
        "h1_count": len(soup.find_all("h1")),
        "link_counts": {"internal": len(internal), "external": len(external)},
        "external_links": sorted(external),
    }


def _as_list(value) -> list[str]:
    return value if isinstance(value, list) else str(value).split()


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
