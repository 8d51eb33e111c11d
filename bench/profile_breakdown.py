#!/usr/bin/env python
"""Where each millisecond of a submission and of an audit goes, from py-spy's folded stacks.

    .venv/bin/python bench/throughput.py --phases fast --profile var/profile
    .venv/bin/python bench/profile_breakdown.py var/profile --audits 600

bench/throughput.py --profile runs py-spy (`record --gil --format raw`) on the web and
the audits worker during the end-to-end run. Each sample here is attributed to the
deepest step its stack is in (a log line written while fetching is logging, not
fetch), and the step's share of the samples is spread over the audits of the run:
milliseconds of CPU (the GIL held) per submission and per audit.

A `--gil` sample is wall time of the thread holding the GIL, not CPU time. On a loaded
machine a thread can hold the GIL while it waits for a core, and an audits worker's main
thread (kombu and Celery's consumer) does so far more than its task threads: on
2026-12-06 this breakdown gave the consumer 57 % of the worker while `/proc` per thread,
perf and a CPU-clock sampler all gave it about 9 % (DECISIONS.md, "The broker side of an
audit"). So read the broker step's cost from bench/throughput.py's "the workers' main
threads" figure (their CPU from `/proc`), and the other steps' shares among themselves.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

# (step, pattern on one frame "function (file:line)"), for each side. Listed from the
# outermost to the innermost: the deepest frame that matches any pattern names the step.
SUBMISSION_STEPS = [
    ("HTTP server and Django request cycle", r"\(gunicorn/|\(django/core/handlers/"),
    ("view: request parsing", r"^(data|_parse) \(rest_framework/request.py"),
    ("view: validation", r"^is_valid \(rest_framework/"),
    ("admission script", r"^admit_submission \(audits/admission.py"),
    (
        "row insert (page, audit, commit)",
        r"^(get_or_create_page|create_and_enqueue_audit|submit_audit) \(audits/submission.py",
    ),
    ("publish", r"^enqueue_audit \(audits/tasks.py"),
    (
        "response: serialize and render",
        r"^data \(rest_framework/serializers.py|^render \(rest_framework/",
    ),
    ("logging", r"^(handle|emit|_log) \(logging/"),
]
AUDIT_STEPS = [
    # kombu and Celery's consumer: the broker read, decoding, dispatch to the pool and the
    # acknowledgement (an ack's deepest frames are kombu's).
    ("broker: receive, dispatch, acknowledge", r"\((kombu|celery/worker|celery/concurrency)/"),
    ("task wrapper (Celery trace)", r"^(trace_task|fast_trace_task) \(celery/app/trace.py"),
    (
        "claim duplicate publish, check arguments",
        r"^(claim \(jobs/delayed.py|_check_arguments \(jobs/task.py)",
    ),
    ("downstream host lookup (database)", r"^downstream_host \("),
    ("breaker", r"^_after_verdict \(jobs/task.py|\(jobs/breakers.py"),
    # The attempt's start (its in-flight key, breaker, running-registry entry and metrics:
    # one script) and its end (one pipeline): the metrics' writes are built below, sending
    # either is this step.
    (
        "the attempt's start and its end's pipeline",
        r"^(_start|_send_bookkeeping) \(jobs/task.py|attempt_stopped \(jobs/backlog.py",
    ),
    ("metrics", r"\(jobs/instrumentation.py|\(observability/metrics.py"),
    ("claim audit (database)", r"^claim_audit \(audits/services.py"),
    ("fetch", r"^fetch_page \(outbound/integrations/page.py"),
    ("parse", r"^audit_result \(audits/analysis.py"),
    ("save (finish, commit)", r"^finish \(audits/models.py"),
    ("task events (off unless TASK_EVENTS)", r"\(celery/events/"),
    ("logging", r"^(handle|emit|_log) \(logging/"),
]


def attribute(paths: list[Path], steps: list[tuple[str, str]]) -> Counter:
    """Samples per step, over the profiles of every process of one role."""
    compiled = [(name, re.compile(pattern)) for name, pattern in steps]
    samples: Counter = Counter()
    lines = [line for path in paths for line in path.read_text().splitlines()]
    for line in lines:
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")[1:]  # the first names the process
        step = "other"
        for frame in reversed(frames):
            found = next((name for name, pattern in compiled if pattern.search(frame)), None)
            if found:
                step = found
                break
        samples[step] += int(count)
    return samples


def table(title: str, samples: Counter, *, rate: int, jobs: int) -> str:
    total = sum(samples.values())
    lines = [f"| {title} | ms per job | share |", "| --- | ---: | ---: |"]
    for step, count in samples.most_common():
        lines.append(f"| {step} | {count / rate * 1000 / jobs:.2f} | {count / total:.0%} |")
    lines.append(f"| **total** | **{total / rate * 1000 / jobs:.2f}** | |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("folder", type=Path)
    parser.add_argument("--audits", type=int, default=600, help="audits in the profiled run")
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--tag", default="fast")
    args = parser.parse_args()
    web = attribute([args.folder / f"{args.tag}-web.txt"], SUBMISSION_STEPS)
    # One profile per audits worker (AUDITS_WORKER_PROCESSES).
    workers = sorted(args.folder.glob(f"{args.tag}-worker-audits*.txt"))
    worker = attribute(workers, AUDIT_STEPS)
    print(table("submission step (web)", web, rate=args.rate, jobs=args.audits))
    print()
    print(table("audit step (audits workers)", worker, rate=args.rate, jobs=args.audits))


if __name__ == "__main__":
    main()
