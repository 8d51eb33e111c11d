"""Retention: what each app lets go of, and when, pruned by one loop in small batches.

Each app registers its prunable kinds from its AppConfig.ready(), as it registers its
gauges: a name, the setting that holds its horizon in days, and the queryset of its rows
that have aged out past a cutoff. An app that still needs some rows of another app's
kind (webhooks: an audit whose delivery is not finished) narrows that kind with `keep`,
so dependencies still point one way. `prune` (the daily `jobs.prune` task and
`manage.py prune`) runs every kind in registration order.

A kind is deleted in batches. A batch is the next RETENTION_BATCH_SIZE rows old enough
to go (`old_enough`: a range of one index, nothing else), walked in the order of `walk`
(that index's columns, so each batch starts where the last ended and never re-reads
what it deleted); of those, the rows that may go (`may_go` and every `keep`) are
deleted by primary key in a transaction of their own. Reading the batch by the index
alone keeps its plan one index range whatever PostgreSQL's statistics say: with the
conditions in the same query, tables not analyzed since a night's rows arrived had it
sort every aged-out row for each batch (DECISIONS.md, "Retention"). A batch locks only
the rows it deletes, which no worker writes any more.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connections, models, transaction
from django.db.models.expressions import RawSQL
from django.utils import timezone

log = logging.getLogger(__name__)

OldEnough = Callable[[datetime], models.QuerySet]
Narrowing = Callable[[models.QuerySet], models.QuerySet]


def _everything(rows: models.QuerySet) -> models.QuerySet:
    return rows


@dataclass(frozen=True)
class PrunableKind:
    """Rows of one model that may be deleted once older than `horizon_setting` days.

    old_enough(cutoff)  the rows older than the cutoff: one index range, no other condition
    walk                the columns the batches walk in order, unique together, led by
                        that index's columns (keyset pagination)
    may_go(rows)        those of `rows` that may be deleted (the conditions besides age)
    horizon(value)      when the horizon derives from a setting that is not in days (a
                        freshness window in seconds): the days, from that setting's value
    """

    name: str
    horizon_setting: str
    old_enough: OldEnough
    walk: tuple[str, ...]
    may_go: Narrowing = _everything
    description: str = ""
    horizon: Callable[[float], float] | None = None

    @property
    def horizon_days(self) -> float:
        value = getattr(settings, self.horizon_setting)
        return value if self.horizon is None else self.horizon(value)


@dataclass
class Pruned:
    kind: str
    deleted: int = 0
    batches: int = 0
    # Rows of other models deleted with them (Django's cascade), by model label.
    cascaded: dict[str, int] = field(default_factory=dict)
    finished: bool = True


_kinds: dict[str, PrunableKind] = {}
_narrowings: dict[str, list[Narrowing]] = {}


def register(kind: PrunableKind) -> None:
    """Add (or replace) the kind called `kind.name`."""
    _kinds[kind.name] = kind


def keep(kind_name: str, narrowing: Narrowing) -> None:
    """Let another app keep rows of `kind_name` it still needs: `narrowing` takes the
    aged-out rows and returns those that may still go."""
    _narrowings.setdefault(kind_name, []).append(narrowing)


def kinds() -> list[PrunableKind]:
    return list(_kinds.values())


def kind(name: str) -> PrunableKind:
    return _kinds[name]


def cutoff(prunable: PrunableKind, now: datetime | None = None) -> datetime:
    return (now or timezone.now()) - timedelta(days=prunable.horizon_days)


def may_go(prunable: PrunableKind, rows: models.QuerySet) -> models.QuerySet:
    """Those of `rows` that may be deleted: the kind's conditions and every `keep`."""
    rows = prunable.may_go(rows)
    for narrowing in _narrowings.get(prunable.name, []):
        rows = narrowing(rows)
    return rows


