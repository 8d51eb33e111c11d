"""SEO findings: a verdict per check on a page's tree, with Lighthouse 12.2.3's meaning.

Each check is a plain function of what it reads (the page's WHATWG tree, its final URL,
status and headers, its host's robots.txt) returning one finding: `{"id", "outcome"
("pass", "fail" or "not_applicable"), "severity", "details"}`, details bounded
(FINDING_MAX_ITEMS rows of at most FINDING_MAX_TEXT characters, plus the total `count`).

The ten checks named after Lighthouse's SEO audits follow its source (audits/seo/*.js and
the axe-core rules it reuses; DECISIONS.md "SEO findings with Lighthouse's meaning"):
what Lighthouse reads from the live DOM (a meta in `<head>`, an anchor's innerText, an
image hidden from screen readers) is read from the tree a WHATWG parser builds with
scripting on, which is the tree Chrome builds before scripts run. Three more are what a
crawler sees and Lighthouse's SEO category leaves out: `viewport`, `mixed-content` (https
pages) and `structured-data` (JSON-LD that does not parse).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from pathlib import Path
from urllib.parse import quote

import ada_url
from selectolax.lexbor import LexborHTMLParser, LexborNode

from outbound.integrations.robots import RobotsInfo

PASS, FAIL, NOT_APPLICABLE = "pass", "fail", "not_applicable"
OUTCOMES = (PASS, FAIL, NOT_APPLICABLE)
HIGH, MEDIUM, LOW = "high", "medium", "low"

# The checks, in the order a result lists them, with how much a failure matters: high
# when the page drops out of search results or shows an error, medium when its listing
# suffers, low for what mostly costs accessibility.
SEVERITIES = {
    "is-crawlable": HIGH,
    "http-status-code": HIGH,
    "document-title": MEDIUM,
    "meta-description": MEDIUM,
    "canonical": HIGH,
    "hreflang": MEDIUM,
    "robots-txt": MEDIUM,
    "crawlable-anchors": MEDIUM,
    "link-text": LOW,
    "image-alt": LOW,
    "viewport": MEDIUM,
    "mixed-content": MEDIUM,
    "structured-data": LOW,
}
CHECK_IDS = tuple(SEVERITIES)
# Lighthouse's ten automatic SEO audits (the rest are Plumb's own).
LIGHTHOUSE_CHECK_IDS = CHECK_IDS[:10]

# A finding lists at most this many offending elements or values, each clipped.
FINDING_MAX_ITEMS = 10
FINDING_MAX_TEXT = 200

_DATA = json.loads((Path(__file__).with_name("lighthouse_seo_data.json")).read_text("utf-8"))
NON_DESCRIPTIVE_LINK_TEXTS = frozenset(_DATA["non_descriptive_link_texts"])
_LONGEST_LINK_TEXT = max(map(len, NON_DESCRIPTIVE_LINK_TEXTS))
VALID_LANGUAGE_SUBTAGS = frozenset(_DATA["valid_primary_language_subtags"])

# is-crawlable.js: the generic agent (None: `robots` metas, `*` in robots.txt) and four bots.
BOT_USER_AGENTS = (None, "Googlebot", "bingbot", "DuckDuckBot", "archive.org_bot")

# Hidden from rendering by an attribute or inline style (a stylesheet is out of reach).
HIDDEN = (
    '[hidden], [style*="display:none" i], [style*="display: none" i], '
    '[style*="visibility:hidden" i], [style*="visibility: hidden" i]'
)
# Not rendered by the UA stylesheet, so no innerText (noscript: scripting is on).
NOT_RENDERED_TAGS = {"script", "style", "template", "noscript", "head", "title"}
ASCII_WHITESPACE_RUN = re.compile(r"[\t\n\x0c\r ]+")
JS_WHITESPACE = re.compile(r"\s")


@dataclass(frozen=True)
class PageInfo:
    """What the checks read besides the tree: the URL the page was served from (after
    redirects), its status and its response headers (lower-case names, each line kept)."""

    final_url: str
    status_code: int
    headers: list[tuple[str, str]]

    def header_values(self, name: str) -> list[str]:
        return [value for key, value in self.headers if key.lower() == name]


def finding(check_id: str, outcome: str, details: dict | None = None) -> dict:
    return {
        "id": check_id,
        "outcome": outcome,
        "severity": SEVERITIES[check_id],
        "details": details or {},
    }


def not_checked(reason: str) -> list[dict]:
    """Every check not applicable, saying why (a page that is not HTML, a tree too deep)."""
    return [finding(check_id, NOT_APPLICABLE, {"reason": reason}) for check_id in CHECK_IDS]


def non_html_findings(page: PageInfo, robots: RobotsInfo | None) -> list[dict]:
    """A page that is not HTML (a PDF, an image): its status, its robots.txt and its
    X-Robots-Tag are checked; the rest has nothing to read."""
    checked = {
        "is-crawlable": is_crawlable([], page, robots),
        "http-status-code": http_status_code(page.status_code),
        "robots-txt": robots_txt(robots),
    }
    return [
        checked.get(check_id) or finding(check_id, NOT_APPLICABLE, {"reason": "not_html"})
        for check_id in CHECK_IDS
    ]


def page_findings(tree: LexborHTMLParser, page: PageInfo, robots: RobotsInfo | None) -> list[dict]:
    """Every check's finding on a page's tree. `robots` is None when its robots.txt is
    not known (then robots-txt is not applicable and is-crawlable reads the page alone)."""
    return tree_findings(tree, page, robots)[0]


def tree_findings(
    tree: LexborHTMLParser, page: PageInfo, robots: RobotsInfo | None
) -> tuple[list[dict], list[tuple[str, str]]]:
    """`page_findings`, and the page's robots metas is-crawlable read (`robots_metas`):
    kept with the result, they let a 304 that sends X-Robots-Tag judge it again."""
    head_metas = [
        ((node.attributes.get("name") or "").lower(), node) for node in tree.css("head meta")
    ]
    metas = robots_metas(head_metas)
    head_links = [_link_element(node) for node in tree.css("head link:not(svg *):not(math *)")]
    head_links += header_links(page)
    # Each anchor's attributes read once (a dict built in C per call), for both checks.
    anchors = [(node, node.attributes) for node in tree.css("a")]
    hidden = {node.mem_id: node for node in tree.css(_HIDDEN_OR_UNRENDERED)}
    findings = [
        is_crawlable(metas, page, robots),
        http_status_code(page.status_code),
        document_title(tree),
        meta_description(head_metas),
        canonical(head_links, page.final_url),
        hreflang(head_links),
        robots_txt(robots),
        crawlable_anchors(anchors, page.final_url),
        link_text(anchors, page.final_url, hidden),
        image_alt(tree, hidden),
        viewport(head_metas),
        mixed_content(tree, page.final_url),
        structured_data(tree),
    ]
    return findings, metas


# --- Bounded details ------------------------------------------------------------------


def _clip(text: str | None) -> str | None:
    if text is None or len(text) <= FINDING_MAX_TEXT:
        return text
    return text[: FINDING_MAX_TEXT - 1] + "\u2026"


def _items(rows: list) -> dict:
    """The first FINDING_MAX_ITEMS rows (strings, or dicts of strings), clipped, and the count."""
    kept = []
    for row in rows[:FINDING_MAX_ITEMS]:
        if isinstance(row, dict):
            kept.append({key: _clip(value) if isinstance(value, str) else value
                         for key, value in row.items()})  # fmt: skip
        else:
            kept.append(_clip(row))
    return {"count": len(rows), "items": kept}


def snippet(node: LexborNode) -> str:
    """The element's start tag, as Lighthouse's details show a node."""
    attributes = "".join(
        f' {name}="{value}"' if value is not None else f" {name}"
        for name, value in node.attributes.items()
    )
    return _clip(f"<{node.tag}{attributes}>")


def _join(base: str, href: str) -> str | None:
    """`new URL(href, base).href`, or None where it throws."""
    try:
        return ada_url.join_url(base, href)
    except ValueError:
        return None


def _parses_alone(href: str) -> bool:
    """`new URL(href)` does not throw: an absolute URL."""
    return ada_url.check_url(href)


# --- is-crawlable ---------------------------------------------------------------------


# The metas is-crawlable reads: `robots`, and each named bot's own.
ROBOTS_META_NAMES = ("robots", *(agent.lower() for agent in BOT_USER_AGENTS if agent))


def robots_metas(head_metas: list) -> list[tuple[str, str]]:
    """The first `<head>` meta of each name is-crawlable reads, as (name as written,
    content), in the page's order: all it reads of the page."""
    found: dict[str, tuple[str, str]] = {}
    for name, node in head_metas:
        if name in ROBOTS_META_NAMES and name not in found:
            attributes = node.attributes
            found[name] = (attributes.get("name") or "", attributes.get("content") or "")
    return list(found.values())


