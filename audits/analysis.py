"""What an audit reports about a fetched page, read the way a browser reads it.

Bytes become text by the WHATWG encoding sniffing order (a BOM, the HTTP charset, a
`<meta>` charset in the first 1024 bytes), and a page that declares nothing is detected
as browsers detect it (valid UTF-8 is UTF-8, else chardet's guess), decoded with
replacement characters for bad bytes. The text is parsed by lxml (libxml2), the title
read as `document.title` and links resolved as WHATWG URLs (ada): tests/test_page_parsing.py
compares the fields with html5lib's WHATWG parse of 30 real pages (DECISIONS.md, "Pages
read as a browser reads them").

Whatever a page holds, what the audit stores is bounded: at most AUDIT_MAX_LINKS external
links (the rest counted in `links_over_cap`), no URL longer than MAX_URL_LENGTH (counted
in `links_too_long`), titles and descriptions clipped at MAX_TEXT_LENGTH.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass
from urllib.parse import urlsplit

import ada_url
import chardet
import lxml.etree
import lxml.html
import webencodings
from django.conf import settings
from html5lib._inputstream import EncodingParser

from outbound.integrations.page import FetchedPage
from outbound.urls import MAX_URL_LENGTH

HTML_CONTENT_TYPES = {"text/html", "application/xhtml+xml"}
SKIPPED_LINK_PREFIXES = ("javascript:", "mailto:", "tel:", "data:", "#")
# WHATWG: the meta prescan reads the first 1024 bytes.
META_PRESCAN_BYTES = 1024
# An undeclared page is detected on its head: enough for chardet, cheap on a 5 MB page.
DETECTION_BYTES = 64 * 1024
# Titles and descriptions longer than this are clipped (search engines show ~60 and
# ~160 characters): a page cannot make its audit carry megabytes of text.
MAX_TEXT_LENGTH = 1024
BOMS = (
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_BE, "utf-16be"),
    (codecs.BOM_UTF16_LE, "utf-16le"),
)
ASCII_WHITESPACE = "\t\n\x0c\r "


@dataclass(frozen=True)
class DecodedPage:
    text: str
    encoding: str  # the WHATWG name: "utf-8", "windows-1252", "shift_jis", ...
    source: str  # what chose it: "bom", "http", "meta" or "detected"


def decode_page(body: bytes, http_charset: str | None = None) -> DecodedPage:
    """The page's text, by the WHATWG sniffing order, bad bytes replaced (U+FFFD)."""
    for bom, name in BOMS:
        if body.startswith(bom):
            return _decoded(body[len(bom) :], webencodings.lookup(name), "bom")
    declared = _lookup(http_charset)
    if declared is not None:
        return _decoded(body, declared, "http")
    # html5lib's prescan is the spec's algorithm; its quick "<meta" check is case-sensitive,
    # and ASCII case does not matter to a charset label, hence lower().
    meta = EncodingParser(body[:META_PRESCAN_BYTES].lower()).getEncoding()
    if meta is not None:
        # WHATWG: a page that says it is UTF-16 in ASCII bytes is not; x-user-defined is 1252.
        if meta.name in ("utf-16be", "utf-16le"):
            meta = webencodings.lookup("utf-8")
        elif meta.name == "x-user-defined":
            meta = webencodings.lookup("windows-1252")
        return _decoded(body, meta, "meta")
    return _decoded(body, _detect(body[:DETECTION_BYTES]), "detected")


def _lookup(label: str | None) -> webencodings.Encoding | None:
    return webencodings.lookup(label) if label else None


def _detect(sample: bytes) -> webencodings.Encoding | codecs.CodecInfo:
    decoder = codecs.getincrementaldecoder("utf-8")()
    try:
        decoder.decode(sample, final=False)  # a sample cut mid-character is still UTF-8
        return webencodings.lookup("utf-8")
    except UnicodeDecodeError:
        pass
    # prefer_superset: windows-1252 for latin-1, CP932 for Shift_JIS, as browsers decode them.
    guess = chardet.detect(sample, prefer_superset=True)["encoding"]
    if guess and _lookup(guess) is None:
        try:
            return codecs.lookup(guess)  # a superset WHATWG has no label for (CP932)
        except LookupError:
            pass
    return _lookup(guess) or webencodings.lookup("windows-1252")


def _decoded(
    body: bytes, encoding: webencodings.Encoding | codecs.CodecInfo, source: str
) -> DecodedPage:
    codec = encoding.codec_info if isinstance(encoding, webencodings.Encoding) else encoding
    return DecodedPage(body.decode(codec.name, "replace"), encoding.name, source)


def collapse_whitespace(text: str) -> str:
    """Strip and collapse ASCII whitespace, as `document.title` does (not NBSP)."""
    return " ".join(part for part in text.translate(_WHITESPACE_TO_SPACE).split(" ") if part)


_WHITESPACE_TO_SPACE = str.maketrans({char: " " for char in ASCII_WHITESPACE})


