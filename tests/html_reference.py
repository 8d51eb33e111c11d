"""What a browser reads from a page: html5lib's WHATWG tree construction, the reference
the analysis is compared with (tests/test_page_parsing.py).

It takes the text the analysis decoded (the same sniffing: audits.analysis.decode_page),
so the comparison is of parsing and reading, and reads the fields as the DOM defines them:
`document.title` (the first title element in the HTML namespace, ASCII whitespace stripped
and collapsed), the first `<base href>` as the document's base URL, `<a href>` elements
in the HTML namespace, and nothing inside `<noscript>` (a browser runs with scripting
on, where its content is text).
"""

from __future__ import annotations

import html5lib

from audits.analysis import resolve_link

HTML = "{http://www.w3.org/1999/xhtml}"
ASCII_WHITESPACE = "\t\n\x0c\r "


def collapse(text: str) -> str:
    return " ".join(part for part in _split_ascii_whitespace(text) if part)


def _split_ascii_whitespace(text: str) -> list[str]:
    for char in ASCII_WHITESPACE[:-1]:
        text = text.replace(char, " ")
    return text.split(" ")


def browser_fields(text: str, *, url: str) -> dict:
    root = html5lib.parse(text, treebuilder="etree", namespaceHTMLElements=True)
    # html5lib parses with scripting off, so `<noscript>` content becomes elements; a
    # browser (and the analysis, scripting on) reads it as text: left out here.
    in_noscript = {
        id(inner)
        for noscript in root.iter(f"{HTML}noscript")
        for inner in noscript.iter()
        if inner is not noscript
    }
    elements = [el for el in root.iter() if id(el) not in in_noscript]
    title = next((el for el in elements if el.tag == f"{HTML}title"), None)
    base_href = next(
        (
            el.get("href")
            for el in elements
            if el.tag == f"{HTML}base" and el.get("href") is not None
        ),
        None,
    )
    base = resolve_link(url, base_href) or url if base_href is not None else url
    description = canonical = None
    seen_canonical = False
    robots = []
    for el in elements:
        if el.tag == f"{HTML}meta":
            name = (el.get("name") or "").lower()
            if name == "description" and description is None:
                description = (el.get("content") or "").strip()
            elif name in {"robots", "googlebot"}:
                robots.append((el.get("content") or "").lower())
        elif el.tag == f"{HTML}link" and not seen_canonical and _is_canonical(el):
            seen_canonical = True
            href = el.get("href")
            canonical = resolve_link(base, href, keep_fragment=True) if href else None
    own_host = url.split("/")[2]
    external = set()
    for el in elements:
        if el.tag == f"{HTML}a" and el.get("href") is not None:
            href = el.get("href").strip()
            if not href or href.startswith("#"):
                continue
            target = resolve_link(base, href)
            if target and target.split("/")[2] != own_host:
                external.add(target)
    return {
        "title": collapse("".join(title.itertext())) if title is not None else None,
        "meta_description": description,
        "canonical": canonical,
        "noindex": any("noindex" in content for content in robots),
        "h1_count": sum(el.tag == f"{HTML}h1" for el in elements),
        "external_links": sorted(external),
    }


def _is_canonical(link) -> bool:
    return "canonical" in (link.get("rel") or "").lower().split()
