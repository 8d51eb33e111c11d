#!/usr/bin/env python
"""What an audit costs PostgreSQL on disk, and whether retention stops the growth.

    .venv/bin/python bench/retention.py [--pages 10000] [--nights 100] [--horizon 30]
                                        [--links 20] [--shared 0.8]

In a PostgreSQL database of its own (created next to DATABASE_URL's, the local server
when it is not set, and dropped at the end), it simulates `--nights` nights of
re-audits of `--pages` pages: each night bulk-inserts, in SQL, with `created_at` set to
that night, what a night writes (one succeeded audit a page, with a result shaped like
`audits.analysis.audit_result` plus its `links`; `--links` link-check rows an audit,
each pointing at its link's `SharedLink`; a placement a page, the night's fan-out and
slices; an `audit.changed` delivery for one page in twenty; rate-limit observations; a
few replayed dead letters). The links are shared as a site's are: `--shared` of an
audit's links (4 of 5, 16 of 20) are its domain's, the same on every page of it (a
footer), the rest the page's own; a page lists the same links every night. Each
distinct link is one `SharedLink` row, inserted the first night and updated in place
each night after (the night's one check, since its outcome is fresh for a day), its
`checked_at` when that check finished, for the first audit of the night to list it.
Then it runs the registered prune (jobs.retention.prune_all, the daily task's loop) as
of noon the next day, with every horizon at `--horizon` days (placements at their
default, a day), and a VACUUM ANALYZE of the tables, standing in for autovacuum (off on
the development machine; without statistics, a batch of audits deletes its link checks
by a scan of the whole table, DECISIONS.md "Retention"). It records the total relation
size (heap, TOAST, indexes) after each night.

Bytes per audit, per link check and per shared link are the size deltas of the first
night, per row: `pg_total_relation_size` of the tables, split into heap, TOAST and indexes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.services import create_database  # noqa: E402

FIRST_NIGHT = datetime(2030, 1, 1, 2, 0, tzinfo=UTC)
DOMAINS = 100
# The result's fields that only the page's analysis writes (audits.analysis.analyze_html),
# taken from one analysis of the benchmark site's page (bench.fast_site), read as this URL.
ANALYSIS_ONLY = ("findings", "crawl_directives", "encoding", "links_over_cap", "links_too_long",
                 "links_truncated")  # fmt: skip
PAGE_URL = "https://www.site1.example/articles/page"
SLICES = 36
OBSERVATIONS_PER_NIGHT = 500
DEAD_LETTERS_PER_NIGHT = 5
TABLES = {
    "audits": "audits_audit",
    "link checks": "audits_linkcheck",
    "shared links": "audits_sharedlink",
    "deliveries": "webhooks_delivery",
    "placements": "reaudit_placement",
    "nights": "reaudit_fanout",
    "slices": "reaudit_slicerun",
    "observations": "ratelimit_ratelimitobservation",
    "dead letters": "jobs_deadletter",
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=10_000)
    parser.add_argument("--nights", type=int, default=100)
    parser.add_argument("--horizon", type=int, default=30, help="days every kind is kept")
    parser.add_argument(
        "--links", type=int, default=20, help="link checks an audit, to measure bytes a row"
    )
    parser.add_argument(
        "--sim-links",
        type=int,
        default=5,
        help="link checks an audit in the nights' simulation (fewer, to keep it to minutes)",
    )
    parser.add_argument(
        "--shared",
        type=float,
        default=0.8,
        help="share of an audit's links that are its domain's, on every page of it (a footer)",
    )
    parser.add_argument(
        "--batch-size", type=int, default=None, help="rows a batch (RETENTION_BATCH_SIZE)"
    )
    args = parser.parse_args()

    database_url, drop_database = create_database(sqlite_fallback=False)
    os.environ.update({"DATABASE_URL": database_url, "DEBUG": "true"})
    try:
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", interactive=False, verbosity=0)
        print(f"database {database_url}", flush=True)
        run(args)
    finally:
        from django.db import connections

        connections.close_all()
        drop_database()
    return 0


def run(args) -> None:
    from django.conf import settings
    from django.db import connection

    from audits.analysis import analyze_html
    from bench.fast_site import PAGE
    from jobs import retention

    # What a real audit's result holds beyond the fields written below (its findings, a
    # twelfth of a kilobyte each, and the rest), as analysis writes it for a small page.
    args.analysis = json.dumps({
        name: value for name, value in analyze_html(PAGE.encode(), base_url=PAGE_URL).items()
        if name in ANALYSIS_ONLY
    })  # fmt: skip
    for name in (
        "AUDIT_RETENTION_DAYS", "LINK_CHECK_RETENTION_DAYS", "WEBHOOK_DELIVERY_RETENTION_DAYS",
        "RATELIMIT_OBSERVATION_RETENTION_DAYS", "DEAD_LETTER_RETENTION_DAYS",
        "REAUDIT_NIGHT_RETENTION_DAYS",
    ):  # fmt: skip
        setattr(settings, name, args.horizon)
    if args.batch_size:
        settings.RETENTION_BATCH_SIZE = args.batch_size

    with connection.cursor() as cursor:
        insert_pages(cursor, args.pages)
        # Bytes a row: one night at the realistic link count, then a clean start.
        rows_before = table_rows()
        insert_night(cursor, 0, FIRST_NIGHT, args, links=args.links)
        first_night = breakdown(rows_before)
        cursor.execute("TRUNCATE " + ", ".join(t for t in TABLES.values()))
    sizes: list[dict[str, int]] = []
    per_night = []
    started = time.monotonic()
    for night in range(args.nights):
        at = FIRST_NIGHT + timedelta(days=night)
        t0 = time.monotonic()
        with connection.cursor() as cursor:
            insert_night(cursor, night, at, args, links=args.sim_links)
        t1 = time.monotonic()
        results = retention.prune_all(now=at.replace(hour=12))
        t2 = time.monotonic()
        vacuum()
        t3 = time.monotonic()
        deleted = sum(r.deleted + sum(r.cascaded.values()) for r in results)
        sizes.append(table_sizes())
        per_night.append((t1 - t0, t2 - t1, t3 - t2, deleted))
        by_kind = {r.kind: r.deleted + sum(r.cascaded.values()) for r in results}
        if night % 10 == 9 or night == args.nights - 1:
            total = sum(sizes[-1].values())
            print(
                f"night {night + 1:3d}: {total / 2**20:8.1f} MiB, audits "
                f"{count('audits_audit'):,}, shared links {count('audits_sharedlink'):,}, "
                f"pruned {deleted:,} rows in {t2 - t1:.1f} s "
                f"(vacuum {t3 - t2:.1f} s), {time.monotonic() - started:.0f} s so far",
                flush=True,
            )
    report(args, first_night, sizes, per_night, by_kind)


def insert_pages(cursor, pages: int) -> None:
    cursor.execute(
        """
        INSERT INTO audits_page (url, domain, reaudit_nightly, created_at, callback_url,
                                 callback_secret, public_id, failing_checks)
        SELECT 'https://www.site' || (n %% %(domains)s) || '.example/articles/'
                   || substr(md5(n::text), 1, 16) || '-' || n,
               'www.site' || (n %% %(domains)s) || '.example', true, %(at)s,
               CASE WHEN n %% 20 = 0 THEN 'https://hooks.example/plumb/' || n ELSE '' END,
               CASE WHEN n %% 20 = 0 THEN md5(n::text) ELSE '' END,
               gen_random_uuid(), '[]'
        FROM generate_series(1, %(pages)s) n
        """,
        {"pages": pages, "domains": DOMAINS, "at": FIRST_NIGHT - timedelta(days=1)},
    )


def insert_night(cursor, night: int, at: datetime, args, *, links: int) -> None:
    """One night's rows, as the fan-out, the placements, the audits and their link checks,
    the deliveries and the outbound calls write them, during the night from `at`."""
    day = at.date()
    shared = round(links * args.shared)
    params = {"at": at, "day": day, "links": links, "shared": shared, "night": night,
              "analysis": args.analysis}  # fmt: skip
    cursor.execute(
        """
        INSERT INTO reaudit_fanout (day, window_start, window_seconds, slice_seconds,
                                    spacing_seconds, pages, slice_sizes, created_at, finished_at)
        VALUES (%(day)s, %(at)s, 21600, 600, 10, %(pages)s,
                (SELECT jsonb_agg(%(pages)s / 36) FROM generate_series(1, 36)),
                %(at)s, %(at)s + interval '6 hours')
        RETURNING id
        """,
        {**params, "pages": args.pages},
    )
    (fan_out_id,) = cursor.fetchone()
    cursor.execute(
        """
        INSERT INTO reaudit_slicerun (fan_out_id, index, planned_at, starts_at, published_at,
                                      placements, next_scheduled_at)
        SELECT %(fan_out)s, i, %(at)s + i * interval '10 minutes',
               %(at)s + i * interval '10 minutes', %(at)s + i * interval '10 minutes',
               %(per_slice)s, %(at)s + i * interval '10 minutes'
        FROM generate_series(0, %(slices)s - 1) i
        """,
        {**params, "fan_out": fan_out_id, "slices": SLICES, "per_slice": args.pages // SLICES},
    )
    cursor.execute(
        """
        INSERT INTO reaudit_placement (fan_out_id, page_id, offset_seconds, slice_index, fired_at)
        SELECT %(fan_out)s, id, (id * 7919) %% 21600, ((id * 7919) %% 21600) / 600,
               %(at)s + ((id * 7919) %% 21600) * interval '1 second'
        FROM audits_page
        """,
        {**params, "fan_out": fan_out_id},
    )
    # One succeeded audit a page: the result of audits.analysis.audit_result with the
    # links its link checks added (audits.linkcheck.finish_link_checks).
    cursor.execute(
        """
        INSERT INTO audits_audit (id, page_id, status, trigger, attempts, task_id,
            idempotency_key, created_at, attempt_started_at, published_at, finished_at, result,
            changes, got_worse, error, link_checks_deadline, callback_url, callback_secret,
            client)
        SELECT gen_random_uuid(), p.id, 'succeeded', 'reaudit', 1, gen_random_uuid()::text,
            'reaudit-' || p.id || '-' || %(day)s, placed.at, placed.at, placed.at,
            placed.at + interval '40 seconds',
            jsonb_build_object(
                'requested_url', p.url, 'final_url', p.url, 'redirects', '[]'::jsonb,
                'status_code', 200, 'ttfb_ms', 80 + p.id %% 300, 'total_ms', 150 + p.id %% 900,
                'bytes', 40000 + p.id %% 90000, 'truncated', false,
                'content_type', 'text/html', 'is_html', true,
                'missing_security_headers',
                    '["content-security-policy", "referrer-policy"]'::jsonb,
                'title', 'Article ' || substr(md5(p.url), 1, 24) || ' | Site ' || p.domain,
                'meta_description', 'What readers of ' || p.domain || ' learn about '
                    || substr(md5(p.url || 'd'), 1, 40) || ', and why it matters.',
                'canonical', p.url, 'noindex', false, 'h1_count', 1,
                'link_counts', jsonb_build_object('internal', 45, 'external', %(links)s),
                'external_links', links.urls, 'links', links.checked,
                'link_check', jsonb_build_object('total', %(links)s, 'unfinished', 0,
                    'rate_limited_pending', 0, 'deadline_passed', false))
                || %(analysis)s::jsonb,
            CASE WHEN p.id %% 20 = %(night)s %% 20 THEN jsonb_build_array(jsonb_build_object(
                'field', 'title', 'before', 'Old title', 'after', 'New title'))
                ELSE '[]'::jsonb END,
            false, '', placed.at + interval '2 minutes', '', '', ''
        FROM audits_page p,
        -- Spread over the night as the placements fire, each a distinct instant.
        LATERAL (SELECT %(at)s + ((p.id * 7919) %% 21600) * interval '1 second'
                        + (p.id %% 1000) * interval '1 microsecond' AS at) placed,
        LATERAL (
            SELECT jsonb_agg(u.url ORDER BY u.url) AS urls,
                   jsonb_agg(jsonb_build_object('url', u.url, 'status', 'ok',
                                                'status_code', 200) ORDER BY u.url) AS checked
            -- The first `shared` links are the domain's (every page of it lists them),
            -- the rest the page's own; the same every night.
            FROM (SELECT CASE WHEN g <= %(shared)s
                         THEN 'https://www.ref' || ((abs(hashtext(p.domain)) + g) %% 2000)
                              || '.example/' || substr(md5(p.domain || '-' || g), 1, 10)
                         ELSE 'https://www.ref' || ((p.id * 31 + g) %% 2000) || '.example/'
                              || substr(md5(p.id::text || '-' || g), 1, 10) END AS url
                  FROM generate_series(1, %(links)s) g) u
        ) links
        """,
        params,
    )
    # Each distinct link of the night's audits: its one check of the night (a day's
    # freshness), recorded on its SharedLink when it finished, for the first audit of
    # the night to list it (audits.linkcheck.record_shared_outcome). New links are
    # inserted, the others updated in place, as the check's record updates them.
    cursor.execute(
        """
        INSERT INTO audits_sharedlink (url, status, status_code, final_url, github, detail,
                                       checked_at, check_status, task_id, attempts,
                                       published_at, suspect_since)
        SELECT link.value ->> 'url', 'ok', 200, '', NULL, '',
               min(a.attempt_started_at) + interval '30 seconds', 'idle', '', 1,
               min(a.attempt_started_at), NULL
        FROM audits_audit a, jsonb_array_elements(a.result -> 'links') link(value)
        WHERE a.created_at >= %(at)s
        GROUP BY link.value ->> 'url'
        ON CONFLICT (url) DO UPDATE SET status = excluded.status,
            status_code = excluded.status_code, final_url = excluded.final_url,
            github = excluded.github, detail = excluded.detail,
            checked_at = excluded.checked_at, check_status = 'idle', task_id = '',
            suspect_since = NULL
        """,
        params,
    )
    # The audit's checks, each pointing at its link and holding the outcome copied in
    # (no task id of its own: the check's task is the shared link's).
    cursor.execute(
        """
        INSERT INTO audits_linkcheck (audit_id, url, link_id, status, status_code,
                                      final_url, detail, created_at, finished_at)
        SELECT a.id, link.value ->> 'url', s.id, 'ok', 200, '', '',
               a.attempt_started_at + link.n * interval '1 millisecond',
               a.attempt_started_at + interval '30 seconds'
        FROM audits_audit a
        CROSS JOIN LATERAL jsonb_array_elements(a.result -> 'links') WITH ORDINALITY link(value, n)
        JOIN audits_sharedlink s ON s.url = link.value ->> 'url'
        WHERE a.created_at >= %(at)s
        """,
        params,
    )
    cursor.execute(
        """
        INSERT INTO webhooks_delivery (id, audit_id, event, url, status, attempts, task_id,
            last_status_code, last_error, delivered_at, created_at, updated_at, published_at,
            attempt_started_at)
        SELECT gen_random_uuid(), a.id, 'audit.changed', p.callback_url, 'delivered', 1,
               gen_random_uuid()::text, 200, '', a.finished_at, a.finished_at, a.finished_at,
               a.finished_at, a.finished_at
        FROM audits_audit a JOIN audits_page p ON p.id = a.page_id
        WHERE a.created_at >= %(at)s AND p.callback_url <> ''
        """,
        params,
    )
    cursor.execute(
        """
        INSERT INTO ratelimit_ratelimitobservation (key, resource, kind, status_code, "limit",
            remaining, used, reset_at, observed_at)
        SELECT 'github-installation:77', 'core', 'ok', 200, 5000, 5000 - n, n,
               %(at)s + interval '1 hour', %(at)s + n * interval '1 second'
        FROM generate_series(1, %(observations)s) n
        """,
        {**params, "observations": OBSERVATIONS_PER_NIGHT},
    )
    cursor.execute(
        """
        INSERT INTO jobs_deadletter (task_name, task_id, queue, args, kwargs, raw_message,
            reason, exception, traceback, attempts, first_failed_at, last_failed_at,
            replayed_at, replayed_by, replay_task_id)
        SELECT 'audits.run_audit', gen_random_uuid()::text, 'audits',
               jsonb_build_array(gen_random_uuid()::text), '{}'::jsonb, '', 'attempts_exhausted',
               'Transient: answered 503', repeat('Traceback line ', 40), 5, %(at)s, %(at)s,
               %(at)s + interval '1 hour', 'admin', gen_random_uuid()::text
        FROM generate_series(1, %(dead)s)
        """,
        {**params, "dead": DEAD_LETTERS_PER_NIGHT},
    )


def vacuum() -> None:
    """What autovacuum does after a night and its prune: makes the deleted rows' space
    reusable, and gives the planner statistics of the tables as they now are."""
    from django.db import connection

    with connection.cursor() as cursor:
        for table in TABLES.values():
            cursor.execute(f"VACUUM ANALYZE {table}")


def table_sizes() -> dict[str, int]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT relname, pg_total_relation_size(oid) FROM pg_class WHERE relname = ANY(%s)",
            [list(TABLES.values())],
        )
        return dict(cursor.fetchall())


def count(table: str) -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {table}")
        return cursor.fetchone()[0]


def table_rows() -> dict[str, tuple[int, int, int, int]]:
    """(rows, heap, TOAST, indexes) bytes of each table."""
    from django.db import connection

    found = {}
    with connection.cursor() as cursor:
        for table in TABLES.values():
            cursor.execute(
                f"""SELECT (SELECT count(*) FROM {table}), pg_relation_size(c.oid),
                           coalesce(pg_total_relation_size(nullif(c.reltoastrelid, 0)), 0),
                           pg_indexes_size(c.oid)
                    FROM pg_class c WHERE c.relname = %s""",
                [table],
            )
            found[table] = cursor.fetchone()
    return found


def breakdown(before: dict) -> dict[str, tuple[int, float, float, float]]:
    """Per table: rows added, and bytes a row of heap, TOAST and indexes."""
    after = table_rows()
    result = {}
    for table, (rows, heap, toast, indexes) in after.items():
        added = rows - before[table][0]
        if added:
            result[table] = (
                added,
                (heap - before[table][1]) / added,
                (toast - before[table][2]) / added,
                (indexes - before[table][3]) / added,
            )
    return result


def report(args, first_night, sizes, per_night, by_kind) -> None:
    print()
    shared = round(args.links * args.shared)
    print(
        f"Bytes a row, first night ({args.pages:,} audits, {args.links} link checks each, "
        f"{shared} of them the domain's):"
    )
    print("| table | rows | heap | TOAST | indexes | total |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for table, (rows, heap, toast, indexes) in first_night.items():
        print(
            f"| {table} | {rows:,} | {heap:.0f} | {toast:.0f} | {indexes:.0f} | "
            f"{heap + toast + indexes:.0f} |"
        )
    audit = sum(first_night["audits_audit"][1:])
    link = sum(first_night["audits_linkcheck"][1:])
    print(
        f"An audit with its {args.links} link checks: {audit + args.links * link:,.0f} bytes "
        f"({audit:,.0f} + {args.links} x {link:,.0f})"
    )
    links, *shared_link = first_night["audits_sharedlink"]
    print(
        f"Distinct links: {links:,} shared-link rows for {args.pages:,} pages "
        f"({links / args.pages:.2f} a page), {sum(shared_link):,.0f} bytes each, "
        f"{links * sum(shared_link) / args.pages:,.0f} bytes a page; updated in place each night"
    )
    totals = [sum(s.values()) for s in sizes]
    print()
    print(
        f"Total relation size by night ({args.pages:,} pages, {args.sim_links} link checks an "
        f"audit, horizon {args.horizon} days):"
    )
    print("| night | MiB | of night " + str(args.horizon + 1) + " |")
    print("| ---: | ---: | ---: |")
    reference = totals[min(args.horizon, len(totals) - 1)]
    for night in sorted({0, 9, args.horizon - 1, args.horizon, args.horizon + 1, 49, 74}
                        | {len(totals) - 1}):  # fmt: skip
        if night < len(totals):
            print(
                f"| {night + 1} | {totals[night] / 2**20:.1f} | {totals[night] / reference:.3f} |"
            )
    steady = per_night[args.horizon + 1 :]
    if steady:
        deleted = sum(n[3] for n in steady) / len(steady)
        seconds = sum(n[1] for n in steady) / len(steady)
        vacuum = sum(n[2] for n in steady) / len(steady)
        print(
            f"After the horizon, a night's prune deleted {deleted:,.0f} rows in {seconds:.1f} s "
            f"({deleted / seconds:,.0f} rows/s, batches of the default size), "
            f"then VACUUM took {vacuum:.1f} s"
        )
        print(
            "The last night's prune by kind (rows, with what cascaded): "
            + ", ".join(f"{kind} {rows:,}" for kind, rows in by_kind.items())
        )
        print(
            f"Largest size after the horizon / size at night {args.horizon + 1}: "
            f"{max(totals[args.horizon :]) / reference:.3f}; last night / night "
            f"{args.horizon + 1}: {totals[-1] / reference:.3f}"
        )


if __name__ == "__main__":
    sys.exit(main())
