"""What changed between two succeeded audits of one page, and whether the page got worse.

Plain functions over the result dicts of `audits.analysis.audit_result` (with the
`links` that `audits.linkcheck` adds once the link checks finish). Timings and sizes
(`ttfb_ms`, `total_ms`, `bytes`) differ on every fetch, so they are never a change.
"""

from __future__ import annotations

from collections.abc import Callable

# A change is {"field", "before", "after"}; a set-valued field adds "added" and "removed".
Change = dict

# Fields compared as values, in the order a change list reports them, with how each is
# read from a result.
VALUE_FIELDS: dict[str, Callable[[dict], object]] = {
    "status_code": lambda result: result.get("status_code"),
    "final_url": lambda result: result.get("final_url"),
    "redirect_count": lambda result: len(result.get("redirects") or []),
    "content_type": lambda result: result.get("content_type"),
    "title": lambda result: result.get("title"),
    "meta_description": lambda result: result.get("meta_description"),
    "canonical": lambda result: result.get("canonical"),
    "noindex": lambda result: bool(result.get("noindex")),
    "h1_count": lambda result: result.get("h1_count", 0),
}
MISSING_SECURITY_HEADERS = "missing_security_headers"
BROKEN_LINKS = "broken_links"
FAILING_CHECKS = "failing_checks"
FIELDS = (*VALUE_FIELDS, MISSING_SECURITY_HEADERS, BROKEN_LINKS, FAILING_CHECKS)

# A link whose check said nothing this time (still queued, rate-limited past the
# deadline, over the per-page cap) is neither newly broken nor fixed.
KNOWN_LINK_STATUSES = {"ok", "redirected", "broken"}


def compare(before: dict | None, after: dict) -> list[Change] | None:
    """The changes from `before` (the page's previous succeeded audit) to `after`.

    None when there is no previous result (the page's first succeeded audit); [] when
    nothing that matters changed.
    """
    if before is None:
        return None
    changes: list[Change] = []
    for field, read in VALUE_FIELDS.items():
        old, new = read(before), read(after)
        if old != new:
            changes.append({"field": field, "before": old, "after": new})

    old_missing = set(before.get(MISSING_SECURITY_HEADERS) or [])
    new_missing = set(after.get(MISSING_SECURITY_HEADERS) or [])
    if old_missing != new_missing:
        changes.append(
            _set_change(
                MISSING_SECURITY_HEADERS,
                old_missing,
                new_missing,
                new_missing - old_missing,
                old_missing - new_missing,
            )
        )

    old_broken = broken_links(before)
    new_broken = broken_links(after)
    newly_broken = new_broken - old_broken
    fixed = old_broken - new_broken - unknown_links(after)
    if newly_broken or fixed:
        changes.append(_set_change(BROKEN_LINKS, old_broken, new_broken, newly_broken, fixed))

    # A result from before findings existed has none to compare: not every failing check
    # is new on the first audit that has them.
    if "findings" in before and "findings" in after:
        old_failing, new_failing = failing_checks(before), failing_checks(after)
        started = new_failing - old_failing
        stopped = old_failing - new_failing - unchecked_checks(after)
        if started or stopped:
            changes.append(_set_change(FAILING_CHECKS, old_failing, new_failing, started, stopped))
    return changes


def _set_change(field: str, before: set, after: set, added: set, removed: set) -> Change:
    return {
        "field": field,
        "before": sorted(before),
        "after": sorted(after),
        "added": sorted(added),
        "removed": sorted(removed),
    }


def broken_links(result: dict) -> set[str]:
    return {link["url"] for link in result.get("links") or [] if link.get("status") == "broken"}


def unknown_links(result: dict) -> set[str]:
    return {
        link["url"]
        for link in result.get("links") or []
        if link.get("status") not in KNOWN_LINK_STATUSES
    }


def failing_checks(result: dict) -> set[str]:
    """The ids of the result's findings that fail (audits.findings)."""
    return {item["id"] for item in result.get("findings") or [] if item.get("outcome") == "fail"}


def unchecked_checks(result: dict) -> set[str]:
    """Checks that could not run this time (a tree too deep, a page that is not HTML, no
    robots.txt known): a failure before is not fixed by them."""
    return {
        item["id"]
        for item in result.get("findings") or []
        if item.get("outcome") == "not_applicable" and (item.get("details") or {}).get("reason")
    }


def got_worse(changes: list[Change] | None) -> bool:
    """Whether the changes make the page worse for its owner: a 2xx became an error
    (4xx or 5xx), noindex appeared, a security header disappeared (a header joined
    the missing ones), a link broke, or a check started failing."""
    for change in changes or []:
        field = change["field"]
        if field == "status_code" and _is_success(change["before"]) and _is_error(change["after"]):
            return True
        if field == "noindex" and change["after"] is True:
            return True
        if field in (MISSING_SECURITY_HEADERS, BROKEN_LINKS, FAILING_CHECKS) and change["added"]:
            return True
    return False


def _is_success(status) -> bool:
    return isinstance(status, int) and 200 <= status < 300


def _is_error(status) -> bool:
    return isinstance(status, int) and status >= 400
