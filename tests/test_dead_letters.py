"""Dead letters: tasks out of attempts, malformed messages, and replaying them. One audits
worker (fast retries, three attempts) is shared by the tests that read what it dead-letters;
the replay test, which needs a single attempt, starts its own."""

from __future__ import annotations

import json
import pickle
import uuid
from datetime import timedelta

import kombu
import pytest
from django.conf import settings
from django.core.management import call_command
from django.utils import timezone

from audits.models import Audit
from config.celery_app import app
from jobs.management.commands.replay_dead_letters import parse_since
from jobs.models import DeadLetter
from tests.submitting import submit
from tests.workers import module_worker, wait_for

pytestmark = pytest.mark.slow

dead_lettering_worker = module_worker(
    "audits", env={"RETRY_BACKOFF_BASE_SECONDS": "0.1", "AUDIT_MAX_ATTEMPTS": "3"}
)


def finished(audit: Audit, timeout: float = 30.0) -> Audit:
    return wait_for(
        lambda: (row := Audit.objects.get(id=audit.id)).is_finished and row,
        timeout=timeout, message=f"audit {audit.id} to finish",
    )  # fmt: skip


def test_an_audit_out_of_attempts_is_dead_lettered_and_fails_with_the_reason(
    site, dead_lettering_worker
):
    audit = submit(f"{site.base_url}/flaky?key=dead&fail=100")
    done = finished(audit)
    assert done.status == "failed"
    assert "gave up after 3 attempt(s)" in done.error
    assert "answered 500" in done.error

    dead = wait_for(lambda: DeadLetter.objects.first(), timeout=10, message="the dead letter")
    assert dead.task_name == "audits.run_audit"
    assert dead.task_id == audit.task_id
    assert dead.args == [str(audit.id)] and dead.kwargs == {}
    assert dead.reason == DeadLetter.Reason.ATTEMPTS_EXHAUSTED
    assert dead.attempts == 3
    assert dead.exception.startswith("Transient: ")
    assert "Traceback" in dead.traceback and "Transient" in dead.traceback
    # The first failure travels with the retries: two backoffs lie between them.
    assert dead.last_failed_at - dead.first_failed_at >= timedelta(seconds=0.2)
    assert dead.replayed_at is None
    assert site.flaky_counts["dead"] == 3


def publish_raw(body, *, headers: dict, content_type: str) -> None:
    """A message straight onto the audits queue, as a broken or foreign client might send it."""
    with kombu.Connection(settings.REDIS_URL) as connection:
        connection.Producer().publish(
            body, exchange="", routing_key=settings.AUDIT_QUEUE, headers=headers,
            content_type=content_type, content_encoding="utf-8",
        )  # fmt: skip


def task_headers(name: str, task_id: str) -> dict:
    return {"lang": "py", "task": name, "id": task_id, "root_id": task_id, "retries": 0}


def test_malformed_messages_are_dead_lettered_on_their_first_delivery(
    site, dead_lettering_worker, redis_client
):
    worker = dead_lettering_worker
    good_body = json.dumps([[str(uuid.uuid4())], {}, {}])
    ids = {case: str(uuid.uuid4()) for case in range(12)}
    # Undecodable, or not a task message at all: the worker cannot even start them.
    publish_raw('[["a"], {}, {', headers=task_headers("audits.run_audit", ids[0]),
                content_type="application/json")  # fmt: skip
    publish_raw(pickle.dumps([["a"], {}, {}]), headers=task_headers("audits.run_audit", ids[1]),
                content_type="application/x-python-serialize")  # fmt: skip
    publish_raw(good_body, headers=task_headers("audits.no_such_task", ids[2]),
                content_type="application/json")  # fmt: skip
    publish_raw(good_body, headers={"id": ids[3]}, content_type="application/json")
    publish_raw(json.dumps({"audit_id": "x"}), headers=task_headers("audits.run_audit", ids[4]),
                content_type="application/json")  # fmt: skip
    # Well-formed messages whose arguments cannot be an audit.
    for case, args in [(5, []), (6, [42]), (7, ["not-a-uuid"]), (8, [str(uuid.uuid4())])]:
        app.send_task("audits.run_audit", args=args, task_id=ids[case], queue="audits")
    # Every task's arguments are checked against its annotations, the link check's too:
    # 'not-a-row-id' was dead-lettered twice, as `failed`, by its failure hook.
    for case, args in [(9, ["not-a-row-id"]), (10, [True]), (11, [1.5])]:
        app.send_task("audits.check_shared_link", args=args, task_id=ids[case], queue="audits")

    def all_dead_lettered():
        return DeadLetter.objects.filter(task_id__in=ids.values()).count() == len(ids)

    wait_for(
        all_dead_lettered, timeout=30, message="every malformed message dead-lettered",
        show=[worker],
    )  # fmt: skip
    expected = {
        0: (0, "undecodable body"),
        1: (0, "undecodable body"),
        2: (0, "unknown task 'audits.no_such_task'"),
        3: (0, "not a task message"),
        4: (0, "body is not (args, kwargs, embed)"),
        5: (1, "arguments do not fit audits.run_audit"),
        6: (1, "argument audit_id of audits.run_audit must be str, got 42"),
        7: (1, "audit id 'not-a-uuid' is not a UUID"),
        8: (1, "no audit with id"),
        9: (
            1,
            "argument shared_link_id of audits.check_shared_link must be int, got 'not-a-row-id'",
        ),
        10: (1, "must be int, got True"),
        11: (1, "must be int, got 1.5"),
    }
    for case, (attempts, problem) in expected.items():
        dead = DeadLetter.objects.get(task_id=ids[case])
        assert dead.reason == DeadLetter.Reason.MALFORMED, case
        assert dead.attempts == attempts, case
        assert problem in dead.exception, (case, dead.exception)
    assert '[["a"], {}, {' in DeadLetter.objects.get(task_id=ids[0]).raw_message

    # Not retried and not waiting for redelivery; the worker carries on.
    audit = submit(f"{site.base_url}/")
    assert finished(audit).status == "succeeded"
    assert DeadLetter.objects.count() == len(ids)
    assert redis_client.llen(settings.AUDIT_QUEUE) == 0
    # The audit's last task (its link check) is acknowledged just after it finishes the audit.
    wait_for(
        lambda: redis_client.hlen(f"unacked:{settings.AUDIT_QUEUE}") == 0,
        timeout=10, message="every message acknowledged", show=[worker],
    )  # fmt: skip
    assert "task.retry" not in worker.output()


