#!/usr/bin/env python
"""What reading a page as a browser does costs, and what hostile pages and the largest
audit cost, as ratios within one run (issues 24 and 26).

    .venv/bin/python bench/page_parsing.py

1. The 30 corpus pages (tests/html_corpus.py): the analysis (sniffing, decoding, lxml,
   WHATWG URLs) against a bare lxml parse of the same bytes, CPU per page.
2. Hostile pages through the analysis: time and the process's peak RSS growth for a
   100,000-link page, a 5 MB binary body (the fetch's cap), 10,000-deep nesting.
3. The admin change page and GET /api/audits/<id> of the largest audit the caps allow
   (AUDIT_MAX_LINKS links of 2048 characters, every link check a row) against those of
   a one-link audit: time and bytes.

Services: a fresh database next to DATABASE_URL's (PostgreSQL, the local one when unset)
or a temporary SQLite file, dropped afterwards.
"""

from __future__ import annotations

import os
import random
import resource
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.services import create_database  # noqa: E402


def timed(function, repeat: int = 5) -> float:
    """Median seconds of `repeat` calls."""
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        function()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def corpus(analyze_html) -> None:
    import lxml.html

    from tests.html_corpus import corpus_pages

    pages = list(corpus_pages().values())

    def analysis():
        for body in pages:
            analyze_html(body, base_url="https://corpus.test/page")

    def bare_lxml():
        for body in pages:
            lxml.html.document_fromstring(body)

    ours, bare = timed(analysis), timed(bare_lxml)
    print("\n### Corpus (30 pages)")
    print(f"analysis {ours / len(pages) * 1000:.2f} ms a page, bare lxml parse "
          f"{bare / len(pages) * 1000:.2f} ms: {ours / bare:.2f}x")  # fmt: skip


def hostile(analyze_html) -> None:
    from tests.hostile_pages import link_stuffed_page

    pages = {
        "100,000 links + a 100,000-char link": link_stuffed_page("other.example", links=100_000),
        "5 MB binary sent as HTML": random.Random(26).randbytes(5 * 1024 * 1024),
        "10,000-deep nesting": ("<title>d</title>" + "<div>" * 10_000 + "</div>" * 10_000).encode(),
        "5 MB of text in one title": b"<title>" + b"word " * (1024 * 1024) + b"</title>",
    }
    print("\n### Hostile pages (one analysis each)")
    print("| page | bytes | seconds | peak RSS growth (MiB) | stored links |")
    print("| --- | --- | --- | --- | --- |")
    for name, body in pages.items():
        before = peak_rss_mib()
        started = time.perf_counter()
        result = analyze_html(body, base_url="https://www.example.org/")
        seconds = time.perf_counter() - started
        print(f"| {name} | {len(body):,} | {seconds:.2f} | {peak_rss_mib() - before:.0f} | "
              f"{len(result['external_links'])} |")  # fmt: skip


def largest_audit() -> None:
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.test import Client
    from django.test.utils import setup_test_environment

    from audits import services, submission
    from audits.models import Audit
    from outbound.urls import MAX_URL_LENGTH, normalize_url
    from tests.hostile_pages import HostilePages, link_stuffed_page

    setup_test_environment()
    settings.AUDIT_ALLOW_PRIVATE_TARGETS = True
    settings.AUDIT_MAX_LINK_CHECKS = 0
    server = HostilePages().start()
    host = f"localhost:{server.server_address[1]}"
    try:
        audits = {}
        for name, path, body in (
            ("one link", "/small", link_stuffed_page(host, links=1)),
            (
                "largest",
                "/largest",
                link_stuffed_page(host, links=settings.AUDIT_MAX_LINKS + 50, length=MAX_URL_LENGTH),
            ),
        ):
            server.pages[path] = (body, None, "text/html")
            page = submission.get_or_create_page(normalize_url(server.url + path))
            audit = Audit.objects.create(page=page, task_id="bench")
            services.execute_audit(str(audit.id))
            audits[name] = Audit.objects.get(id=audit.id)
        admin = get_user_model().objects.create_superuser("bench", "b@example.org", "pw")
        client = Client()
        client.force_login(admin)
        print(f"\n### The largest audit (AUDIT_MAX_LINKS={settings.AUDIT_MAX_LINKS})")
        print("| audit | admin page s | admin bytes | API s | API bytes |")
        print("| --- | --- | --- | --- | --- |")
        measured = {}
        for name, audit in audits.items():
            admin_url = f"/admin/audits/audit/{audit.id}/change/"
            api_url = f"/api/audits/{audit.id}"
            admin_seconds = timed(lambda u=admin_url: client.get(u))
            api_seconds = timed(lambda u=api_url: client.get(u))
            admin_bytes = len(client.get(admin_url).content)
            api_bytes = len(client.get(api_url).content)
            measured[name] = admin_seconds, api_seconds
            print(f"| {name} | {admin_seconds:.3f} | {admin_bytes:,} | {api_seconds:.3f} | "
                  f"{api_bytes:,} |")  # fmt: skip
        print(f"largest / one link: admin {measured['largest'][0] / measured['one link'][0]:.1f}x, "
              f"API {measured['largest'][1] / measured['one link'][1]:.1f}x")  # fmt: skip
    finally:
        server.stop()


def main() -> int:
    database_url, drop_database = create_database()
    os.environ.update({"DATABASE_URL": database_url, "DEBUG": "true"})
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    try:
        import django

        django.setup()
        from django.core.management import call_command

        from audits.analysis import analyze_html

        call_command("migrate", interactive=False, verbosity=0)
        print(f"database {database_url.split('@')[-1]}")
        corpus(analyze_html)
        hostile(analyze_html)
        largest_audit()
    finally:
        from django.db import connections

        connections.close_all()
        drop_database()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