def is_crawlable(metas: list[tuple[str, str]], page: PageInfo, robots: RobotsInfo | None) -> dict:
    """Fails only when the generic agent and all four named bots are blocked, by a robots
    meta in `<head>` (the agent's own, else the first `robots`; `metas` as `robots_metas`
    gives them), an `X-Robots-Tag` header that applies to it, or the host's robots.txt
    (robots-parser's rules)."""
    rules = None
    status = robots.status_code if robots is not None else None
    if robots is not None and robots.body and status and 200 <= status < 300:
        rules = RobotsRules(robots.body)
    blocked_agents = []
    generic_sources: list[str] = []
    for agent in BOT_USER_AGENTS:
        sources = _blocking_sources(agent, metas, page, rules)
        if sources:
            blocked_agents.append(agent or "*")
        if agent is None:
            generic_sources = sources
    if len(blocked_agents) == len(BOT_USER_AGENTS):
        return finding("is-crawlable", FAIL, _items(generic_sources))
    details = {"blocked_user_agents": blocked_agents[:]} if blocked_agents else {}
    return finding("is-crawlable", PASS, details)


def _blocking_sources(agent, metas: list[tuple[str, str]], page: PageInfo, rules) -> list[str]:
    sources = []
    meta = None
    if agent:
        meta = next((meta for meta in metas if meta[0].lower() == agent.lower()), None)
    if meta is None:
        meta = next((meta for meta in metas if meta[0].lower() == "robots"), None)
    if meta is not None:
        name, content = meta
        if _has_blocking_directive(content):
            sources.append(f'<meta name="{name}" content="{content}" />')
    for value in page.header_values("x-robots-tag"):
        header_agent = _header_user_agent(value)
        if header_agent is not None and header_agent != agent:
            continue
        directives = value.strip()
        if agent and value.startswith(f"{agent}:"):
            directives = value.replace(f"{agent}:", "", 1)
        if _has_blocking_directive(directives):
            sources.append(f"X-Robots-Tag: {value}")
    if rules is not None and not rules.is_allowed(page.final_url, agent):
        sources.append(f"robots.txt line {rules.matching_line(page.final_url)}")
    return sources


