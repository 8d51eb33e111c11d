"""Time limits for tasks that run in a worker's threads, where Celery enforces none.

Celery enforces `soft_time_limit` and `time_limit` only in a prefork pool: it signals
or kills the child process. The audits queue runs in a thread pool (docs/workers.md),
so the runtime enforces them itself, with the same outcome for the job:

- past its soft limit, `SoftTimeLimitExceeded` is raised in the thread running it;
- past its hard limit, `TimeLimitExceeded` is raised there (a task that caught the
  first one and went on).

Either ends the attempt like any failure (jobs.task.PlumbTask: dead-lettered, the
audit finished as failed). An exception is delivered when the thread next runs Python
code, so a call blocked in C returns first: every such call Plumb makes has its own
timeout (the fetch's deadline, the database's and Redis's socket timeouts, a large page's
tree built in a child with its own deadline: audits.treebuild).

PlumbTask registers each attempt with the thread running it; the `TimeLimitWatchdog`
bootstep calls `enforce` every second in a thread-pool worker.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from dataclasses import dataclass

from billiard.exceptions import SoftTimeLimitExceeded, TimeLimitExceeded

log = logging.getLogger(__name__)


@dataclass
class Attempt:
    task: str
    task_id: str
    started: float
    soft_limit: float | None
    hard_limit: float | None
    raised: type[BaseException] | None = None


_running: dict[int, Attempt] = {}
_lock = threading.Lock()


def attempt_started(task: str, task_id: str, *, soft_limit, hard_limit) -> None:
    with _lock:
        _running[threading.get_ident()] = Attempt(
            task, task_id, time.monotonic(), soft_limit or None, hard_limit or None
        )


def attempt_stopped() -> None:
    """Deregister this thread's attempt; an exception not yet delivered is withdrawn."""
    with _lock:
        attempt = _running.pop(threading.get_ident(), None)
        if attempt is not None and attempt.raised is not None:
            _set_async_exception(threading.get_ident(), None)


def enforce(now: float | None = None) -> int:
    """Raise the due limit in each thread whose attempt passed it; returns how many."""
    now = time.monotonic() if now is None else now
    raised = 0
    with _lock:
        for ident, attempt in _running.items():
            exception = _due(attempt, now - attempt.started)
            if exception is None:
                continue
            attempt.raised = exception
            _set_async_exception(ident, exception)
            raised += 1
            log.warning(
                "task.time_limit",
                extra={"task": attempt.task, "task_id": attempt.task_id,
                       "limit": exception.__name__, "seconds": round(now - attempt.started, 1)},
            )  # fmt: skip
    return raised


def _due(attempt: Attempt, elapsed: float) -> type[BaseException] | None:
    if (
        attempt.hard_limit
        and elapsed >= attempt.hard_limit
        and attempt.raised is not TimeLimitExceeded
    ):
        return TimeLimitExceeded
    if attempt.soft_limit and elapsed >= attempt.soft_limit and attempt.raised is None:
        return SoftTimeLimitExceeded
    return None


def _set_async_exception(ident: int, exception: type[BaseException] | None) -> None:
    # CPython's documented C API for raising in another thread (NULL clears a pending one).
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(ident), ctypes.py_object(exception) if exception else None
    )
