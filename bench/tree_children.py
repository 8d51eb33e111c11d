#!/usr/bin/env python
"""What building a large page's tree in a child process costs, and what it bounds
(audits.treebuild), as ratios within one run.

    .venv/bin/python bench/tree_children.py

1. The corpus pages past AUDIT_TREE_IN_PROCESS_MAX_BYTES (tests/html_corpus.py): the
   analysis with its tree built here, then by one child, rounds alternating: CPU a page
   (this process and the children together, from /proc) and wall time.
2. One tag of n distinct attributes (Lexbor's tree costs their square): seconds here
   (up to 40,000) and with a child given AUDIT_TREE_SECONDS.
3. One tag of 5 MiB of duplicate attributes, of `"` attributes and of `/`: a process's
   peak RSS growth when it builds the tree itself (a process of its own each); with a
   child, this process's and the child's (VmHWM).

No services: the analysis needs none.
"""

from __future__ import annotations

import os
import resource
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.services import family_cpu_seconds  # noqa: E402
from tests.hostile_pages import distinct_attributes, one_tag_page  # noqa: E402

ROUNDS = 3


def setup():
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("DEBUG", "false")
    os.environ.setdefault("SECRET_KEY", "bench-tree-children-" + "abcdefghij" * 4)
    import django

    django.setup()


def corpus(analyze_html, treebuild, settings) -> None:
    from tests.html_corpus import corpus_pages

    large = [
        b for b in corpus_pages().values() if len(b) > settings.AUDIT_TREE_IN_PROCESS_MAX_BYTES
    ]
    # Each five times a round: /proc counts CPU in 10 ms ticks.
    pages = large * 5

    def run() -> tuple[float, float]:
        cpu, wall = family_cpu_seconds(os.getpid()), time.perf_counter()
        for body in pages:
            analyze_html(body, base_url="https://corpus.test/page")
        return (family_cpu_seconds(os.getpid()) - cpu) / len(pages), (
            time.perf_counter() - wall
        ) / len(pages)

    here, child = [], []
    for _ in range(ROUNDS):
        here.append(run())
        treebuild.start(1, memory_mb=settings.AUDIT_TREE_MEMORY_MB)
        try:
            run()  # the child's first pages import what the fork server did not
            child.append(run())
        finally:
            treebuild.stop()
    print(f"\n### Corpus pages past {settings.AUDIT_TREE_IN_PROCESS_MAX_BYTES // 1024} KiB "
          f"({len(large)} of 30, each 5 times a round), {ROUNDS} rounds")  # fmt: skip
    print("| round | CPU ms a page: here / child | ratio | wall ms a page: here / child |")
    print("| --- | --- | ---: | --- |")
    for n, ((cpu_h, wall_h), (cpu_c, wall_c)) in enumerate(zip(here, child, strict=True), 1):
        print(f"| {n} | {cpu_h * 1000:.2f} / {cpu_c * 1000:.2f} | {cpu_c / cpu_h:.2f}x | "
              f"{wall_h * 1000:.2f} / {wall_c * 1000:.2f} |")  # fmt: skip
    ratio = statistics.median(c[0] / h[0] for h, c in zip(here, child, strict=True))
    print(f"median CPU ratio, child / here: {ratio:.2f}x")


def reason(result: dict) -> str:
    link_text = next(f for f in result["findings"] if f["id"] == "link-text")
    return link_text.get("details", {}).get("reason", "tree built")


def attributes(analyze_html, treebuild, settings) -> None:
    print(
        f"\n### One tag of n distinct attributes (the child given {settings.AUDIT_TREE_SECONDS:g} s)"
    )
    print("| n | bytes | seconds here | seconds with a child | read with a child |")
    print("| ---: | ---: | ---: | ---: | --- |")
    treebuild.start(1, memory_mb=settings.AUDIT_TREE_MEMORY_MB)
    try:
        for count in (10_000, 20_000, 40_000, 80_000, 600_000):
            body = one_tag_page(distinct_attributes(count), title="A")
            if count <= 40_000:
                treebuild.stop()
                started = time.perf_counter()
                analyze_html(body, base_url="https://a.test/")
                here = f"{time.perf_counter() - started:.2f}"
                treebuild.start(1, memory_mb=settings.AUDIT_TREE_MEMORY_MB)
            else:
                here = "not run (minutes to hours)"
            started = time.perf_counter()
            result = analyze_html(body, base_url="https://a.test/")
            print(f"| {count:,} | {len(body):,} | {here} | {time.perf_counter() - started:.2f} | "
                  f"{reason(result)} |")  # fmt: skip
    finally:
        treebuild.stop()


SHAPES = {
    "duplicate attributes (` a`)": b" a",
    'attributes named `"` (` "`)': b' "',
    "solidi (`/`)": b"/",
}


def shaped(piece: bytes) -> bytes:
    return one_tag_page(piece * (5 * 1024 * 1024 // len(piece)), title="M")


def growth_here(name: str) -> float:
    """A process's peak RSS growth while it builds the tree of `name`'s page itself: each in
    a process of its own, since a peak stays; the largest of three (it moved by a third
    from one process to the next, with where the allocator put Lexbor's growing arrays)."""
    import subprocess

    def once() -> float:
        out = subprocess.run(
            [sys.executable, __file__, "--growth-here", name], capture_output=True, text=True,
            check=True,
        )  # fmt: skip
        return float(out.stdout.split()[-1])

    return max(once() for _ in range(3))


def vm_hwm_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) / 1024 for line in status if line.startswith("VmHWM:"))


def builders() -> list[int]:
    """The tree builders' pids: the fork server's children."""
    import psutil

    return [p.pid for server in psutil.Process().children() for p in server.children()]


def memory(analyze_html, treebuild, settings, here: dict[str, float]) -> None:
    print(f"\n### One tag of 5 MiB (the child given {settings.AUDIT_TREE_MEMORY_MB} MiB)")
    print(
        "| markup | growth here (MiB) | with a child: growth here / the child's (MiB) | read with a child |"
    )
    print("| --- | ---: | --- | --- |")
    for name, piece in SHAPES.items():
        treebuild.start(1, memory_mb=settings.AUDIT_TREE_MEMORY_MB)
        try:
            (child,) = builders()
            child_before = vm_hwm_mib(child)
            before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            result = analyze_html(shaped(piece), base_url="https://a.test/")
            grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
            # The child that built it, or the one that replaced it (then its peak is gone).
            children = builders()
            child_grown = vm_hwm_mib(child) - child_before if child in children else None
        finally:
            treebuild.stop()
        shown = "killed" if child_grown is None else f"{child_grown:.1f}"
        print(f"| {name} | {here[name]:.1f} | {grown:.1f} / {shown} | {reason(result)} |")


def main() -> int:
    setup()
    if sys.argv[1:2] == ["--growth-here"]:
        from audits.analysis import analyze_html

        analyze_html(b"<title>warm</title><p>x</p>", base_url="https://a.test/")
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        analyze_html(shaped(SHAPES[sys.argv[2]]), base_url="https://a.test/")
        print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024)
        return 0
    from django.conf import settings

    from audits import treebuild
    from audits.analysis import analyze_html

    # First, before any builder runs: once one had, the same measurement in a fresh
    # process read lower, by up to all of it (the VM reclaims memory: kdamond runs here).
    here = {name: growth_here(name) for name in SHAPES}
    analyze_html(b"<title>warm</title><p>x</p>", base_url="https://a.test/")
    corpus(analyze_html, treebuild, settings)
    attributes(analyze_html, treebuild, settings)
    memory(analyze_html, treebuild, settings, here)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
