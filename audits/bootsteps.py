"""The audits worker's own processes, started and stopped with it (config.celery_app adds
the step)."""

from __future__ import annotations

from django.conf import settings

from audits import treebuild
from jobs.bootsteps import UsedByTasks, runs_threads


class TreeBuilders(UsedByTasks):
    """The children that build large pages' trees (audits.treebuild), in a worker of
    threads consuming the audits queue: a prefork pool's own hard time limit kills the
    process that runs the parse, and no other queue parses pages. A warm shutdown stops
    them once the pool's running audits have finished (UsedByTasks)."""

    label = "Tree builders"

    def include_if(self, worker) -> bool:
        return runs_threads(worker) and settings.AUDIT_QUEUE in worker.app.amqp.queues.consume_from

    def start(self, worker):
        treebuild.start(settings.AUDIT_TREE_PROCESSES, memory_mb=settings.AUDIT_TREE_MEMORY_MB)

    def stop(self, worker):
        super().stop(worker)
        treebuild.stop()