def aged_out(prunable: PrunableKind, now: datetime | None = None) -> models.QuerySet:
    """The rows of the kind that would be deleted now."""
    return may_go(prunable, prunable.old_enough(cutoff(prunable, now)))


def count(prunable: PrunableKind, now: datetime | None = None) -> int:
    return aged_out(prunable, now).count()


def prune(
    prunable: PrunableKind,
    *,
    now: datetime | None = None,
    batch_size: int | None = None,
    deadline: float | None = None,
) -> Pruned:
    """Delete the kind's aged-out rows in batches; stop early past `deadline` (monotonic).

    The cutoff is fixed once, so rows ageing out while it runs wait for the next run.
    """
    batch_size = batch_size or settings.RETENTION_BATCH_SIZE
    old_enough = prunable.old_enough(cutoff(prunable, now))
    model = old_enough.model
    walk = [_attname(model, name) for name in prunable.walk]
    pruned = Pruned(prunable.name)
    position = None
    while True:
        rows = (
            old_enough
            if position is None
            else old_enough.filter(_after(old_enough, walk, position))
        )
        batch = list(rows.order_by(*walk).values_list(*walk, "pk")[:batch_size])
        if not batch:
            break
        with transaction.atomic(using=old_enough.db):
            # Checked as the batch is deleted: a row that stopped qualifying since an
            # earlier read (a delivery retried meanwhile) stays.
            doomed = may_go(prunable, model.objects.filter(pk__in=[row[-1] for row in batch]))
            _, by_model = doomed.only("pk").delete()
        pruned.batches += 1
        for label, deleted in by_model.items():
            if label == model._meta.label:
                pruned.deleted += deleted
            else:
                pruned.cascaded[label] = pruned.cascaded.get(label, 0) + deleted
        position = batch[-1][:-1]
        if len(batch) < batch_size:
            break
        if deadline is not None and time.monotonic() > deadline:
            pruned.finished = False
            break
    if pruned.deleted or pruned.cascaded:
        log.info(
            "retention.pruned",
            extra={
                "kind": prunable.name,
                "deleted": pruned.deleted,
                "cascaded": pruned.cascaded,
                "batches": pruned.batches,
                "horizon_days": prunable.horizon_days,
                "finished": pruned.finished,
            },
        )
    return pruned


def prune_all(
    *,
    now: datetime | None = None,
    batch_size: int | None = None,
    deadline: float | None = None,
    names: list[str] | None = None,
) -> list[Pruned]:
    """Prune every registered kind (or those `names`) in registration order, until the
    deadline: kinds not reached by then are reported unfinished. The first kind gets at
    least one batch, so a run always makes progress."""
    results = []
    for prunable in kinds():
        if names is not None and prunable.name not in names:
            continue
        if deadline is not None and results and time.monotonic() > deadline:
            results.append(Pruned(prunable.name, finished=False))
            continue
        results.append(prune(prunable, now=now, batch_size=batch_size, deadline=deadline))
    return results


def _attname(model: type[models.Model], name: str) -> str:
    """A foreign key walks by its column (`fan_out_id`), never by the related model's ordering."""
    return model._meta.get_field(name).attname


def _after(rows: models.QuerySet, walk: list[str], position: tuple) -> RawSQL:
    """`(walk columns) > position`, as one row comparison: PostgreSQL starts the index
    scan right there, where `a > x OR (a = x AND b > y)` would start it at `a = x` and
    step over every row of that `a` already deleted (a night's placements)."""
    model = rows.model
    connection = connections[rows.db]
    quote = connection.ops.quote_name
    table = quote(model._meta.db_table)
    fields = [model._meta.get_field(name) for name in walk]
    columns = ", ".join(f"{table}.{quote(f.column)}" for f in fields)
    placeholders = ", ".join(["%s"] * len(fields))
    params = [f.get_db_prep_value(v, connection) for f, v in zip(fields, position, strict=True)]
    return RawSQL(f"({columns}) > ({placeholders})", params, output_field=models.BooleanField())