_HEADER_AGENT = re.compile(r"^([^,:]+):")


def _header_user_agent(value: str) -> str | None:
    match = _HEADER_AGENT.match(value)
    if match and match[1].lower() != "unavailable_after":
        return match[1]
    return None


def _has_blocking_directive(directives: str) -> bool:
    for part in directives.split(","):
        directive = part.lower().strip()
        if directive in ("noindex", "none") or _is_unavailable(directive):
            return True
    return False


def _is_unavailable(directive: str) -> bool:
    """`unavailable_after: <date>` with a date in the past (JS Date.parse, approximated by
    RFC 2822 and ISO 8601 dates, the forms Google documents)."""
    name, colon, date = directive.partition(":")
    if not colon or name != "unavailable_after":
        return False
    date = date.strip()
    when = None
    try:
        when = parsedate_to_datetime(date)
    except (TypeError, ValueError, IndexError):
        try:
            when = datetime.fromisoformat(date)
        except ValueError:
            return False
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when < datetime.now(UTC)


class RobotsRules:
    """robots.txt read as robots-parser 3.0.1 reads it (Lighthouse's): groups keyed by
    the lower-cased agent without its `/version`; an agent uses its own group if there is
    one, else `*`; the longest matching pattern wins, allow on a tie; `*` and a final `$`."""

    def __init__(self, body: str):
        self.groups: dict[str, list[tuple[re.Pattern, int, bool, int]]] = {}
        self._parsed: tuple[str | None, str | None] = (None, None)
        agents: list[str] = []
        last_was_agent = False
        for number, line in enumerate(re.split(r"\r\n|\r|\n", body), start=1):
            line = line.split("#", 1)[0]
            key, colon, value = line.partition(":")
            key, value = key.strip().lower(), value.strip()
            if not colon or not key:
                continue
            if key == "user-agent":
                if not last_was_agent:
                    agents = []
                if value:
                    agents.append(value.lower().split("/", 1)[0].strip())
            elif key in ("allow", "disallow"):
                for agent in agents:
                    rules = self.groups.setdefault(agent, [])
                    if value:
                        pattern = _normalise_encoding(value)
                        rules.append((_pattern(pattern), len(pattern), key == "allow", number))
            elif key == "crawl-delay":
                for agent in agents:
                    self.groups.setdefault(agent, [])
            last_was_agent = key == "user-agent"

    def _rule(self, url: str, agent: str | None):
        name = (agent or "*").lower().split("/", 1)[0].strip()
        rules = self.groups.get(name) or self.groups.get("*") or []
        path = self._path(url)
        if path is None:
            return None
        best = None
        for regex, length, allow, number in rules:
            if regex.match(path) and (
                best is None or length > best[1] or (length == best[1] and allow and not best[2])
            ):
                best = (regex, length, allow, number)
        return best

    def _path(self, url: str) -> str | None:
        """The URL's path and query as the rules match them (kept for the next agent's
        question about the same URL: ada's URL object is the costly part)."""
        if self._parsed[0] != url:
            try:
                parsed = ada_url.URL(url)
            except ValueError:
                self._parsed = (url, None)
            else:
                self._parsed = (url, _upper_escapes(parsed.pathname + parsed.search))
        return self._parsed[1]

    def is_allowed(self, url: str, agent: str | None) -> bool:
        rule = self._rule(url, agent)
        return rule is None or rule[2]

    def matching_line(self, url: str) -> int:
        rule = self._rule(url, None)
        return rule[3] if rule else 1


