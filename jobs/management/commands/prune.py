"""Delete what has aged out, every kind the apps registered (jobs.retention).

manage.py prune --dry-run        what would go, per kind, with counts
manage.py prune                  delete it, in batches of RETENTION_BATCH_SIZE
manage.py prune --kind audits    only these kinds
"""

from __future__ import annotations

from django.core.management import BaseCommand, CommandError

from jobs import retention


class Command(BaseCommand):
    help = "Delete the rows past their retention horizon (the daily jobs.prune, run now)."

    def add_arguments(self, parser):
        parser.add_argument(
            "--dry-run", action="store_true", help="Count what would be deleted; delete nothing."
        )
        parser.add_argument(
            "--kind",
            action="append",
            dest="kinds",
            help="Only this kind (repeatable); `--dry-run` lists them all.",
        )
        parser.add_argument("--batch-size", type=int, help="Rows per batch (RETENTION_BATCH_SIZE).")

    def handle(self, *args, **options):
        known = [kind.name for kind in retention.kinds()]
        unknown = sorted(set(options["kinds"] or []) - set(known))
        if unknown:
            raise CommandError(f"unknown kind(s) {unknown}; known: {', '.join(known)}")
        chosen = [
            kind
            for kind in retention.kinds()
            if not options["kinds"] or kind.name in options["kinds"]
        ]
        if options["dry_run"]:
            total = 0
            for kind in chosen:
                count = retention.count(kind)
                total += count
                self.stdout.write(
                    f"{kind.name}: would delete {count} ({kind.description}; older than "
                    f"{kind.horizon_days:g} days, {kind.horizon_setting})"
                )
            self.stdout.write(f"{total} row(s) would be deleted; nothing was.")
            return
        for pruned in retention.prune_all(
            names=[kind.name for kind in chosen], batch_size=options["batch_size"]
        ):
            with_them = ", ".join(f"{n} {label}" for label, n in sorted(pruned.cascaded.items()))
            self.stdout.write(
                f"{pruned.kind}: deleted {pruned.deleted} in {pruned.batches} batch(es)"
                + (f" (with them: {with_them})" if with_them else "")
            )
