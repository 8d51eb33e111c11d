"""What changed since the page's previous succeeded audit: the plain functions (no database)."""

from __future__ import annotations

import copy

import pytest

from audits.changes import compare, got_worse


def result(**overrides) -> dict:
    """A succeeded audit's result, as audits.analysis and audits.linkcheck store it."""
    base = {
        "requested_url": "https://example.org/",
        "final_url": "https://example.org/",
        "redirects": [],
        "status_code": 200,
        "ttfb_ms": 41,
        "total_ms": 80,
        "bytes": 5120,
        "truncated": False,
        "content_type": "text/html",
        "is_html": True,
        "missing_security_headers": ["content-security-policy"],
        "title": "Home",
        "meta_description": "The home page.",
        "canonical": "https://example.org/",
        "noindex": False,
        "h1_count": 1,
        "link_counts": {"internal": 3, "external": 2},
        "external_links": ["https://a.example/", "https://b.example/"],
        "links": [
            {"url": "https://a.example/", "status": "ok", "status_code": 200},
            {"url": "https://b.example/", "status": "broken", "status_code": 404},
        ],
    }
    base.update(overrides)
    return base


def test_a_pages_first_succeeded_audit_has_no_changes_to_report():
    assert compare(None, result()) is None


def test_an_unchanged_page_has_an_empty_list():
    assert compare(result(), copy.deepcopy(result())) == []


def test_timings_and_sizes_are_never_changes():
    later = result(ttfb_ms=900, total_ms=2400, bytes=6000, truncated=True)
    later["link_counts"] = {"internal": 9, "external": 2}
    assert compare(result(), later) == []


@pytest.mark.parametrize(
    ("overrides", "field", "before", "after"),
    [
        ({"status_code": 503}, "status_code", 200, 503),
        ({"final_url": "https://example.org/home"}, "final_url", "https://example.org/", "https://example.org/home"),
        ({"redirects": [{"status": 301, "url": "https://example.org/"}]}, "redirect_count", 0, 1),
        ({"content_type": "application/pdf"}, "content_type", "text/html", "application/pdf"),
        ({"title": "Welcome"}, "title", "Home", "Welcome"),
        ({"meta_description": None}, "meta_description", "The home page.", None),
        ({"canonical": "https://example.org/en/"}, "canonical", "https://example.org/", "https://example.org/en/"),
        ({"noindex": True}, "noindex", False, True),
        ({"h1_count": 2}, "h1_count", 1, 2),
    ],
)  # fmt: skip
def test_each_value_field_reports_before_and_after(overrides, field, before, after):
    assert compare(result(), result(**overrides)) == [
        {"field": field, "before": before, "after": after}
    ]


def test_security_headers_missing_are_reported_added_and_removed():
    later = result(missing_security_headers=["referrer-policy", "x-content-type-options"])
    assert compare(result(), later) == [
        {
            "field": "missing_security_headers",
            "before": ["content-security-policy"],
            "after": ["referrer-policy", "x-content-type-options"],
            "added": ["referrer-policy", "x-content-type-options"],
            "removed": ["content-security-policy"],
        }
    ]


def test_broken_links_are_reported_new_and_fixed():
    later = result(
        links=[
            {"url": "https://a.example/", "status": "broken", "status_code": 500},
            {"url": "https://b.example/", "status": "ok", "status_code": 200},
        ]
    )
    assert compare(result(), later) == [
        {
            "field": "broken_links",
            "before": ["https://b.example/"],
            "after": ["https://a.example/"],
            "added": ["https://a.example/"],
            "removed": ["https://b.example/"],
        }
    ]


def test_a_broken_link_whose_check_said_nothing_this_time_is_not_fixed():
    later = result(
        links=[
            {"url": "https://a.example/", "status": "ok"},
            {"url": "https://b.example/", "status": "rate_limited_pending", "finished": False},
        ]
    )
    assert compare(result(), later) == []


def test_a_broken_link_taken_off_the_page_is_fixed():
    later = result(links=[{"url": "https://a.example/", "status": "ok"}])
    (change,) = compare(result(), later)
    assert change["field"] == "broken_links" and change["removed"] == ["https://b.example/"]
    assert change["added"] == []


def test_a_page_without_link_checks_compares_its_other_fields():
    before = result(links=None)
    del before["links"]
    assert compare(before, result(links=[])) == []


@pytest.mark.parametrize(
    ("overrides", "worse"),
    [
        ({"status_code": 500}, True),
        ({"status_code": 404}, True),
        ({"status_code": 204}, False),
        ({"noindex": True}, True),
        ({"missing_security_headers": ["content-security-policy", "referrer-policy"]}, True),
        ({"missing_security_headers": []}, False),
        ({"links": [{"url": "https://a.example/", "status": "broken"}]}, True),
        ({"links": [{"url": "https://a.example/", "status": "ok"}]}, False),
        ({"title": "Renamed", "h1_count": 0}, False),
    ],
)
def test_what_counts_as_worse(overrides, worse):
    assert got_worse(compare(result(), result(**overrides))) is worse


def test_an_error_that_recovers_is_not_worse():
    assert got_worse(compare(result(status_code=500), result(status_code=200))) is False
    assert got_worse(None) is False and got_worse([]) is False


# --- Findings (issue 34.1) -------------------------------------------------------------


def findings(**outcomes) -> list[dict]:
    """Findings with the given outcomes by check id (underscores for dashes); the rest pass."""
    from audits.findings import CHECK_IDS, finding

    chosen = {check.replace("_", "-"): outcome for check, outcome in outcomes.items()}
    return [finding(check, chosen.get(check, "pass")) for check in CHECK_IDS]


def test_a_check_that_starts_failing_is_a_change_and_makes_the_page_worse():
    before = result(findings=findings())
    after = result(findings=findings(image_alt="fail", canonical="fail"))
    changes = compare(before, after)
    assert changes == [
        {
            "field": "failing_checks",
            "before": [],
            "after": ["canonical", "image-alt"],
            "added": ["canonical", "image-alt"],
            "removed": [],
        }
    ]
    assert got_worse(changes) is True


def test_a_check_that_stops_failing_is_a_change_not_worse():
    changes = compare(result(findings=findings(viewport="fail")), result(findings=findings()))
    assert changes == [
        {"field": "failing_checks", "before": ["viewport"], "after": [], "added": [],
         "removed": ["viewport"]}
    ]  # fmt: skip
    assert got_worse(changes) is False


def test_a_check_that_could_not_run_is_not_a_fix_and_a_result_without_findings_compares_none():
    from audits.findings import finding

    unchecked = findings()
    unchecked[2] = finding("document-title", "not_applicable", {"reason": "too_deep"})
    assert (
        compare(result(findings=findings(document_title="fail")), result(findings=unchecked)) == []
    )
    # A result from before findings existed: its page's first findings are no change.
    assert compare(result(), result(findings=findings(viewport="fail"))) == []