def _pattern(pattern: str) -> re.Pattern:
    anchored = pattern.endswith("$")
    body = pattern[:-1] if anchored else pattern
    regex = ".*".join(re.escape(part) for part in body.split("*"))
    return re.compile(regex + (r"\Z" if anchored else ""), re.DOTALL)


_ESCAPE = re.compile(r"%[0-9a-fA-F]{2}")


def _upper_escapes(path: str) -> str:
    return _ESCAPE.sub(lambda match: match[0].upper(), path)


def _normalise_encoding(pattern: str) -> str:
    """encodeURI(pattern) with `%25` back to `%`, escapes upper-cased (robots-parser)."""
    encoded = quote(pattern, safe=";,/?:@&=+$!*'()#")
    return _upper_escapes(encoded.replace("%25", "%"))


# --- http-status-code, document-title, meta-description -------------------------------


def http_status_code(status: int) -> dict:
    if 400 <= status <= 599:
        return finding("http-status-code", FAIL, {"status_code": status})
    return finding("http-status-code", PASS, {"status_code": status})


def _axe_sanitize(text: str) -> str:
    return re.sub(r"\s{2,}", " ", text.replace("\r\n", "\n").replace("\u00a0", " ")).strip()


def document_title(tree: LexborHTMLParser) -> dict:
    """axe's document-title: `document.title` (the first HTML-namespace title, anywhere)
    is not empty once whitespace and NBSPs are collapsed."""
    node = tree.css_first("title:not(svg *):not(math *)")
    title = ASCII_WHITESPACE_RUN.sub(" ", node.text(deep=True)).strip(" ") if node else ""
    if _axe_sanitize(title):
        return finding("document-title", PASS, {"title": _clip(title)})
    return finding("document-title", FAIL, {"reason": "empty" if node else "missing"})


def meta_description(head_metas: list) -> dict:
    """The first `<meta name=description>` in `<head>` has content that is not blank."""
    node = next((node for name, node in head_metas if name == "description"), None)
    if node is None:
        return finding("meta-description", FAIL, {"reason": "missing"})
    content = node.attributes.get("content") or ""
    if not content.strip():
        return finding("meta-description", FAIL, {"reason": "empty"})
    return finding("meta-description", PASS, {"description": _clip(content)})


# --- canonical, hreflang (link elements in <head>) ------------------------------------


@dataclass(frozen=True)
class LinkElement:
    rel: str  # the whole attribute, lower-cased (Lighthouse compares it whole)
    href_raw: str
    hreflang: str
    node: LexborNode | None  # None for a `Link:` header


