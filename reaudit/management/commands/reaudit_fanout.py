"""Run the nightly re-audit fan-out by hand, as the beat entry does at REAUDIT_HOUR."""

from __future__ import annotations

from datetime import date

from django.core.management import BaseCommand, CommandError

from reaudit import services
from reaudit.tasks import NIGHT_TASKS


def _day(value: str) -> date:
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise CommandError(f"--day must be YYYY-MM-DD, got {value!r}") from None


class Command(BaseCommand):
    help = (
        "Place every page marked for re-audit into a night's window and start its first "
        "slice (a reaudit worker publishes the rest). Running it twice for a day is harmless."
    )

    def add_arguments(self, parser):
        parser.add_argument("--day", type=_day, help="The night (YYYY-MM-DD); default today, UTC.")
        parser.add_argument(
            "--window",
            type=int,
            help="Window in seconds (default REAUDIT_WINDOW_SECONDS); ignored for a day "
            "that already has a fan-out.",
        )

    def handle(self, *args, day: date | None, window: int | None, **options):
        if window is not None and window < 1:
            raise CommandError("--window must be at least 1 second")
        result = services.fan_out(day, window_seconds=window, night_tasks=NIGHT_TASKS)
        night = result.fan_out
        if result.created:
            sizes = night.slice_sizes
            self.stdout.write(
                f"Placed {night.pages} page(s) for {night.day} over {night.window_seconds} s "
                f"from {night.window_start:%Y-%m-%d %H:%M:%S} UTC, in {len(sizes)} slice(s) of "
                f"{night.slice_seconds} s (busiest slice {max(sizes)} placement(s)); "
                "slice 0 is published, a reaudit worker publishes the rest."
            )
            if options["verbosity"] > 1:
                for index, size in enumerate(sizes):
                    self.stdout.write(f"  slice {index}: {size} placement(s)")
            return
        if result.resumed_slice is not None:
            state = f"republished slice {result.resumed_slice} to keep its chain moving"
        else:
            state = "it is superseded" if night.superseded_at else "it has finished"
        self.stdout.write(
            f"{night.day} already has a fan-out ({night.pages} page(s) over "
            f"{night.window_seconds} s from {night.window_start:%Y-%m-%d %H:%M:%S} UTC): "
            f"placed nothing new; {state}."
        )
