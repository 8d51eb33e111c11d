"""Print the queue's depth as GET /api/queue reports it."""

from __future__ import annotations

import json

import redis
from django.core.management import BaseCommand, CommandError

from audits.admission import admission_counts, queue_report


class Command(BaseCommand):
    help = "Print the audit backlog (waiting + retrying), running, scheduled and the cap as JSON."

    def add_arguments(self, parser):
        parser.add_argument(
            "--admission",
            action="store_true",
            help="Also print the admission decisions counted so far.",
        )

    def handle(self, *args, admission: bool, **options):
        try:
            report = queue_report()
            if admission:
                report["admission"] = admission_counts()
        except redis.RedisError as exc:
            raise CommandError(f"Redis cannot be read: {exc}") from exc
        self.stdout.write(json.dumps(report, indent=2))