_LINK_VALUE = re.compile(r'<([^>]*)>((?:\s*;\s*[^;,=\s]+(?:\s*=\s*(?:"[^"]*"|[^;,]*))?)*)')
_LINK_PARAMETER = re.compile(r';\s*([^;,=\s]+)(?:\s*=\s*("[^"]*"|[^;,]*))?')


def header_links(page: PageInfo) -> list[LinkElement]:
    """The links of the page's `Link:` headers (canonical, alternates), as Lighthouse
    reads them with the DOM's `<head>` links."""
    links = []
    for value in page.header_values("link"):
        for match in _LINK_VALUE.finditer(value):
            parameters = {
                name.lower(): (raw or "").strip().strip('"')
                for name, raw in _LINK_PARAMETER.findall(match[2])
            }
            links.append(
                LinkElement(
                    rel=parameters.get("rel", "").lower(),
                    href_raw=match[1],
                    hreflang=parameters.get("hreflang", ""),
                    node=None,
                )
            )
    return links


def _link_element(node: LexborNode) -> LinkElement:
    attributes = node.attributes
    return LinkElement(
        rel=(attributes.get("rel") or "").lower(),
        href_raw=attributes.get("href") or "",
        hreflang=attributes.get("hreflang") or "",
        node=node,
    )


def canonical(head_links: list[LinkElement], page_url: str) -> dict:
    """canonical.js: an absolute URL, one distinct value, not another hreflang
    alternate's URL, not the site's root for a page that is not the root; not
    applicable without one."""
    urls: list[str] = []
    relative = None
    hreflang_urls = set()
    for link in head_links:
        if link.rel == "canonical":
            if not link.href_raw:
                continue
            if not _parses_alone(link.href_raw):
                relative = link.href_raw
                continue
            href = _join(page_url, link.href_raw)
            if href is not None and href not in urls:
                urls.append(href)
        elif link.rel == "alternate" and link.href_raw and link.hreflang:
            href = _join(page_url, link.href_raw)
            if href is not None:
                hreflang_urls.add(href)
    if relative is not None:
        return finding("canonical", FAIL, {"reason": "relative", "href": _clip(relative)})
    if not urls:
        return finding("canonical", NOT_APPLICABLE)
    if len(urls) > 1:
        return finding("canonical", FAIL, {"reason": "conflicting", **_items(urls)})
    url = urls[0]
    details = {"canonical": _clip(url)}
    if page_url in hreflang_urls and url in hreflang_urls and page_url != url:
        return finding("canonical", FAIL, {"reason": "points_to_another_hreflang", **details})
    try:
        page, target = ada_url.URL(page_url), ada_url.URL(url)
    except ValueError:
        return finding("canonical", PASS, details)
    if target.origin == page.origin and target.pathname == "/" and page.pathname != "/":
        return finding("canonical", FAIL, {"reason": "points_to_root", **details})
    return finding("canonical", PASS, details)


def hreflang(head_links: list[LinkElement]) -> dict:
    """hreflang.js: every `<link rel=alternate hreflang>` in `<head>` has a known primary
    language subtag (or x-default) and an absolute http(s) href."""
    invalid = []
    for link in head_links:
        if link.rel != "alternate" or not link.hreflang:
            continue
        reasons = []
        code = link.hreflang.lower()
        if code != "x-default" and code.split("-", 1)[0] not in VALID_LANGUAGE_SUBTAGS:
            reasons.append("unexpected_language_code")
        if not link.href_raw.lower().startswith(("http:", "https:")):
            reasons.append("relative_href")
        if reasons:
            invalid.append({"hreflang": link.hreflang, "href": link.href_raw,
                            "reasons": ",".join(reasons)})  # fmt: skip
    return finding("hreflang", FAIL if invalid else PASS, _items(invalid) if invalid else {})


# --- robots-txt -------------------------------------------------------------------------

ROBOTS_DIRECTIVES = {
    "user-agent", "disallow", "allow", "sitemap", "crawl-delay", "clean-param", "host",
    "request-rate", "visit-time", "noindex",
}  # fmt: skip