def resolve_link(base: str, href: str, *, keep_fragment: bool = False) -> str | None:
    """`href` resolved against `base` as a browser resolves it (WHATWG URL: IDNA host,
    path and query percent-encoded as UTF-8); None unless it is an http(s) URL."""
    try:
        url = ada_url.join_url(base, href)  # one call into ada: its URL object costs 5 a link
    except ValueError:
        return None
    if not url.startswith(("http://", "https://")):
        return None
    return url if keep_fragment else url.partition("#")[0]


def _host(url: str) -> str:
    """The host (and port) of a WHATWG-serialized http(s) URL: "scheme://[user@]host[:port]/..."."""
    return url.split("/", 3)[2].rpartition("@")[2]


def missing_security_headers(page: FetchedPage) -> list[str]:
    wanted = ["content-security-policy", "x-content-type-options", "referrer-policy"]
    if urlsplit(page.final_url).scheme == "https":
        wanted.insert(0, "strict-transport-security")
    return [name for name in wanted if name not in page.headers]


def analyze_html(body: bytes, *, base_url: str, charset: str | None = None) -> dict:
    decoded = decode_page(body, charset)
    # WHATWG's tokenizer turns NUL into U+FFFD (or drops it); libxml2 would end text there.
    text = decoded.text.replace("\x00", "\ufffd")
    root, parse_stopped = _parse(text)
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
        elif tag == "title" and title is None and not _in_svg(element):
            title = collapse_whitespace("".join(element.itertext()))
        elif tag == "base" and base_href is None and element.get("href") is not None:
            base_href = element.get("href")
    base = (resolve_link(base_url, base_href) or base_url) if base_href is not None else base_url
    canonical = resolve_link(base, canonical_href, keep_fragment=True) if canonical_href else None
    return {
        "title": _clipped(title),
        "meta_description": _clipped(description),
        "canonical": canonical if canonical and len(canonical) <= MAX_URL_LENGTH else None,
        "noindex": any("noindex" in content for content in robots),
        "h1_count": h1_count,
        **_links(hrefs, base=base, page_url=base_url),
        "encoding": decoded.encoding,
        "parse_stopped": parse_stopped,
    }


def _parse(text: str) -> tuple[lxml.html.HtmlElement | None, bool]:
    """The tree, and whether libxml2 stopped early (nesting deeper than its limit).

    Encoded back to UTF-8 bytes, with the parser told so: lxml refuses a str that
    starts with an XML declaration naming an encoding, and a `<meta charset>` must not
    re-decode text that is already decoded. huge_tree lifts libxml2's nesting limit
    from 256 to 2048 (its other limits guard sizes the fetch's byte cap already bounds).
    """
    if not text.strip():
        return None, False
    parser = lxml.html.HTMLParser(encoding="utf-8", huge_tree=True)
    root = lxml.html.document_fromstring(text.encode("utf-8", "surrogatepass"), parser=parser)
    stopped = any(
        error.type == lxml.etree.ErrorTypes.ERR_RESOURCE_LIMIT for error in parser.error_log
    )
    return root, stopped


def _in_svg(element) -> bool:
    return any(ancestor.tag in ("svg", "math") for ancestor in element.iterancestors())


def _clipped(text: str | None) -> str | None:
    if text is None or len(text) <= MAX_TEXT_LENGTH:
        return text
    return text[: MAX_TEXT_LENGTH - 1] + "\u2026"


def _links(hrefs: list[str], *, base: str, page_url: str) -> dict:
    """Distinct http(s) links counted internal and external; the first AUDIT_MAX_LINKS
    external ones in document order are kept (sorted), the rest only counted."""
    own_host = _host(resolve_link(page_url, page_url) or page_url)
    cap = settings.AUDIT_MAX_LINKS
    internal: set[str] = set()
    external: set[str] = set()
    kept: list[str] = []
    too_long: set[str] = set()
    for raw in hrefs:
        href = raw.strip()
        if not href or href.lower().startswith(SKIPPED_LINK_PREFIXES):
            continue
        target = resolve_link(base, href)
        if target is None:
            continue
        if _host(target) == own_host:
            internal.add(target)
            continue
        if target in external:
            continue
        external.add(target)
        if len(target) > MAX_URL_LENGTH:
            too_long.add(target)
        elif len(kept) < cap:
            kept.append(target)
    return {
        "link_counts": {"internal": len(internal), "external": len(external)},
        "external_links": sorted(kept),
        "links_over_cap": len(external) - len(too_long) - len(kept),
        "links_too_long": len(too_long),
    }


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
        analysis = analyze_html(page.body, base_url=page.final_url, charset=page.charset)
        # The audit read part of the page: the byte cap, or a tree nested past the parser's limit.
        result["truncated"] = page.truncated or analysis.pop("parse_stopped")
        result.update(analysis)
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
                "links_over_cap": 0,
                "links_too_long": 0,
                "encoding": None,
            }
        )
    return result
