"""Replay dead letters from the command line: the admin's "replay" action, in bulk.

manage.py replay_dead_letters --task audits.run_audit --since 2h
manage.py replay_dead_letters --since 2026-12-01T08:00 --dry-run
"""

from __future__ import annotations

import getpass
import re
from datetime import UTC, datetime, timedelta

from django.core.management import BaseCommand, CommandError
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

from jobs import deadletters
from jobs.models import DeadLetter

DURATION = re.compile(r"^(\d+)\s*([smhd])$")
UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def parse_since(value: str) -> datetime:
    """'90m', '2h', '3d' (ago), or an ISO date or date-time (UTC unless it says otherwise)."""
    text = value.strip()
    if match := DURATION.match(text):
        amount, unit = match.groups()
        return timezone.now() - timedelta(**{UNITS[unit]: int(amount)})
    moment = parse_datetime(text)
    if moment is None and (day := parse_date(text)) is not None:
        moment = datetime(day.year, day.month, day.day)
    if moment is None:
        raise CommandError(f"--since {value!r}: use 30m, 2h, 3d or an ISO date/date-time")
    return moment if timezone.is_aware(moment) else timezone.make_aware(moment, UTC)


class Command(BaseCommand):
    help = "Enqueue the tasks of dead letters again, recording who replayed them and when."

    def add_arguments(self, parser):
        parser.add_argument(
            "--task", help="Only dead letters of this task (e.g. audits.run_audit)."
        )
        parser.add_argument(
            "--since", help="Only those that last failed since: 30m, 2h, 3d, or an ISO date-time."
        )
        parser.add_argument(
            "--reason", choices=DeadLetter.Reason.values, help="Only dead letters of this reason."
        )
        parser.add_argument(
            "--include-replayed", action="store_true", help="Replay rows replayed before, too."
        )
        parser.add_argument("--limit", type=int, help="Replay at most this many (oldest first).")
        parser.add_argument("--dry-run", action="store_true", help="List, do not replay.")
        parser.add_argument(
            "--by", default=None, help="Who is replaying (default: manage.py and the OS user)."
        )

    def handle(self, *args, **options):
        rows = DeadLetter.objects.order_by("last_failed_at")
        if options["task"]:
            rows = rows.filter(task_name=options["task"])
        if options["since"]:
            rows = rows.filter(last_failed_at__gte=parse_since(options["since"]))
        if options["reason"]:
            rows = rows.filter(reason=options["reason"])
        if not options["include_replayed"]:
            rows = rows.filter(replayed_at__isnull=True)
        if options["limit"] is not None:
            rows = rows[: options["limit"]]
        rows = list(rows)
        if options["dry_run"]:
            for row in rows:
                self.stdout.write(
                    f"would replay {row.id} {row.task_name} {row.args} ({row.reason})"
                )
            self.stdout.write(f"{len(rows)} dead letter(s) match.")
            return
        by = options["by"] or f"manage.py replay_dead_letters ({getpass.getuser()})"
        report = deadletters.replay(rows, by=by, include_replayed=options["include_replayed"])
        for row, why in report.skipped:
            self.stderr.write(f"skipped {row.id} {row.task_name}: {why}")
        self.stdout.write(
            f"replayed {len(report.replayed)} dead letter(s), skipped {len(report.skipped)}."
        )