def robots_txt(robots: RobotsInfo | None) -> dict:
    """robots-txt.js: a robots.txt that could not be fetched or answers 5xx fails; a 4xx
    or an empty one is not applicable; otherwise each line must be valid."""
    if robots is None:
        return finding("robots-txt", NOT_APPLICABLE, {"reason": "robots.txt not read"})
    status = robots.status_code
    if status is None:
        return finding("robots-txt", FAIL, {"reason": "unreachable"})
    if status >= 500:
        return finding("robots-txt", FAIL, {"reason": "server_error", "status": status})
    if 400 <= status < 500 or not robots.body:
        return finding("robots-txt", NOT_APPLICABLE, {"status": status})
    errors = robots_txt_errors(robots.body)
    return finding("robots-txt", FAIL if errors else PASS, _items(errors) if errors else {})


def robots_txt_errors(body: str) -> list[dict]:
    errors = []
    in_group = False
    for number, original in enumerate(re.split(r"\r\n|\r|\n", body), start=1):
        line = original.split("#", 1)[0].strip()
        if not line:
            continue
        message = _robots_line_error(line)
        if message is None:
            directive = line.partition(":")[0].strip().lower()
            if directive == "user-agent":
                in_group = True
            elif directive in ("allow", "disallow") and not in_group:
                message = "No user-agent specified"
        if message:
            errors.append({"line": number, "text": original, "message": message})
    return errors


def _robots_line_error(line: str) -> str | None:
    if ":" not in line:
        return "Syntax not understood"
    directive, _, value = line.partition(":")
    directive, value = directive.strip().lower(), value.strip()
    if directive not in ROBOTS_DIRECTIVES:
        return "Unknown directive"
    if directive == "sitemap":
        try:
            url = ada_url.URL(value)
        except ValueError:
            return "Invalid sitemap URL"
        if url.protocol not in ("http:", "https:", "ftp:"):
            return "Invalid sitemap URL protocol"
    elif directive == "user-agent" and not value:
        return "No user-agent specified"
    elif directive in ("allow", "disallow"):
        if value and not value.startswith(("/", "*")):
            return 'Pattern should either be empty, start with "/" or "*"'
        if "$" in value[:-1]:
            return '"$" should only be used at the end of the pattern'
    return None


# --- crawlable-anchors, link-text -----------------------------------------------------

_JAVASCRIPT_VOID = re.compile(r"javascript:void(\(|)0(\)|)")


def crawlable_anchors(anchors: list[tuple[LexborNode, dict]], page_url: str) -> dict:
    """crawlable-anchors.js: an `<a>` a crawler cannot follow (no href and no id/name/role,
    `javascript:void(0)`, a `file:` URL, an href that is no URL)."""
    failing = []
    unfollowable: dict[str, bool] = {}  # by href: a page repeats its menus and footers
    for node, attributes in anchors:
        href_attribute = attributes.get("href")
        raw_href = JS_WHITESPACE.sub("", href_attribute or "")
        if (attributes.get("role") or "").strip():
            continue
        if raw_href.startswith("mailto:"):
            continue
        if not raw_href and attributes.get("id"):
            continue
        if raw_href.startswith("file:"):
            failing.append(snippet(node))
            continue
        if (attributes.get("name") or "").strip() and not _in_svg(node):
            continue
        if href_attribute is None:
            failing.append(snippet(node))
            continue
        cannot_follow = unfollowable.get(raw_href)
        if cannot_follow is None:
            cannot_follow = unfollowable[raw_href] = bool(
                _JAVASCRIPT_VOID.search(raw_href)
                or (
                    # An absolute URL that parses alone parses against the page (one C call).
                    _may_not_parse(raw_href)
                    and not ada_url.check_url(raw_href)
                    and _join(page_url, raw_href) is None
                )
            )
        if cannot_follow:
            failing.append(snippet(node))
    return finding(
        "crawlable-anchors", FAIL if failing else PASS, _items(failing) if failing else {}
    )


def _may_not_parse(href: str) -> bool:
    """Whether `new URL(href, base)` can throw for an http(s) base: only with a scheme
    (a colon) or a host (two leading slashes, either way round); a path never does."""
    return ":" in href or href[:2].replace("\\", "/") == "//"


def _in_svg(node: LexborNode) -> bool:
    parent = node.parent
    while parent is not None:
        if parent.tag == "svg":
            return True
        if parent.tag in ("body", "html"):
            return False
        parent = parent.parent
    return False