def test_an_entry_that_is_not_a_message_is_dead_lettered_and_the_worker_lives_on(
    site, dead_lettering_worker, redis_client
):
    # Unpatched kombu stops the worker on the first of these ("Unrecoverable error").
    worker = dead_lettering_worker
    entries = [
        b"this is not json",
        b'{"body": "no properties"}',
        b'{"body": "x", "properties": {"delivery_tag": "t", "body_encoding": "base64"}}',
    ]
    for entry in entries:
        redis_client.lpush(settings.AUDIT_QUEUE, entry)
    wait_for(lambda: DeadLetter.objects.count() == 3, timeout=20, message="three dead letters")
    problems = sorted(DeadLetter.objects.values_list("exception", flat=True))
    assert all(problem.startswith("not a message envelope: ") for problem in problems)
    assert any("JSONDecodeError" in problem for problem in problems)
    assert DeadLetter.objects.filter(raw_message__contains="this is not json").exists()

    audit = submit(f"{site.base_url}/")
    assert finished(audit).status == "succeeded", worker.output()


def test_replay_from_the_admin_runs_the_audit_again(site, start_worker, admin_client):
    # A worker of its own: one attempt, so the flaky page's first failure is final.
    start_worker("audits", env={"AUDIT_MAX_ATTEMPTS": "1"})
    audit = submit(f"{site.base_url}/flaky?key=replay&fail=1")
    assert finished(audit).status == "failed"
    dead = wait_for(lambda: DeadLetter.objects.first(), timeout=10, message="the dead letter")

    response = admin_client.post(
        "/admin/jobs/deadletter/", {"action": "replay", "_selected_action": [dead.id]}
    )
    assert response.status_code == 302

    done = finished(audit)
    assert done.status == "succeeded"
    assert done.attempts == 2
    assert done.task_id != audit.task_id
    dead.refresh_from_db()
    assert dead.replayed_by == "admin"
    assert timezone.now() - dead.replayed_at < timedelta(minutes=1)
    assert dead.replay_task_id == done.task_id
    assert site.flaky_counts["replay"] == 2

    # A second replay of the same row is refused: the audit is not run twice.
    response = admin_client.post(
        "/admin/jobs/deadletter/",
        {"action": "replay", "_selected_action": [dead.id]},
        follow=True,
    )
    assert "already replayed" in response.content.decode()
    assert Audit.objects.get(id=audit.id).task_id == done.task_id


@pytest.mark.django_db(transaction=True)
def test_the_command_replays_a_tasks_dead_letters_since_a_time(site, redis_client):
    failed = []
    for key in ("recent", "old"):
        audit = submit(f"{site.base_url}/?{key}")
        Audit.objects.finish(str(audit.id), status="failed", error="gave up")
        failed.append(audit)
    now = timezone.now()
    common = {"reason": DeadLetter.Reason.ATTEMPTS_EXHAUSTED, "first_failed_at": now}
    recent = DeadLetter.objects.create(
        task_name="audits.run_audit", args=[str(failed[0].id)], kwargs={},
        last_failed_at=now - timedelta(minutes=10), **common,
    )  # fmt: skip
    old = DeadLetter.objects.create(
        task_name="audits.run_audit", args=[str(failed[1].id)], kwargs={},
        last_failed_at=now - timedelta(hours=3), **common,
    )  # fmt: skip
    other = DeadLetter.objects.create(
        task_name="reaudit.other", args=[], kwargs={}, last_failed_at=now, **common
    )
    redis_client.delete(settings.AUDIT_QUEUE)

    call_command("replay_dead_letters", "--task", "audits.run_audit", "--since", "1h")

    recent.refresh_from_db(), old.refresh_from_db(), other.refresh_from_db()
    assert recent.replayed_by.startswith("manage.py replay_dead_letters")
    assert old.replayed_at is None and other.replayed_at is None
    requeued = Audit.objects.get(id=failed[0].id)
    assert requeued.status == "queued" and requeued.error == ""
    assert requeued.task_id == recent.replay_task_id
    assert Audit.objects.get(id=failed[1].id).status == "failed"
    (message,) = redis_client.lrange(settings.AUDIT_QUEUE, 0, -1)
    assert json.loads(message)["headers"]["id"] == requeued.task_id


def test_since_reads_durations_and_dates():
    assert timezone.now() - parse_since("90m") - timedelta(minutes=90) < timedelta(seconds=5)
    assert parse_since("2026-12-01").isoformat() == "2026-12-01T00:00:00+00:00"
    assert parse_since("2026-12-01T08:30+01:00").isoformat() == "2026-12-01T08:30:00+01:00"
