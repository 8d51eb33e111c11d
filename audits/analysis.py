"""What an audit reports about a fetched page, read the way a browser reads it.

Bytes become text by the WHATWG encoding sniffing order (a BOM, the HTTP charset, a
`<meta>` charset in the first 1024 bytes), and a page that declares nothing is detected
as browsers detect it (valid UTF-8 is UTF-8, else chardet's guess), decoded with
replacement characters for bad bytes. The text is parsed by a WHATWG parser
(selectolax's Lexbor, scripting on, as a browser parses), the title read as
`document.title` and links resolved as WHATWG URLs (ada), and the SEO findings
(audits.findings) read off the same tree; a page too deep or too large for a tree is
read by a streaming lxml pass instead (DECISIONS.md, "SEO findings with Lighthouse's
meaning, read off a WHATWG tree"). tests/test_page_parsing.py compares the fields with
html5lib's WHATWG parse of 30 real pages.

Whatever a page holds, what an audit holds and stores is bounded (DECISIONS.md, "An
audit bounded by construction"): the page is decoded and parsed a chunk at a time and no
tree is built; at most AUDIT_MAX_LINKS distinct links of each kind are kept (the rest
counted: `links_over_cap`, `links_truncated`), no URL longer than MAX_URL_LENGTH (counted
in `links_too_long`), titles and descriptions clipped at MAX_TEXT_LENGTH.
"""

from __future__ import annotations

import codecs
import contextlib
import itertools
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit

import ada_url
import chardet
import lxml.etree
import webencodings
from django.conf import settings
from html5lib._inputstream import EncodingParser
from selectolax.lexbor import LexborHTMLParser

from audits import treebuild
from audits.findings import (
    PageInfo,
    http_status_code,
    non_html_findings,
    not_checked,
    robots_txt,
    tree_findings,
)
from outbound.integrations.page import FetchedPage
from outbound.integrations.robots import RobotsInfo
from outbound.urls import MAX_URL_LENGTH

log = logging.getLogger(__name__)

HTML_CONTENT_TYPES = {"text/html", "application/xhtml+xml"}
SKIPPED_LINK_PREFIXES = ("javascript:", "mailto:", "tel:", "data:", "#")
# WHATWG: the meta prescan reads the first 1024 bytes.
META_PRESCAN_BYTES = 1024
# An undeclared page is detected on its head: enough for chardet, cheap on a 5 MB page.
DETECTION_BYTES = 64 * 1024
# The body is decoded and parsed this many bytes at a time.
DECODE_CHUNK_BYTES = 64 * 1024
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
class SniffedEncoding:
    codec: str  # the Python codec decoding the body
    encoding: str  # the WHATWG name: "utf-8", "windows-1252", "shift_jis", ...
    source: str  # what chose it: "bom", "http", "meta" or "detected"
    skip: int = 0  # bytes of the BOM that starts the body


@dataclass(frozen=True)
class DecodedPage:
    text: str
    encoding: str
    source: str


def sniff_encoding(body: bytes, http_charset: str | None = None) -> SniffedEncoding:
    """The page's encoding, by the WHATWG sniffing order."""
    for bom, name in BOMS:
        if body.startswith(bom):
            return _sniffed(webencodings.lookup(name), "bom", skip=len(bom))
    declared = _lookup(http_charset)
    if declared is not None:
        return _sniffed(declared, "http")
    # html5lib's prescan is the spec's algorithm; its quick "<meta" check is case-sensitive,
    # and ASCII case does not matter to a charset label, hence lower().
    meta = EncodingParser(body[:META_PRESCAN_BYTES].lower()).getEncoding()
    if meta is not None:
        # WHATWG: a page that says it is UTF-16 in ASCII bytes is not; x-user-defined is 1252.
        if meta.name in ("utf-16be", "utf-16le"):
            meta = webencodings.lookup("utf-8")
        elif meta.name == "x-user-defined":
            meta = webencodings.lookup("windows-1252")
        return _sniffed(meta, "meta")
    return _sniffed(_detect(body[:DETECTION_BYTES]), "detected")


def decode_page(body: bytes, http_charset: str | None = None) -> DecodedPage:
    """The page's text, by the WHATWG sniffing order, bad bytes replaced (U+FFFD)."""
    sniffed = sniff_encoding(body, http_charset)
    return DecodedPage("".join(decoded_chunks(body, sniffed)), sniffed.encoding, sniffed.source)


