"""The message headers Plumb puts on a job, and how a running task reads them."""

from __future__ import annotations

# Stamped on every task message when it is published (a retry is a new publish),
# so a worker can tell how long the message waited once it was due.
PUBLISHED_AT_HEADER = "plumb_published_at"
# When the job first failed, carried from one retry to the next (for its dead letter).
FIRST_FAILED_AT_HEADER = "plumb_first_failed_at"
# How many times the job was deferred by a rate limit or a busy host (no attempt spent).
DEFERRALS_HEADER = "plumb_deferrals"
# How many times the job waited out an outage of PostgreSQL or Redis (no attempt spent).
OUTAGES_HEADER = "plumb_outages"
# Carried from one wait to the next.
CARRIED_HEADERS = (FIRST_FAILED_AT_HEADER, DEFERRALS_HEADER, OUTAGES_HEADER)
# Where a deferred run had got to (`RateLimited.resume`, JSON), for the next run to
# start there: carried by deferrals and parks (no attempt was spent, so the attempt
# goes on), dropped by a retry (a new attempt starts from the beginning).
RESUME_HEADER = "plumb_resume"


def header(request, name: str):
    """A header of the message being run (Celery puts custom headers on the request)."""
    value = request.get(name)
    if value is None:
        value = (request.headers or {}).get(name)
    return value


def resumed_from(request):
    """Where the previous run of this job stopped when it was deferred, or None."""
    return header(request, RESUME_HEADER)
