"""One job model: a kind of job declares its row's states once; the lifecycle follows.

An app's job row inherits jobs.models.JobRow (task id, attempts, when its attempt began,
when its wait is due, when its message was published) and declares a `Job`: which of
its statuses mean queued, running, waiting and done, its task, queue and deadline
budget. From that one declaration come:

- claim: the attempt begins (running, one attempt counted, `attempt_started_at`);
- wait: it waits (a retry, a deferral, a park, an outage), due at `next_attempt_at`,
  giving back the attempt its claim counted when the wait spends none;
- finish and fail: the outcome, recorded once (a second finisher changes nothing);
- what is owed, and publishing it again (the one reconciler, jobs.reconcile), by one
  rule for every kind:

      queued    owed from when its message was published (`published_at`)
      waiting   owed from when its wait is due (`next_attempt_at`)
      running   owed once its attempt is dead: `attempt_started_at` + the deadline's
                `dead_after` (its hard time limit and lease margin)

  Redis kept its data: a row still owed RECONCILE_AFTER_SECONDS after that, and not
  published again since, is published again at once. Redis lost data: every row whose
  message or wait was written since the loss goes back at its own due time.

A duplicate message is harmless: a claim of a finished row claims nothing, a kind
whose claim names its task (`claim_by_task`: a shared link's check) runs only under it,
and a copy that meets its original in flight is dropped before it claims
(jobs.task.PlumbTask._take_flight).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import connections, models, router, transaction
from django.db.models import F, Q
from django.db.models.expressions import Col
from django.db.models.functions import Greatest
from django.utils import timezone

from jobs.deadlines import Deadline
from jobs.sql import column_converters, converted, pipelines, preparing_cursor

# Rows a source publishes again in one tick by the age rule (each then carries its new
# `published_at`, so the next tick goes on from there). After Redis lost data a tick
# publishes everything owed, streamed in chunks of this size.
BATCH = 1000


@dataclass(frozen=True)
class Window:
    """Which owed rows a reconciler's tick publishes again (jobs.reconcile).

    redis_lost: Redis lost what was written after `lost_since` (None: all of it).
      A source returns every row whose current message or wait was written since
      then (a superset is harmless; its due time is at least when it was written).
    otherwise: a source returns the rows still owed whose message should have run
      before `overdue_before`, and not published again since.
    """

    now: datetime
    redis_lost: bool
    lost_since: datetime | None
    overdue_before: datetime

    @property
    def limit(self) -> int | None:
        """How many rows a source reads: all of them after a loss (the tick is not done
        until everything owed is out), else a batch."""
        return None if self.redis_lost else BATCH

    def since(self, *fields: str) -> Q:
        """Rows with any of `fields` at or after `lost_since` (all rows when it is None)."""
        if self.lost_since is None:
            return Q()
        condition = Q(pk__in=[])
        for name in fields:
            condition |= Q(**{f"{name}__gte": self.lost_since})
        return condition


@dataclass(frozen=True)
class Owed:
    """One row to publish again, under its own task id, at its due time (None: now)."""

    pk: object
    task_id: str
    attempts: int
    due_at: datetime | None


@dataclass(frozen=True)
class Returned:
    """A value a claim or a finish returns that is not a column of the job's row: an SQL
    expression over the row (its table by name), read as `field` reads its column."""

    sql: str
    field: models.Field
    params: tuple = ()


@dataclass(frozen=True)
class SQL:
    """A piece of SQL over the job's table (by name), with its parameters: a condition a
    finish also requires, a statement sent before it, or one that writes alongside it
    (`Job.finish`)."""

    sql: str
    params: tuple = ()


@dataclass(frozen=True)
class _Statement:
    sql: str
    converters: tuple  # (column, its converters) for each returned value
    returning_params: tuple  # the RETURNING clause's, after the SET's and the WHERE's
    before: str = ""  # a statement sent ahead of it in the same round trip (`pipelines`)

    def run(self, connection, params: list, trailing: tuple = (), leading: tuple = ()):
        """The row the statement changed, its returned values converted as the ORM
        converts them; None when no row changed. `trailing`: the parameters of what
        follows the RETURNING clause (a finish's `alongside`); `leading`: those of the
        statement sent before it."""
        values = [*params, *self.returning_params, *trailing]
        with (
            transaction.mark_for_rollback_on_error(using=connection.alias),
            preparing_cursor(connection) as cursor,
        ):
            if self.before:
                # One round trip and one transaction (until the pipeline's Sync), each
                # statement prepared and with its own snapshot. A pipeline reports errors
                # at its Sync, outside Django's cursor: wrapped as Django wraps them.
                with (
                    preparing_cursor(connection) as first,
                    connection.wrap_database_errors,
                    connection.connection.pipeline(),
                ):
                    first.execute(self.before, leading)
                    cursor.execute(self.sql, values)
            else:
                cursor.execute(self.sql, values)
            row = cursor.fetchone()
        if row is None:
            return None
        return converted(row, self.converters, connection)


def _plain(fields: dict) -> bool:
    """Every value is a value, none an expression (the ORM compiles those)."""
    return not any(hasattr(value, "resolve_expression") for value in fields.values())


@dataclass(frozen=True)
class Job:
    """A kind of job, declared once by the app whose rows record it."""

    name: str  # the reconciler's source, and plumb_jobs_republished_total{source}
    model: type[models.Model]
    task: str
    queue: str
    deadline: Deadline
    queued: str
    running: str
    waiting: str
    done: tuple[str, ...]
    status_field: str = "status"
    # Only the task its row names may claim it: a shared link's check, whose claim by
    # an audit names the one task that records the link's outcome.
    claim_by_task: bool = False
    # The claim's and the finish's statements, written once per shape (`_statement`).
    _statements: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    # --- the row's states -----------------------------------------------------------
    def _status(self, *values: str) -> Q:
        return Q(**{f"{self.status_field}__in": values})

    @property
    def owed_statuses(self) -> tuple[str, ...]:
        return (self.queued, self.running, self.waiting)

    def unfinished(self, pk) -> models.QuerySet:
        return self.model.objects.filter(pk=pk).exclude(self._status(*self.done))

    # --- claim, wait, finish, fail -------------------------------------------------------
    def claim(
        self,
        pk,
        *,
        task_id: str | None = None,
        attempt: int | None = None,
        returning: Sequence[str | Returned] = (),
        **fields,
    ):
        """Begin an attempt: running, one more attempt counted; False if there is nothing to
        claim (finished, gone, resting, or claimed under another task).

        A `running` row can be claimed again: its message came back after a worker died
        mid-attempt. `attempt`: the job's attempt number, given when it resumes after an
        outage of PostgreSQL, whose cut-short run counted it already and could not give it
        back: the row counts it once (at least `attempt`, never one more).

        `returning`: what the attempt needs of its row, read by the claim's own statement
        (UPDATE ... RETURNING) instead of a second query: column names, `fk__column` for a
        column of the row a foreign key points to, or a `Returned` expression. The claim
        then returns their values, in that order (a tuple), instead of True.
        """
        if not _plain(fields):
            return self._claim_by_orm(pk, task_id=task_id, attempt=attempt, **fields)
        connection = connections[router.db_for_write(self.model)]
        statement = self._statement(
            connection, "claim", tuple(fields), attempt is not None, tuple(returning)
        )
        params = [str(self.running)]
        if attempt is not None:
            params.append(attempt)
        params.append(
            self.model._meta.get_field("attempt_started_at").get_db_prep_save(
                timezone.now(), connection
            )
        )
        return self._run(
            statement, connection, params, fields, pk, self.owed_statuses, task_id, returning
        )

    def _claim_by_orm(self, pk, *, task_id, attempt, **fields) -> bool:
        """The claim for fields given as expressions (none of Plumb's callers today)."""
        rows = self.model.objects.filter(self._status(*self.owed_statuses), pk=pk)
        if self.claim_by_task:
            rows = rows.filter(task_id=task_id)
        counted = F("attempts") + 1 if attempt is None else Greatest(F("attempts"), attempt)
        return bool(
            rows.update(
                **{self.status_field: self.running},
                attempts=counted,
                attempt_started_at=timezone.now(),
                next_attempt_at=None,
                **fields,
            )
        )

    def wait(
        self, pk, /, *, seconds: float, attempt_spent: bool, task_id: str | None = None, **fields
    ) -> None:
        """The job waits, due in `seconds`; a wait that spends no attempt gives back the
        one its claim counted (a row parked before its claim was never counted)."""
        rows = self.model.objects.filter(pk=pk)
        if self.claim_by_task:
            rows = rows.filter(task_id=task_id)
        waiting = {
            self.status_field: self.waiting,
            "next_attempt_at": timezone.now() + timedelta(seconds=seconds),
            **fields,
        }
        # Not yet running (parked before its claim): in this order, one row is written once.
        rows.filter(self._status(self.queued, self.waiting)).update(**waiting)
        running = rows.filter(self._status(self.running))
        if attempt_spent:
            running.update(**waiting)
        else:
            running.update(**waiting, attempts=Greatest(F("attempts") - 1, 0))

    def finish(
        self,
        pk,
        final: str,
        /,
        *,
        task_id: str | None = None,
        returning: Sequence[str | Returned] = (),
        condition: SQL | None = None,
        before: SQL | None = None,
        alongside: SQL | None = None,
        **fields,
    ):
        """Record the outcome once; False if it was finished already (or is gone, or, for a
        kind whose claim names its task, claimed under another task, or `condition` does
        not hold). `returning`, as for `claim`: the finished row's values (a tuple) instead
        of True.

        `before`: a statement sent with the finish's in one round trip, and run first (a
        lock whose wait must come before the finish's snapshot), in one transaction with
        it. Only where a connection pipelines (`pipelines`).

        `alongside`: a data-modifying statement that runs in the finish's own statement
        (a CTE), so it writes only when the finish does: it reads the finished row's key
        as `pk` from `finished`. PostgreSQL only."""
        if not _plain(fields):
            if condition is not None or before is not None or alongside is not None:
                raise ValueError("a finish with SQL of its own sets values, not expressions")
            rows = self.unfinished(pk)
            if self.claim_by_task:
                rows = rows.filter(task_id=task_id)
            return bool(rows.update(**{self.status_field: final}, next_attempt_at=None, **fields))
        connection = connections[router.db_for_write(self.model)]
        statement = self._statement(
            connection, "finish", tuple(fields), False, tuple(returning), condition, before,
            alongside,
        )  # fmt: skip
        return self._run(
            statement, connection, [str(final)], fields, pk, self.done, task_id, returning,
            condition, alongside, before,
        )  # fmt: skip

    # --- the claim's and the finish's statements --------------------------------------------
    # Both run on every attempt of every job: written once per shape (the fields set, what
    # is returned) from the declaration and the model's columns, then run with parameters,
    # so an attempt pays for its two statements and not for compiling them (DECISIONS.md,
    # "The audit's own plumbing").
    def _pk_param(self, pk, connection):
        return self.model._meta.pk.get_db_prep_value(pk, connection)

    def _run(
        self, statement, connection, params, fields, pk, statuses, task_id, returning,
        condition=None, alongside=None, before=None,
    ):  # fmt: skip
        """Run a claim's or a finish's statement: `params` (what it sets first), then the
        fields', the row's key, the statuses it may change from, for a kind whose claim
        names its task the task id, and the condition's (a statement alongside: its
        parameters come last; one sent before it: its own). False if no row changed, else
        the returned values (a tuple) or True."""
        params = [
            *params,
            *(
                self.model._meta.get_field(name).get_db_prep_save(value, connection)
                for name, value in fields.items()
            ),
            self._pk_param(pk, connection),
            *map(str, statuses),
        ]
        if self.claim_by_task:
            params.append(task_id)
        if condition is not None:
            params += condition.params
        row = statement.run(
            connection,
            params,
            trailing=alongside.params if alongside is not None else (),
            leading=before.params if before is not None else (),
        )
        if row is None:
            return False
        return row if returning else True

    def _statement(
        self,
        connection,
        kind: str,
        names: tuple,
        given_attempt: bool,
        returning: tuple,
        condition: SQL | None = None,
        before: SQL | None = None,
        alongside: SQL | None = None,
    ) -> _Statement:
        condition_sql = condition.sql if condition is not None else ""
        before_sql = before.sql if before is not None else ""
        alongside_sql = alongside.sql if alongside is not None else ""
        key = (connection.alias, kind, names, given_attempt, returning, condition_sql,
               before_sql, alongside_sql)  # fmt: skip
        statement = self._statements.get(key)
        if statement is None:
            statement = self._statements[key] = self._write(
                connection, kind, names, given_attempt, returning, condition_sql, before_sql,
                alongside_sql,
            )  # fmt: skip
        return statement

    def _write(
        self,
        connection,
        kind: str,
        names: tuple,
        given_attempt: bool,
        returning: tuple,
        condition_sql: str = "",
        before_sql: str = "",
        alongside_sql: str = "",
    ) -> _Statement:
        meta = self.model._meta
        qn = connection.ops.quote_name
        table = qn(meta.db_table)

        def column(name: str) -> str:
            return qn(meta.get_field(name).column)

        status = column(self.status_field)
        sets = [f"{status} = %s"]
        if kind == "claim":
            attempts = column("attempts")
            greatest = "GREATEST" if connection.vendor == "postgresql" else "MAX"
            sets += [
                f"{attempts} = {greatest}({attempts}, %s)" if given_attempt
                else f"{attempts} = {attempts} + 1",
                f"{column('attempt_started_at')} = %s",
            ]  # fmt: skip
        sets.append(f"{column('next_attempt_at')} = NULL")
        sets += [f"{column(name)} = %s" for name in names]
        if kind == "claim":
            statuses = self.owed_statuses
            condition = f"{status} IN ({', '.join(['%s'] * len(statuses))})"
        else:
            statuses = self.done
            condition = f"NOT ({status} IN ({', '.join(['%s'] * len(statuses))}))"
        where = f"{qn(meta.pk.column)} = %s AND {condition}"
        if self.claim_by_task:
            where += f" AND {column('task_id')} = %s"
        if condition_sql:
            where += f" AND ({condition_sql})"
        sql = f"UPDATE {table} SET {', '.join(sets)} WHERE {where}"
        outputs, returning_params = [], []
        for item in returning or (meta.pk.name,):
            if isinstance(item, Returned):
                outputs.append((item.sql, item.field))
                returning_params += item.params
                continue
            name, _, related = item.partition("__")
            own = meta.get_field(name)
            if not related:
                outputs.append((f"{table}.{qn(own.column)}", own))
                continue
            target = own.related_model._meta
            target_field = target.get_field(related)
            outputs.append(
                (
                    f"(SELECT {qn(target_field.column)} FROM {qn(target.db_table)} WHERE "
                    f"{qn(target.pk.column)} = {table}.{qn(own.column)})",
                    target_field,
                )
            )
        if alongside_sql:
            if connection.vendor != "postgresql":
                raise ValueError(f"{connection.vendor} has no data-modifying CTE")
            # One statement: what runs alongside writes only if the finish changed its row.
            names = [f"r{n}" for n in range(len(outputs))]
            pairs = zip(outputs, names, strict=True)
            aliased = ", ".join(f"{expression} AS {name}" for (expression, _), name in pairs)
            sql = (
                f"WITH finished AS ({sql} RETURNING {table}.{qn(meta.pk.column)} AS pk, "
                f"{aliased}), alongside AS ({alongside_sql}) "
                f"SELECT {', '.join(names)} FROM finished"
            )
        else:
            sql += " RETURNING " + ", ".join(expression for expression, _ in outputs)
        converters = [column_converters(Col(meta.db_table, output), connection)
                      for _, output in outputs]  # fmt: skip
        if before_sql:
            if not pipelines(connection):
                raise ValueError(f"{connection.vendor} sends one statement a round trip")
            return _Statement(sql, tuple(converters), tuple(returning_params), before_sql)
        return _Statement(sql, tuple(converters), tuple(returning_params))

    def requeue(self, pk, /, *, task_id: str, from_status: str, **fields) -> bool:
        """Queue a finished job again under a new task id (a replay). Its message starts a
        fresh budget of attempts; the row keeps counting every attempt it ever had."""
        return bool(
            self.model.objects.filter(self._status(from_status), pk=pk).update(
                **{self.status_field: self.queued},
                task_id=task_id,
                attempt_started_at=None,
                next_attempt_at=None,
                published_at=timezone.now(),
                **fields,
            )
        )

    # --- what is owed --------------------------------------------------------------------
    def owed(self, window: Window) -> Iterable[Owed]:
        queued, waiting = self._status(self.queued), self._status(self.waiting)
        running = self._status(self.running)
        dead_after = timedelta(seconds=self.deadline.dead_after)
        if window.redis_lost:
            owed = (
                self._status(*self.owed_statuses)
                & window.since("published_at", "next_attempt_at", "attempt_started_at")
            )  # fmt: skip
        else:
            published_before = Q(published_at__lt=window.overdue_before)
            owed = published_before & (
                queued
                | waiting & Q(next_attempt_at__lt=window.overdue_before)
                | running & Q(attempt_started_at__lt=window.overdue_before - dead_after)
            )
        rows = self.model.objects.filter(owed).order_by("published_at")
        fields = ("pk", "task_id", "attempts", self.status_field, "next_attempt_at",
                  "attempt_started_at")  # fmt: skip
        for pk, task_id, attempts, status, next_attempt_at, started in rows.values_list(*fields)[
            : window.limit
        ].iterator(chunk_size=BATCH):
            due_at = None
            if status == self.waiting:
                due_at = next_attempt_at
            elif status == self.running and window.redis_lost and started is not None:
                # Its attempt may still be alive (Redis lost only its message): the copy
                # runs once that attempt is surely over, and finds it finished, or runs it.
                due_at = started + dead_after
            yield Owed(pk, task_id, attempts, due_at)

    def published(self, pk) -> None:
        """Its message was published again (jobs.reconcile): not owed again before
        RECONCILE_AFTER_SECONDS from now."""
        self.model.objects.filter(pk=pk).update(published_at=timezone.now())

    @staticmethod
    def message_arg(pk):
        """A row's key as its task takes it: a UUID as its string, an integer as is."""
        return pk if isinstance(pk, int) else str(pk)