def decoded_chunks(body: bytes, sniffed: SniffedEncoding) -> Iterator[str]:
    """The body's text a chunk at a time (bad bytes replaced): the analysis never holds
    a second copy of a page."""
    decoder = codecs.getincrementaldecoder(sniffed.codec)(errors="replace")
    view = memoryview(body)
    for offset in range(sniffed.skip, len(body), DECODE_CHUNK_BYTES):
        text = decoder.decode(view[offset : offset + DECODE_CHUNK_BYTES])
        if text:
            yield text
    text = decoder.decode(b"", final=True)
    if text:
        yield text


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


def _sniffed(
    encoding: webencodings.Encoding | codecs.CodecInfo, source: str, *, skip: int = 0
) -> SniffedEncoding:
    codec = encoding.codec_info if isinstance(encoding, webencodings.Encoding) else encoding
    return SniffedEncoding(codec.name, encoding.name, source, skip)


def collapse_whitespace(text: str) -> str:
    """Strip and collapse ASCII whitespace, as `document.title` does (not NBSP)."""
    return " ".join(part for part in text.translate(_WHITESPACE_TO_SPACE).split(" ") if part)


_ASCII_WHITESPACE_RUN = re.compile(r"[\t\n\x0c\r ]+")
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


def analyze_html(
    body: bytes,
    *,
    base_url: str,
    charset: str | None = None,
    page: PageInfo | None = None,
    robots: RobotsInfo | None = None,
    client: str = "",
) -> dict:
    """What the audit reads from an HTML page: its fields and its SEO findings.

    The page is read the way a browser reads it: a WHATWG parser (Lexbor, scripting on)
    builds its tree, the fields (`tree_fields`) and the findings (audits.findings) are
    read off it. A tree costs memory by element (about 0.8 KB each) and its construction
    is quadratic in nesting depth in every WHATWG parser, so a streaming pass first
    measures both (`DepthGauge`: libxml2's HTML parser fed a chunk at a time, no tree); a
    page nested deeper than AUDIT_MAX_TREE_DEPTH or holding more than
    AUDIT_MAX_TREE_ELEMENTS elements is read by the streaming `PageReader` instead, and
    its tree-based checks are not applicable (`too_deep`, `too_many_elements`), and so is
    a page of more stray `<` than MAX_PARSE_ERRORS (`too_many_parse_errors`). A page past
    AUDIT_TREE_IN_PROCESS_MAX_BYTES has its tree built by a child of the audits worker
    (audits.treebuild), and one that would cost that child more memory or time than it
    has is read by the streaming pass too (`too_costly_for_a_tree`), as is one that no
    child took within AUDIT_TREE_WAIT_SECONDS (`tree_builders_busy`); `client` (whose
    audit it is) waits for its turn with the children within that wait. Either way
    what the result holds is bounded (AUDIT_MAX_LINKS, MAX_TEXT_LENGTH, MAX_URL_LENGTH,
    audits.findings.FINDING_MAX_ITEMS).
    """
    sniffed = sniff_encoding(body, charset)
    page = page or PageInfo(final_url=base_url, status_code=200, headers=[])
    chunks = list(decoded_chunks(body, sniffed))
    too = None
    if sum(chunk.count("<") for chunk in chunks) > UNGAUGED_MAX_TAGS:
        depth = DepthGauge()
        _stream(chunks, depth)
        too = _too_big_for_a_tree(depth) or _too_malformed_for_a_tree(chunks)
    if too:
        return _read_without_a_tree(chunks, sniffed, base_url, page, robots, too)
    source = _lexbor_input(body, sniffed, chunks)
    del chunks
    if len(source) <= settings.AUDIT_TREE_IN_PROCESS_MAX_BYTES:
        read = read_tree(source, base_url, page, robots, settings.AUDIT_MAX_LINKS)
        return {**read, "encoding": sniffed.encoding}
    try:
        read = treebuild.build(
            read_tree, source, base_url, page, robots, settings.AUDIT_MAX_LINKS,
            seconds=settings.AUDIT_TREE_SECONDS, wait_seconds=settings.AUDIT_TREE_WAIT_SECONDS,
            client=client,
        )  # fmt: skip
    except treebuild.NoTree as exc:
        log.warning(exc.event, extra={"url": base_url, "error": str(exc)})
        del source
        # Decoded again rather than held while the child worked: this page is rare.
        chunks = list(decoded_chunks(body, sniffed))
        return _read_without_a_tree(chunks, sniffed, base_url, page, robots, exc.reason)
    return {**read, "encoding": sniffed.encoding}


