"""Configuration checks of the job runtime, run by `manage.py check` (and so by `migrate`,
which `make run` runs first); a worker logs the time-limit problems as it starts
(jobs.bootsteps.TimeLimitCheck)."""

from __future__ import annotations

from django.apps import apps
from django.conf import settings
from django.core import checks
from django.utils.module_loading import autodiscover_modules

from config.celery_app import app
from jobs.deadlines import deadline_problems
from jobs.task import PlumbTask


def plumb_tasks() -> list[PlumbTask]:
    """Every PlumbTask an installed app declares (a test's probe tasks are not one).

    Each app's `tasks` module is imported the way Django discovers `admin` modules: Celery's
    own `import_default_modules` would run Django's checks again from inside this one."""
    autodiscover_modules("tasks")
    return [
        task
        for task in app.tasks.values()
        if isinstance(task, PlumbTask) and apps.get_containing_app_config(task.__module__)
    ]


def time_limits_fit_visibility_timeouts(app_configs=None, **kwargs) -> list[checks.Error]:
    return [
        checks.Error(
            problem,
            hint="Raise the queue's *_VISIBILITY_TIMEOUT_SECONDS or lower the task's timeouts "
            "(docs/configuration.md).",
            id="jobs.E001",
        )
        for problem in deadline_problems(plumb_tasks(), settings.QUEUE_VISIBILITY_TIMEOUTS)
    ]