def link_text(
    anchors: list[tuple[LexborNode, dict]], page_url: str, hidden: dict[int, LexborNode]
) -> dict:
    """link-text.js: a followed link (an href, no `nofollow` in rel, not javascript:,
    mailto: or the page itself) whose text is one of Lighthouse's non-descriptive
    phrases ("click here", "more", "aquí", ...)."""
    with_hidden_text = _anchors_holding(hidden)
    page = page_url.partition("#")[0]
    failing = []
    for node, attributes in anchors:
        href_attribute = attributes.get("href")
        if not href_attribute or "nofollow" in (attributes.get("rel") or ""):
            continue
        text = node.text(deep=True)
        if len(text) > 4 * _LONGEST_LINK_TEXT and node.mem_id not in with_hidden_text:
            continue  # cannot be a short phrase once collapsed
        if node.mem_id in with_hidden_text:
            text = _inner_text(node)
        else:
            text = ASCII_WHITESPACE_RUN.sub(" ", text)
        text = text.strip().lower()
        if text not in NON_DESCRIPTIVE_LINK_TEXTS:
            continue
        href = _join(page_url, href_attribute) or href_attribute
        if href.lower().startswith(("javascript:", "mailto:")) or href.partition("#")[0] == page:
            continue
        failing.append({"href": href, "text": text})
    return finding("link-text", FAIL if failing else PASS, _items(failing) if failing else {})


def _anchors_holding(hidden: dict[int, LexborNode]) -> set[int]:
    """The anchors (by node id) with a descendant that innerText leaves out."""
    holders = set()
    for node in hidden.values():
        if (
            node.attributes.get("aria-hidden") == "true"
            and not _hidden(node)
            and (node.tag not in NOT_RENDERED_TAGS)
        ):
            continue  # aria-hidden hides from screen readers only, not from innerText
        parent = node.parent
        while parent is not None and parent.tag not in ("body", "html"):
            if parent.tag == "a":
                holders.add(parent.mem_id)
            parent = parent.parent
    return holders


def _inner_text(anchor: LexborNode) -> str:
    """innerText, approximately: the anchor itself hidden gives its textContent (as in
    Chrome); otherwise hidden and unrendered descendants are left out, ASCII whitespace
    runs collapse to a space (a non-breaking space stays)."""
    if _hidden(anchor):
        return ASCII_WHITESPACE_RUN.sub(" ", anchor.text(deep=True))
    pieces: list[str] = []
    _collect_visible_text(anchor, pieces)
    return ASCII_WHITESPACE_RUN.sub(" ", "".join(pieces))


def _collect_visible_text(node: LexborNode, pieces: list[str]) -> None:
    child = node.child
    while child is not None:
        if child.tag == "-text":
            pieces.append(child.text_content or "")
        elif (
            child.tag not in NOT_RENDERED_TAGS
            and not child.tag.startswith("-")
            and not _hidden(child)
        ):
            _collect_visible_text(child, pieces)
        child = child.next


_DISPLAY_NONE = re.compile(r"(display\s*:\s*none|visibility\s*:\s*hidden)", re.IGNORECASE)


def _hidden(node: LexborNode) -> bool:
    attributes = node.attributes
    return "hidden" in attributes or bool(_DISPLAY_NONE.search(attributes.get("style") or ""))


# --- image-alt --------------------------------------------------------------------------

# Hidden from screen readers (axe's excludeHidden): the element or an ancestor.
_SCREEN_READER_HIDDEN = f'{HIDDEN}, [aria-hidden="true"]'
# Found once a page (one query), for both image-alt and link-text.
_HIDDEN_OR_UNRENDERED = f"{_SCREEN_READER_HIDDEN}, script, style, template, noscript"
# Roles that need no accessible name from the img (axe's no-explicit-name-required-matches
# keeps imgs with no role, role none/presentation, or a role that needs a name).
_NAMELESS_ROLES = {"none", "presentation"}


