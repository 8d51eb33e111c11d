"""Where each page falls in the night: deterministic, spread across domains, spaced within one."""

from __future__ import annotations

import subprocess
import sys
from datetime import date

from reaudit.offsets import domain_offset, page_offset, slice_count, slice_of
from tests.workers import ROOT

DAY = date(2030, 1, 15)
WINDOW = 21600


def test_a_domain_gets_the_same_offset_for_the_same_day_in_any_process():
    here = domain_offset("example.org", DAY, WINDOW)
    elsewhere = subprocess.run(
        [
            sys.executable,
            "-c",
            "from datetime import date; from reaudit.offsets import domain_offset; "
            "print(repr(domain_offset('example.org', date(2030, 1, 15), 21600)))",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert here == float(elsewhere)
    assert 0 <= here < WINDOW


def test_a_domain_moves_from_one_night_to_the_next():
    domains = [f"site{i}.example" for i in range(50)]
    tonight = [domain_offset(d, DAY, WINDOW) for d in domains]
    tomorrow = [domain_offset(d, date(2030, 1, 16), WINDOW) for d in domains]
    assert sum(a != b for a, b in zip(tonight, tomorrow, strict=True)) == 50


def test_domains_spread_evenly_over_the_window():
    offsets = [domain_offset(f"site{i}.example", DAY, WINDOW) for i in range(5000)]
    tenths = [0] * 10
    for offset in offsets:
        tenths[int(offset / WINDOW * 10)] += 1
    assert all(400 <= count <= 600 for count in tenths), tenths


def test_a_domains_pages_follow_its_offset_one_spacing_apart():
    first = 100.0
    offsets = [
        page_offset(first, rank, spacing_seconds=10, window_seconds=WINDOW) for rank in range(5)
    ]
    assert offsets == [100.0, 110.0, 120.0, 130.0, 140.0]


def test_a_domain_longer_than_the_window_wraps_round_inside_it():
    offsets = [page_offset(50.0, rank, spacing_seconds=30, window_seconds=100) for rank in range(5)]
    assert offsets == [50.0, 80.0, 10.0, 40.0, 70.0]


def test_every_offset_falls_in_a_slice_of_the_window():
    assert slice_count(21600, 600) == 36
    assert slice_count(100, 30) == 4
    assert slice_count(5, 600) == 1
    assert slice_of(0.0, 600, 36) == 0
    assert slice_of(599.999, 600, 36) == 0
    assert slice_of(600.0, 600, 36) == 1
    assert slice_of(21599.9999999, 600, 36) == 35
    assert slice_of(99.9, 30, 4) == 3
