"""What the webhooks app lets go of, and what it keeps of the audits app's.

Finished deliveries (delivered or failed) go after WEBHOOK_DELIVERY_RETENTION_DAYS. The
dead letters of deliveries that failed (a receiver's refusal, attempts exhausted) go after
WEBHOOK_DEAD_LETTER_RETENTION_DAYS: any address can be a callback, so one that refuses
everything left a dead letter per audit, forever. The delivery's own row is the record an
operator redelivers from (the admin); a malformed message's dead letter stays. An
audit with a delivery still owed (pending, delivering, retrying) stays whatever its
age: the delivery builds its payload from the audit when it is attempted. When an
audit goes, its finished deliveries go with it (their foreign key cascades): a
delivery of an audit nobody can read any more has nothing left to redeliver.
"""

from __future__ import annotations

from datetime import datetime

from django.db.models import Exists, OuterRef, QuerySet

from jobs.models import DeadLetter
from jobs.retention import PrunableKind
from webhooks.models import Delivery
from webhooks.tasks import deliver_webhook


def deliveries_created_before(cutoff: datetime) -> QuerySet:
    return Delivery.objects.filter(created_at__lt=cutoff)


def finished_deliveries(deliveries: QuerySet) -> QuerySet:
    return deliveries.filter(status__in=Delivery.FINISHED)


def without_owed_deliveries(audits: QuerySet) -> QuerySet:
    owed = Delivery.objects.filter(audit_id=OuterRef("pk")).exclude(status__in=Delivery.FINISHED)
    return audits.exclude(Exists(owed))


KIND = PrunableKind(
    name="webhook_deliveries",
    horizon_setting="WEBHOOK_DELIVERY_RETENTION_DAYS",
    old_enough=deliveries_created_before,
    walk=("created_at", "id"),
    may_go=finished_deliveries,
    description="delivered or failed webhook deliveries",
)


def delivery_dead_letters_before(cutoff: datetime) -> QuerySet:
    return DeadLetter.objects.filter(task_name=deliver_webhook.name, last_failed_at__lt=cutoff)


def failed_deliveries(dead_letters: QuerySet) -> QuerySet:
    return dead_letters.filter(
        reason__in=[DeadLetter.Reason.FAILED, DeadLetter.Reason.ATTEMPTS_EXHAUSTED]
    )


DEAD_LETTERS = PrunableKind(
    name="webhook_dead_letters",
    horizon_setting="WEBHOOK_DEAD_LETTER_RETENTION_DAYS",
    old_enough=delivery_dead_letters_before,
    walk=("task_name", "last_failed_at", "id"),
    may_go=failed_deliveries,
    description="dead letters of webhook deliveries that failed",
)