def image_alt(tree: LexborHTMLParser, hidden: dict[int, LexborNode]) -> dict:
    """axe's image-alt: every img visible to screen readers has an alt attribute (not
    whitespace only), a non-empty aria-label, aria-labelledby text or title, or role
    none/presentation; not applicable without such an img."""
    images = [node for node in tree.css("img") if not _within(node, hidden)]
    if not images:
        return finding("image-alt", NOT_APPLICABLE)
    failing = []
    for node in images:
        attributes = node.attributes
        role = (attributes.get("role") or "").strip().lower()
        alt = attributes.get("alt")
        if alt is not None and alt and not alt.strip(" \t\n\r\x0c") and role not in _NAMELESS_ROLES:
            failing.append(snippet(node))
            continue
        if (
            alt is not None
            or _axe_sanitize(attributes.get("aria-label") or "")
            or _axe_sanitize(attributes.get("title") or "")
            or role in _NAMELESS_ROLES
            or _labelled_by_text(tree, attributes.get("aria-labelledby"))
        ):
            continue
        failing.append(snippet(node))
    return finding("image-alt", FAIL if failing else PASS, _items(failing) if failing else {})


def _within(node: LexborNode, hidden: dict[int, LexborNode]) -> bool:
    """The node or an ancestor is hidden (or not rendered: a template's, a noscript's)."""
    if not hidden:
        return False
    while node is not None:
        if node.mem_id in hidden:
            return True
        node = node.parent
    return False


def _labelled_by_text(tree: LexborHTMLParser, ids: str | None) -> bool:
    for element_id in (ids or "").split():
        node = tree.css_first(f'[id="{element_id.replace(chr(34), "")}"]')
        if node is not None and _axe_sanitize(node.text(deep=True)):
            return True
    return False


# --- Plumb's own: viewport, mixed-content, structured-data ----------------------------


def viewport(head_metas: list) -> dict:
    """A `<meta name=viewport>` in `<head>` that sets width or initial-scale (what
    Lighthouse's viewport audit asks; a page without one renders at desktop width on
    phones, which mobile-first indexing sees)."""
    node = next((node for name, node in head_metas if name == "viewport"), None)
    if node is None:
        return finding("viewport", FAIL, {"reason": "missing"})
    content = node.attributes.get("content") or ""
    keys = {part.partition("=")[0].strip().lower() for part in re.split(r"[,;]", content)}
    if keys & {"width", "initial-scale"}:
        return finding("viewport", PASS, {"content": _clip(content)})
    return finding(
        "viewport", FAIL, {"reason": "no_width_or_initial_scale", "content": _clip(content)}
    )


# Subresources a browser loads (and blocks or upgrades on an https page), one query.
_SUBRESOURCES = (
    "img[src], script[src], iframe[src], audio[src], video[src], source[src], embed[src], "
    "track[src], input[src], link[href], object[data]"
)
_SUBRESOURCE_LINK_RELS = {"stylesheet", "icon", "preload", "modulepreload", "manifest"}


def mixed_content(tree: LexborHTMLParser, page_url: str) -> dict:
    """An https page that loads subresources over plain http; not applicable to an
    http page."""
    if not page_url.startswith("https:"):
        return finding("mixed-content", NOT_APPLICABLE)
    insecure = []
    for node in tree.css(_SUBRESOURCES):
        attributes = node.attributes
        if node.tag == "link":
            if not set((attributes.get("rel") or "").lower().split()) & _SUBRESOURCE_LINK_RELS:
                continue
            value = attributes.get("href")
        elif node.tag == "object":
            value = attributes.get("data")
        elif node.tag == "input" and (attributes.get("type") or "").lower() != "image":
            continue
        else:
            value = attributes.get("src")
        value = (value or "").strip()
        if not value.lower().startswith("http:"):
            continue  # only an explicit http: URL is insecure on an https page
        url = _join(page_url, value)
        if url is not None and url.startswith("http:"):
            insecure.append(url)
    return finding(
        "mixed-content", FAIL if insecure else PASS, _items(insecure) if insecure else {}
    )


def structured_data(tree: LexborHTMLParser) -> dict:
    """Every JSON-LD block parses as JSON; not applicable without one."""
    blocks = [
        node for node in tree.css("script[type]")
        if (node.attributes.get("type") or "").split(";")[0].strip().lower() == "application/ld+json"
    ]  # fmt: skip
    if not blocks:
        return finding("structured-data", NOT_APPLICABLE)
    broken = []
    for number, node in enumerate(blocks, start=1):
        try:
            json.loads(node.text(deep=True))
        except ValueError as exc:
            broken.append({"block": number, "error": str(exc)})
    details = {"blocks": len(blocks), **(_items(broken) if broken else {})}
    return finding("structured-data", FAIL if broken else PASS, details)
