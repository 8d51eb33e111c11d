"""Every task ends before its queue's visibility timeout hands its message to another worker
(issue 26): otherwise a slow attempt runs twice at once."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.core import checks

from config.celery_app import app
from jobs.task import PlumbTask
from tests.workers import wait_for

app.loader.import_default_modules()
TASKS = sorted(
    name
    for name, task in app.tasks.items()
    if isinstance(task, PlumbTask) and not name.startswith("tests.")
)


def test_every_plumb_task_is_checked():
    assert {
        "audits.run_audit",
        "audits.check_shared_link",
        "webhooks.deliver",
        "reaudit.place",
    } <= set(TASKS)


@pytest.mark.parametrize("name", TASKS)
def test_every_task_ends_before_its_queue_redelivers_it(name):
    task = app.tasks[name]
    visibility = settings.QUEUE_VISIBILITY_TIMEOUTS[task.queue]
    assert task.soft_time_limit, f"{name} has no soft time limit"
    assert task.time_limit, f"{name} has no hard time limit"
    assert task.soft_time_limit < task.time_limit < visibility


def test_manage_py_check_names_a_task_that_would_outlive_its_queues_visibility_timeout(settings):
    assert not [m for m in checks.run_checks() if m.id == "jobs.E001"]
    settings.QUEUE_VISIBILITY_TIMEOUTS = {**settings.QUEUE_VISIBILITY_TIMEOUTS, "audits": 20}
    errors = [m for m in checks.run_checks() if m.id == "jobs.E001"]
    assert {error.msg.split(":")[0] for error in errors} == {
        name for name in TASKS if app.tasks[name].queue == "audits"
    }
    assert "visibility timeout 20 s" in errors[0].msg


def test_a_worker_whose_tasks_would_outlive_the_visibility_timeout_says_so_as_it_starts(
    start_worker,
):
    # The audits task's hard limit is the fetch timeout plus 60 s: 20 s cannot hold it.
    worker = start_worker("audits", env={"AUDITS_VISIBILITY_TIMEOUT_SECONDS": "20"})
    wait_for(
        lambda: (
            "worker.time_limit_exceeds_visibility_timeout" in worker.output()
            and "audits.run_audit" in worker.output()
        ),
        timeout=10,
        message="the worker to name the task whose limits exceed the visibility timeout",
        show=[worker],
    )
