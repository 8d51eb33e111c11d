"""The one failure taxonomy every Plumb job raises, whatever it calls.

Downstream code (the page fetch, a link check, GitHub, a webhook POST) says what
went wrong with one of these, and the job runtime decides what happens next
(`jobs.policy`): a `Transient` error is retried with backoff, or after the
downstream's own `retry_after` in full; a `RateLimited` wait is deferred without
spending an attempt; a `Permanent` error ends the job at once. A wait longer than
RATELIMIT_MAX_WAIT_SECONDS ends the job too, as `WaitTooLong`, carrying the time asked for.
"""

from __future__ import annotations

import time

# An error's message is where a downstream's text enters Plumb (a receiver's body, an
# API's message, a URL), and every store of an error takes its text from the message:
# a delivery's last_error, an audit's error, a link's detail, a dead letter.
MESSAGE_LIMIT = 2000


def storable_message(text: str) -> str:
    """The text bounded, NUL shown as `\\x00`: PostgreSQL's text columns refuse NUL, and
    one in a receiver's answer failed the write of the delivery's error."""
    text = text.replace("\x00", "\\x00")
    return text if len(text) <= MESSAGE_LIMIT else text[: MESSAGE_LIMIT - 1] + "\u2026"


class Transient(Exception):
    """Worth trying again later: a timeout, a refused connection, a 5xx, a 429.

    `retry_after` is the downstream's own wait in seconds (Retry-After), obeyed in
    full; None lets the policy's backoff decide.
    """

    def __init__(
        self, message: str, *, retry_after: float | None = None, status_code: int | None = None
    ):
        super().__init__(storable_message(message))
        self.retry_after = retry_after
        self.status_code = status_code

    def __reduce__(self):
        return (_rebuild, (self.__class__, self.args, self.__dict__))


class RateLimited(Transient):
    """A call may not be made before `retry_at` (epoch seconds): wait, do not spend an attempt.

    `key` and `resource` name the bucket the call waits on (`host:example.com`,
    `default`; `github-installation:77`, `core`): the job is woken when that bucket
    admits it again. `retry_at` None means nobody said when (all of a host's
    slots are busy): the policy backs off on the job's deferral count.

    `resume` (JSON) says where the run had got to, when it was stopped part-way (a
    redirect chain at a busy hop): the deferred job's next run starts there
    (jobs.headers.RESUME_HEADER) instead of asking again what was answered already.
    """

    def __init__(
        self,
        key: str,
        resource: str,
        retry_at: float | None,
        reason: str = "",
        resume: dict | None = None,
    ):
        self.key = key
        self.resource = resource
        self.retry_at = retry_at
        self.reason = reason
        self.resume = resume
        when = (
            "until " + time.strftime("%H:%M:%S UTC", time.gmtime(retry_at))
            if retry_at is not None
            else "(no time given)"
        )
        super().__init__(
            f"{key} {resource} rate limited {when}{': ' + reason if reason else ''}",
            retry_after=None if retry_at is None else max(0.0, retry_at - time.time()),
        )

    @property
    def wait_on(self) -> tuple[str, str]:
        """The bucket whose admission wakes the waiting job."""
        return self.key, self.resource

    def __reduce__(self):
        return (
            self.__class__,
            (self.key, self.resource, self.retry_at, self.reason, self.resume),
        )


class Permanent(Exception):
    """Trying again cannot help: a forbidden target, a redirect loop, a receiver's 4xx."""

    def __init__(self, message: str, *, status_code: int | None = None):
        super().__init__(storable_message(message))
        self.status_code = status_code


class WaitTooLong(Permanent):
    """A downstream asked for a longer wait than RATELIMIT_MAX_WAIT_SECONDS: the job is not
    held that long, it ends rate limited. `retry_at` (epoch seconds) is when the downstream
    said it may be asked again."""

    def __init__(self, message: str, *, retry_at: float, status_code: int | None = None):
        super().__init__(message, status_code=status_code)
        self.retry_at = retry_at

    def __reduce__(self):
        return (_rebuild, (self.__class__, self.args, self.__dict__))


class MalformedTaskMessage(Permanent):
    """A message no retry can fix: its arguments cannot belong to a real task."""


class CannotReplay(Exception):
    """Replaying this dead letter would make no sense; the message says why."""


def _rebuild(cls, args, state):
    error = cls.__new__(cls)
    Exception.__init__(error, *args)
    error.__dict__.update(state)
    return error
