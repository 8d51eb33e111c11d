"""A large page's tree is built in a child process with a memory and a time limit
(audits.treebuild): a page that would cost more is read without a tree, and the next
page's tree is built as before."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
from celery.concurrency.thread import TaskPool as ThreadPool

from audits import analysis, treebuild
from audits.bootsteps import TreeBuilders
from tests.hostile_pages import distinct_attributes, one_tag_page
from tests.workers import wait_for

PAGE = "https://example.test/"
# A real page's shape past AUDIT_TREE_IN_PROCESS_MAX_BYTES (64 KiB): its tree is built
# by a child.
LARGE_PAGE = (
    "<title>Large</title>" + '<p class="x"><a href="/a">a link</a> text</p>' * 2000
).encode()


def link_text(result: dict) -> dict:
    return next(f for f in result["findings"] if f["id"] == "link-text")


@pytest.fixture
def tree_builders():
    treebuild.start(1, memory_mb=128)
    yield
    treebuild.stop()


def test_a_tree_built_by_a_child_is_the_tree_built_here():
    here = analysis.analyze_html(LARGE_PAGE, base_url=PAGE)
    treebuild.start(1, memory_mb=128)
    try:
        assert treebuild.running()
        assert analysis.analyze_html(LARGE_PAGE, base_url=PAGE) == here
    finally:
        treebuild.stop()
    assert here["title"] == "Large"
    assert link_text(here)["outcome"] != "not_applicable"


def test_a_tag_of_80000_distinct_attributes_ends_at_the_childs_deadline(tree_builders, settings):
    # Parsed here it takes tens of seconds of C code no time limit can interrupt.
    settings.AUDIT_TREE_SECONDS = 1.0
    started = time.monotonic()
    result = analysis.analyze_html(one_tag_page(distinct_attributes(80_000)), base_url=PAGE)
    assert time.monotonic() - started < 8
    assert result["title"] == "Attributes"
    assert link_text(result)["details"] == {"reason": "too_costly_for_a_tree"}
    # The child was replaced: the next large page gets its tree.
    assert link_text(analysis.analyze_html(LARGE_PAGE, base_url=PAGE))["outcome"] != (
        "not_applicable"
    )


def test_a_tag_of_5_mib_of_duplicate_attributes_ends_at_the_childs_memory(tree_builders):
    # 196 MiB in one process; the child has 128 MiB.
    body = one_tag_page(b" a" * (5 * 1024 * 1024 // 2), title="Duplicates")
    result = analysis.analyze_html(body, base_url=PAGE)
    assert result["title"] == "Duplicates"
    assert link_text(result)["details"] == {"reason": "too_costly_for_a_tree"}
    assert link_text(analysis.analyze_html(LARGE_PAGE, base_url=PAGE))["outcome"] != (
        "not_applicable"
    )


def test_a_page_within_the_in_process_bound_is_built_here(tree_builders, monkeypatch):
    def no_child(*args, **kwargs):
        raise AssertionError("a small page went to a child")

    monkeypatch.setattr(treebuild, "build", no_child)
    small = b"<title>Small</title><p><a href='/a'>a link</a></p>"
    assert analysis.analyze_html(small, base_url=PAGE)["title"] == "Small"
    with pytest.raises(AssertionError, match="went to a child"):
        analysis.analyze_html(LARGE_PAGE, base_url=PAGE)


def test_a_clients_costly_pages_wait_their_turn_behind_another_clients_page(
    tree_builders, settings
):
    # One child: a client holds it with one page at a time, and another client's page
    # queued meanwhile goes before that client's next. Without the turn, it went last.
    settings.AUDIT_TREE_SECONDS = 1.0
    finished = []

    def audit(client: str, body: bytes, name: str) -> None:
        analysis.analyze_html(body, base_url=PAGE, client=client)
        finished.append(name)

    hostile = [
        threading.Thread(
            target=audit, args=("ip:hostile", one_tag_page(distinct_attributes(80_000)), n)
        )
        for n in ("hostile 1", "hostile 2", "hostile 3")
    ]
    for thread in hostile:
        thread.start()
    wait_for(lambda: treebuild.holding("ip:hostile") == 1, timeout=10)
    other = threading.Thread(target=audit, args=("ip:other", LARGE_PAGE, "other"))
    other.start()
    for thread in [*hostile, other]:
        thread.join(timeout=30)
    # Before the client's second and third page, whichever threads they were (its first
    # may still be read without a tree when the other's is done).
    after_other = finished[finished.index("other") + 1 :]
    assert len([name for name in after_other if name.startswith("hostile")]) >= 2, finished
    assert treebuild.holding("ip:hostile") == 0


def test_many_clients_costly_pages_hold_no_page_past_its_wait(tree_builders, settings):
    # Six clients' pages each hold the one child for its whole deadline (1 s, and 0.5 s to
    # kill it): unbounded, the last page waited about 9 s, past any audit's time limit,
    # which cannot interrupt the wait. Each page now waits at most 2 s for a child.
    settings.AUDIT_TREE_SECONDS = 1.0
    settings.AUDIT_TREE_WAIT_SECONDS = 2.0
    costly = one_tag_page(distinct_attributes(80_000))
    ended: dict[str, tuple[float, str]] = {}
    started = time.monotonic()

    def audit(client: str, body: bytes) -> None:
        result = analysis.analyze_html(body, base_url=PAGE, client=client)
        reason = link_text(result).get("details", {}).get("reason", "tree built")
        ended[client] = (time.monotonic() - started, reason)

    threads = [threading.Thread(target=audit, args=(f"ip:hostile-{n}", costly)) for n in range(6)]
    for thread in threads:
        thread.start()
    wait_for(lambda: sum(treebuild.holding(f"ip:hostile-{n}") for n in range(6)) == 6, timeout=10)
    other = threading.Thread(target=audit, args=("ip:other", LARGE_PAGE))
    other.start()
    for thread in [*threads, other]:
        thread.join(timeout=30)
    # The wait, the child's deadline and its kill, and room for a slow machine.
    assert max(seconds for seconds, _ in ended.values()) < 2.0 + 1.5 + 2.5, ended
    assert ended["ip:other"][1] == "tree_builders_busy", ended
    assert {reason for _, reason in ended.values()} == {
        "too_costly_for_a_tree",
        "tree_builders_busy",
    }
    # The cancelled pages left the builder working: the next large page gets its tree.
    assert link_text(analysis.analyze_html(LARGE_PAGE, base_url=PAGE))["outcome"] != (
        "not_applicable"
    )


def test_a_clients_page_waits_for_its_turn_only_as_long_as_its_wait(tree_builders, settings):
    settings.AUDIT_TREE_SECONDS = 2.0
    settings.AUDIT_TREE_WAIT_SECONDS = 0.5
    holder = threading.Thread(
        target=analysis.analyze_html,
        args=(one_tag_page(distinct_attributes(80_000)),),
        kwargs={"base_url": PAGE, "client": "ip:one"},
    )
    holder.start()
    wait_for(lambda: treebuild.holding("ip:one") == 1, timeout=10)
    began = time.monotonic()
    result = analysis.analyze_html(LARGE_PAGE, base_url=PAGE, client="ip:one")
    assert time.monotonic() - began < 2.0
    assert link_text(result)["details"] == {"reason": "tree_builders_busy"}
    holder.join(timeout=30)


def test_a_warm_shutdown_stops_the_builders_once_the_pools_running_audits_have_finished():
    # Celery stops the steps in the reverse of their start order: the builders' step,
    # started after the pool, is stopped before it, and its stop lets the pool's running
    # audits finish first. Stopped at once, this page lost its child mid-build.
    pool = ThreadPool(limit=2)
    pool.start()
    worker = SimpleNamespace(pool=pool)
    step = TreeBuilders(worker)
    step.start(worker)
    results = []

    def audit():
        page = one_tag_page(distinct_attributes(20_000), title="Slow tree")
        results.append(analysis.analyze_html(page, base_url=PAGE))

    try:
        pool.apply_async(audit)
        wait_for(lambda: treebuild.holding("") == 1, timeout=10)
        step.stop(worker)
    finally:
        pool.stop()
        treebuild.stop()
    assert not treebuild.running()
    (result,) = results
    assert result["title"] == "Slow tree"
    assert "reason" not in link_text(result).get("details", {})
