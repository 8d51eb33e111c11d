"""Every task ends before its queue's visibility timeout hands its message to another worker
(issue 26): otherwise a slow attempt runs twice at once."""

from __future__ import annotations

import pytest
from django.conf import settings

from config.celery_app import app
from jobs.task import PlumbTask

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