def read_tree(
    source: bytes | str, base_url: str, page: PageInfo, robots: RobotsInfo | None, max_links: int
) -> dict:
    """The page's fields and findings read off its tree, which Lexbor builds from `source`
    (`_lexbor_input`). Run in a tree builder's child for a large page (audits.treebuild),
    so it takes and returns only what crosses a pipe."""
    tree = LexborHTMLParser(source, scripting=True)
    fields = tree_fields(tree, page_url=base_url, max_links=max_links)
    findings, metas = tree_findings(tree, page, robots)
    return {
        **fields,
        "findings": findings,
        "crawl_directives": crawl_directives(metas, meta_noindex=fields["noindex"]),
    }


def _read_without_a_tree(
    chunks: list[str],
    sniffed: SniffedEncoding,
    base_url: str,
    page: PageInfo,
    robots: RobotsInfo | None,
    reason: str,
) -> dict:
    """The page read by the streaming pass alone (bounded by construction): its fields, its
    status and robots.txt judged, every other finding not applicable for `reason`."""
    reader = PageReader(page_url=base_url, max_links=settings.AUDIT_MAX_LINKS)
    _stream(chunks, reader)
    findings = [
        http_status_code(page.status_code),
        robots_txt(robots),
        *(
            finding
            for finding in not_checked(reason)
            if finding["id"] not in ("http-status-code", "robots-txt")
        ),
    ]
    fields = reader.fields()
    return {
        **fields,
        "encoding": sniffed.encoding,
        "findings": findings,
        "crawl_directives": {"meta_noindex": fields["noindex"]},
    }


def crawl_directives(metas: list[tuple[str, str]], *, meta_noindex: bool) -> dict:
    """What the page itself says to crawlers, kept with the result so that a 304 sending
    X-Robots-Tag can judge `noindex` and is-crawlable again without the page
    (audits.services.not_modified_result): its robots metas as is-crawlable read them
    (at most five, their content clipped at MAX_TEXT_LENGTH) and whether a robots or
    googlebot meta says noindex. No "metas" for a page too large for a tree, whose
    is-crawlable was not judged."""
    return {
        "metas": [[name[:64], content[:MAX_TEXT_LENGTH]] for name, content in metas],
        "meta_noindex": meta_noindex,
    }


def _lexbor_input(body: bytes, sniffed: SniffedEncoding, chunks: list[str]) -> bytes | str:
    """What Lexbor parses: the body's own bytes when it is UTF-8 that decoded without a
    replacement character (the text encoded back would be those very bytes), else the
    decoded text, which selectolax encodes to UTF-8.

    The same tree either way, at a fraction of the cost on a large page: a page with one
    character outside the BMP (an emoji in 2.5 MB of CNN's inline script) decodes to a
    string of 4 bytes a character, whose join and re-encoding cost more than the parse.
    The decoder replaced nothing when the text holds as many U+FFFD as the bytes hold
    its encoding (EF BF BD): a replacement adds one that no such sequence accounts for,
    and no invalid sequence can swallow one (EF is never a continuation byte). CNN's
    pages carry a few of their own.

    A page of more than MAX_PARSE_ERRORS NULs is the decoded text without them.
    """
    if any("\x00" in chunk for chunk in chunks) and (
        sum(chunk.count("\x00") for chunk in chunks) > MAX_PARSE_ERRORS
    ):
        return "".join(chunk.replace("\x00", "") for chunk in chunks)
    if sniffed.codec != "utf-8":
        return "".join(chunks)
    in_text = sum(chunk.count("\ufffd") for chunk in chunks)
    if in_text and in_text != body.count(_UTF8_REPLACEMENT_CHARACTER):
        return "".join(chunks)
    return body[sniffed.skip :] if sniffed.skip else body


_UTF8_REPLACEMENT_CHARACTER = "\ufffd".encode()

# Lexbor keeps a record of every parse error while it builds the tree (about 20 bytes
# each; selectolax cannot turn them off), and one byte or two of markup can make one: 5
# MiB of NULs took 88 MiB, 5 MiB of `<` opening no tag 57. A tree is built with at most
# this many (about 2 MB of records). Past it, a page's NULs are dropped before the parse,
# as a browser drops them from body text (in a title, an attribute or a script it would
# show U+FFFD); a page of more `<` opening nothing gets no tree (`too_many_parse_errors`).
MAX_PARSE_ERRORS = 100_000
# A `<` that opens no tag, end tag, comment or declaration (`< `, `<=`, `<3`, `</>`): in
# text, each is a parse error. Counted only on a page gauged for its size (more than
# UNGAUGED_MAX_TAGS `<`): fewer cannot make many. Inside a script one is no error, so a
# script counts against the bound as if it were text: a page needs 100,000 of them.
STRAY_LT = re.compile(r"<(?![A-Za-z!?/])|</(?![A-Za-z])")


