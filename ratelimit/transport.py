"""kombu's Redis transport, except that an unreadable queue entry is dead-lettered, not fatal.

A worker pops a queue entry (BRPOP) and parses kombu's JSON envelope before
Celery sees anything. In kombu 5.7 an entry that is not such an envelope
raises out of the event loop and the worker stops ("Unrecoverable error:
JSONDecodeError"), with the entry already gone from Redis: one stray LPUSH
takes a worker down and leaves no trace. `Channel._brpop_read` below is
kombu 5.7.0's, with the envelope checked before delivery; anything that is
not one becomes a dead letter with its raw bytes. The test
`test_an_entry_that_is_not_a_message_is_dead_lettered_and_the_worker_lives_on`
fails if a kombu upgrade changes the method under us.
"""

from __future__ import annotations

import logging
from queue import Empty

from kombu.transport import redis
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import loads

log = logging.getLogger(__name__)

RAW_ENTRY_LIMIT = 64 * 1024


class Channel(redis.Channel):
    def _brpop_read(self, **options):
        try:
            try:
                dest__item = self.client.parse_response(self.client.connection, "BRPOP", **options)
            except self.connection_errors:
                # As kombu: disconnect so the next iteration reconnects.
                self.client.connection.disconnect()
                raise
            if not dest__item:
                raise Empty()
            dest, item = dest__item
            dest = bytes_to_str(dest).rsplit(self.sep, 1)[0]
            self._queue_cycle.rotate(dest)
            envelope = self._readable_envelope(dest, item)
            if envelope is not None:
                self.connection._deliver(envelope, dest)
            return True
        finally:
            self._in_poll = None
            self._flush_brpop_reauth()

    def _readable_envelope(self, queue: str, item: bytes) -> dict | None:
        try:
            envelope = loads(bytes_to_str(item))
            # What the consumer's callback does first; a broken envelope fails here.
            self.Message(envelope, channel=self)
        except Exception as exc:  # noqa: BLE001 - anything unreadable is dead-lettered
            _dead_letter_entry(queue, item, exc)
            return None
        return envelope


def _dead_letter_entry(queue: str, item: bytes, exc: Exception) -> None:
    from jobs.deadletters import record_rejected_message

    raw = item.decode("utf-8", errors="backslashreplace") if isinstance(item, bytes) else str(item)
    raw = raw.replace("\x00", "\\x00")[:RAW_ENTRY_LIMIT]
    try:
        record_rejected_message(
            task_name="", task_id="", queue=queue, args=None, kwargs=None,
            raw_message=f"queue entry: {raw}",
            problem=f"not a message envelope: {exc.__class__.__name__}: {exc}",
        )  # fmt: skip
    except Exception:
        log.exception("task.dead_letter_failed", extra={"queue": queue, "raw": raw})


class Transport(redis.Transport):
    Channel = Channel
