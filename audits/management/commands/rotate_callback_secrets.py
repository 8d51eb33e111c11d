"""Re-encrypt every stored callback secret with the first of CALLBACK_SECRET_KEYS."""

from __future__ import annotations

from django.core.management import BaseCommand
from django.db import transaction

from audits.models import Audit, Page


class Command(BaseCommand):
    help = (
        "Re-encrypt callback secrets with the first key of CALLBACK_SECRET_KEYS (after "
        "putting a new key first); then the old key can be removed."
    )

    def handle(self, *args, **options):
        total = 0
        for model in (Audit, Page):
            rows = model.objects.exclude(callback_secret="").values_list("id", flat=True)
            for row_id in rows.iterator():
                with transaction.atomic():
                    # Read (any key decrypts), write (the first key encrypts).
                    row = model.objects.select_for_update().only("callback_secret").get(id=row_id)
                    model.objects.filter(id=row_id).update(callback_secret=row.callback_secret)
                total += 1
        self.stdout.write(f"Re-encrypted {total} callback secret(s).")