# A page with at most this many `<` has at most as many elements, nested at most as
# deep: its tree costs at most ~0.5 s of CPU however it nests (10,000 nested divs, the
# quadratic worst case, parse in 0.5 s), so it is not gauged first. Every page of the
# corpus has fewer than 4,100 (the gauge's streaming pass cost ~2 ms a page).
UNGAUGED_MAX_TAGS = 10_000


def _stream(chunks: list[str], target) -> None:
    """Feed the decoded chunks to libxml2's HTML parser with a target (no tree)."""
    parser = lxml.etree.HTMLParser(target=target, encoding="utf-8")
    for text in chunks:
        # WHATWG's tokenizer turns NUL into U+FFFD (or drops it); libxml2 would end text there.
        # Encoded back to UTF-8, with the parser told so: a `<meta charset>` must not
        # re-decode text that is already decoded.
        parser.feed(text.replace("\x00", "\ufffd").encode("utf-8", "surrogatepass"))
    if chunks:
        # No element at all (a blank page) raises: there is nothing to read.
        with contextlib.suppress(lxml.etree.XMLSyntaxError):
            parser.close()


def _too_big_for_a_tree(gauge: DepthGauge) -> str | None:
    """Why the page gets no tree ("too_deep", "too_many_elements"), or None."""
    if gauge.max_depth > settings.AUDIT_MAX_TREE_DEPTH:
        return "too_deep"
    if gauge.nodes > settings.AUDIT_MAX_TREE_ELEMENTS:
        return "too_many_elements"
    return None


def _too_malformed_for_a_tree(chunks: list[str]) -> str | None:
    """Why a page of more than MAX_PARSE_ERRORS `<` opening nothing (STRAY_LT) gets no
    tree ("too_many_parse_errors"), or None."""
    stray = 0
    for chunk in chunks:
        # Counted only up to the bound: a page of nothing else holds millions.
        stray += sum(
            1 for _ in itertools.islice(STRAY_LT.finditer(chunk), MAX_PARSE_ERRORS - stray + 1)
        )
        if stray > MAX_PARSE_ERRORS:
            return "too_many_parse_errors"
    return None


class DepthGauge:
    """An lxml parser target measuring how deep the page's elements nest and how many
    nodes they and its comments make: what a tree of the page would cost, before building
    it. A comment is a node as an element is (5 MiB of `<!-->` made a tree of 155 MiB)."""

    def __init__(self):
        self.depth = 0
        self.max_depth = 0
        self.nodes = 0

    def start(self, tag: str, attrib) -> None:
        self.nodes += 1
        self.depth += 1
        if self.depth > self.max_depth:
            self.max_depth = self.depth

    def end(self, tag: str) -> None:
        self.depth -= 1

    def comment(self, text: str) -> None:
        self.nodes += 1

    def close(self) -> None:
        pass


def tree_fields(tree: LexborHTMLParser, *, page_url: str, max_links: int) -> dict:
    """The audit's fields read off the page's tree as the DOM gives them: the first
    HTML-namespace title (`document.title`), the first `<base href>` as the base URL,
    the first description and canonical, every robots meta, every h1, every `<a href>`."""
    title = tree.css_first("title:not(svg *):not(math *)")
    base_node = tree.css_first("base[href]:not(svg *):not(math *)")
    base = page_url
    if base_node is not None:
        base = resolve_link(page_url, base_node.attributes.get("href") or "") or page_url
    description = None
    noindex = False
    for meta in tree.css("meta[name]"):
        name = (meta.attributes.get("name") or "").lower()
        content = meta.attributes.get("content") or ""
        if name == "description" and description is None:
            description = _clipped(content.strip())
        elif name in {"robots", "googlebot"}:
            noindex = noindex or "noindex" in content.lower()
    canonical = None
    for link in tree.css("link[rel]:not(svg *):not(math *)"):
        if "canonical" in (link.attributes.get("rel") or "").lower().split():
            href = link.attributes.get("href")
            canonical = resolve_link(base, href, keep_fragment=True) if href else None
            break
    links = LinkTally(page_url=page_url, max_links=max_links)
    links.set_base(base)
    for anchor in tree.css("a[href]:not(svg *):not(math *)"):
        links.add(anchor.attributes.get("href") or "")
    return {
        # A regex, not collapse_whitespace's split: a 5 MB title is one new string, not
        # a million words.
        "title": _clipped(_ASCII_WHITESPACE_RUN.sub(" ", title.text(deep=True)).strip(" "))
        if title
        else None,
        "meta_description": description,
        "canonical": canonical if canonical and len(canonical) <= MAX_URL_LENGTH else None,
        "noindex": noindex,
        "h1_count": len(tree.css("h1")),
        **links.fields(base),
    }


