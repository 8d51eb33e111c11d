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


def header(request, name: str):
    """A header of the message being run (Celery puts custom headers on the request)."""
    value = request.get(name)
    if value is None:
        value = (request.headers or {}).get(name)
    return value
