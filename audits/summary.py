"""An audit as something that must stay small carries it (a webhook payload): its link
lists cut to a count, problems first, the rest left to the counts the result already
has (`link_counts`, `links_over_cap`, `link_check.outcomes`) and to the full audit.
"""

from __future__ import annotations

# Broken links first, then any other outcome that is not plainly fine, then the fine ones.
_ORDER = {"broken": 0, "ok": 2}


def abridged_result(result: dict | None, max_links: int) -> dict | None:
    """`result` with at most `max_links` entries in `links` (broken first, then other
    problems, then ok; by URL within each) and in `external_links` (those listed in
    `links` first); `links_truncated` is true when either was cut."""
    if not result:
        return result
    links = result.get("links") or []
    external = result.get("external_links") or []
    if len(links) <= max_links and len(external) <= max_links:
        return result
    listed = sorted(links, key=lambda link: (_ORDER.get(link.get("status"), 1), link["url"]))
    listed = listed[:max_links]
    shown = {link["url"] for link in listed}
    return {
        **result,
        "links": listed,
        "external_links": sorted(sorted(external, key=lambda url: url not in shown)[:max_links]),
        "links_truncated": True,
    }


def abridged_changes(changes: list[dict] | None, max_links: int) -> list[dict] | None:
    """Each list of a change (`broken_links`' before, after, added, removed) cut to
    `max_links` items."""
    if not changes:
        return changes
    return [
        {
            key: value[:max_links] if isinstance(value, list) else value
            for key, value in change.items()
        }
        for change in changes
    ]