class PageReader:
    """An lxml parser target: what the audit reads, kept as the parser's events stream.

    Reads as `document.title` and the DOM do: the first `title` not inside `svg`/`math`,
    the first `<base href>` as the document's base URL, the first description and
    canonical, every robots meta, every `h1`, every `<a href>` (`LinkTally`).
    """

    def __init__(self, *, page_url: str, max_links: int):
        self.page_url = page_url
        self.links = LinkTally(page_url=page_url, max_links=max_links)
        self.title: TextCollector | None = None
        self.title_depth = 0  # elements open inside the title being read
        self.foreign_depth = 0  # svg/math elements open
        self.description: str | None = None
        self.canonical_href: str | None = None
        self.base_href: str | None = None
        self.noindex = False
        self.h1_count = 0

    def start(self, tag: str, attrib) -> None:
        if self.title is not None and not self.title.finished:
            self.title_depth += 1
        if tag == "a":
            href = attrib.get("href")
            if href is not None:
                self.links.add(href)
        elif tag == "h1":
            self.h1_count += 1
        elif tag == "meta":
            name = (attrib.get("name") or "").lower()
            if name == "description" and self.description is None:
                self.description = _clipped((attrib.get("content") or "").strip())
            elif name in {"robots", "googlebot"}:
                self.noindex = self.noindex or "noindex" in (attrib.get("content") or "").lower()
        elif tag == "link":
            rel = (attrib.get("rel") or "").lower().split()
            if "canonical" in rel and self.canonical_href is None:
                self.canonical_href = attrib.get("href") or ""
        elif tag == "title" and self.title is None and not self.foreign_depth:
            self.title = TextCollector()
        elif tag == "base" and self.base_href is None and attrib.get("href") is not None:
            self.base_href = attrib.get("href")
            self.links.set_base(self._base())
        elif tag in ("svg", "math"):
            self.foreign_depth += 1

    def end(self, tag: str) -> None:
        if self.title is not None and not self.title.finished:
            if self.title_depth:
                self.title_depth -= 1
            else:
                self.title.finished = True
        if tag in ("svg", "math") and self.foreign_depth:
            self.foreign_depth -= 1

    def data(self, text: str) -> None:
        if self.title is not None and not self.title.finished:
            self.title.add(text)

    def close(self) -> None:
        if self.title is not None:
            self.title.finished = True

    def _base(self) -> str:
        if self.base_href is None:
            return self.page_url
        return resolve_link(self.page_url, self.base_href) or self.page_url

    def fields(self) -> dict:
        base = self._base()
        href = self.canonical_href
        canonical = resolve_link(base, href, keep_fragment=True) if href else None
        return {
            "title": self.title.text() if self.title is not None else None,
            "meta_description": self.description,
            "canonical": canonical if canonical and len(canonical) <= MAX_URL_LENGTH else None,
            "noindex": self.noindex,
            "h1_count": self.h1_count,
            **self.links.fields(base),
        }


class TextCollector:
    """A title's text as `document.title` gives it (whitespace collapsed) and clipped at
    MAX_TEXT_LENGTH, collected without holding more than a few times that: once the
    collapsed text is past the clip, the rest cannot change the result."""

    def __init__(self):
        self.pieces: list[str] = []
        self.size = 0
        self.finished = False
        self.full = False

    def add(self, text: str) -> None:
        if self.full:
            return
        self.pieces.append(text)
        self.size += len(text)
        if self.size > 4 * MAX_TEXT_LENGTH:
            raw = "".join(self.pieces)
            collapsed = collapse_whitespace(raw)
            self.full = len(collapsed) > MAX_TEXT_LENGTH
            # A trailing space keeps the boundary with what comes next.
            collapsed += " " if raw[-1:] in ASCII_WHITESPACE and collapsed else ""
            self.pieces, self.size = [collapsed], len(collapsed)

    def text(self) -> str:
        return _clipped(collapse_whitespace("".join(self.pieces)))


# Hrefs read before the document's base URL is known are held up to this many
# characters, then resolved against the page's URL (a `<base>` after that much of a
# page is rare, and only the links before it would resolve differently).
PENDING_HREF_CHARACTERS = 256 * 1024
# An href longer than this resolves to no URL of MAX_URL_LENGTH (resolving only removes
# tabs, newlines and dot segments): counted too long without resolving it.
MAX_HREF_LENGTH = 4 * MAX_URL_LENGTH


class LinkTally:
    """Links counted as they stream, keeping the first `max_links` distinct http(s)
    links of each kind (internal: the page's host; external: any other).

    A link past the cap is counted, not kept: it cannot be told from the links counted
    before it, so a link repeated past the cap counts each time it appears. A link
    longer than MAX_URL_LENGTH is counted apart (`links_too_long`), never kept.
    """

    def __init__(self, *, page_url: str, max_links: int):
        self.own_host = _host(resolve_link(page_url, page_url) or page_url)
        self.max_links = max_links
        self.base: str | None = None  # unknown until a `<base href>`, or until too late
        self.page_url = page_url
        self.pending: list[str] = []
        self.pending_size = 0
        self.kept = {"internal": set(), "external": set()}
        self.over_cap = {"internal": 0, "external": 0}
        self.too_long = 0

    def set_base(self, base: str) -> None:
        """The document's base URL (its first `<base href>`): the held links resolve on it."""
        self.base = base
        self._flush()

    def add(self, raw_href: str) -> None:
        href = raw_href.strip()
        if not href or href.lower().startswith(SKIPPED_LINK_PREFIXES):
            return
        if len(href) > MAX_HREF_LENGTH:
            self.too_long += 1
        elif self.base is not None:
            self._count(href)
        else:
            self.pending.append(href)
            self.pending_size += len(href)
            if self.pending_size > PENDING_HREF_CHARACTERS:
                self.set_base(self.page_url)

    def _flush(self) -> None:
        for href in self.pending:
            self._count(href)
        self.pending, self.pending_size = [], 0

    def _count(self, href: str) -> None:
        target = resolve_link(self.base, href)
        if target is None:
            return
        if len(target) > MAX_URL_LENGTH:
            self.too_long += 1
            return
        kind = "internal" if _host(target) == self.own_host else "external"
        kept = self.kept[kind]
        if target in kept:
            return
        if len(kept) < self.max_links:
            kept.add(target)
        else:
            self.over_cap[kind] += 1

    def fields(self, base: str) -> dict:
        if self.base is None:
            self.set_base(base)  # the page ended: no `<base>`, or none that resolved
        return {
            "link_counts": {
                kind: len(self.kept[kind]) + self.over_cap[kind]
                for kind in ("internal", "external")
            },
            "external_links": sorted(self.kept["external"]),
            "links_over_cap": self.over_cap["external"],
            "links_too_long": self.too_long,
            "links_truncated": bool(
                self.too_long or self.over_cap["internal"] or self.over_cap["external"]
            ),
        }


def _clipped(text: str | None) -> str | None:
    if text is None or len(text) <= MAX_TEXT_LENGTH:
        return text
    return text[: MAX_TEXT_LENGTH - 1] + "\u2026"


def says_noindex(x_robots_tag: list[str]) -> bool:
    """The page's `noindex` field, from its X-Robots-Tag lines (with its metas: `or`)."""
    return "noindex" in ", ".join(x_robots_tag).lower()


def audit_result(page: FetchedPage, *, robots: RobotsInfo | None = None, client: str = "") -> dict:
    """The JSON stored on a finished audit. `robots` is the page's host's robots.txt
    (None when it is not known: robots-txt is then not applicable, and is-crawlable reads
    the page's metas and headers alone)."""
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
    header_noindex = says_noindex(page.headers.get_list("x-robots-tag"))
    info = PageInfo(
        final_url=page.final_url,
        status_code=page.status_code,
        headers=[(name.lower(), value) for name, value in page.headers.multi_items()],
    )
    if result["is_html"]:
        result.update(
            analyze_html(
                page.body,
                base_url=page.final_url,
                charset=page.charset,
                page=info,
                robots=robots,
                client=client,
            )  # fmt: skip
        )
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
                "links_truncated": False,
                "links_too_long": 0,
                "encoding": None,
                "findings": non_html_findings(info, robots),
                "crawl_directives": crawl_directives([], meta_noindex=False),
            }
        )
    return result
