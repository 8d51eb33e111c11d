"""jobs.transport: the one private kombu method it overrides is the version reviewed, and
redis-py parses the broker's replies in C."""

from __future__ import annotations

import hashlib
import inspect

import pytest
from kombu.transport import redis
from redis import connection as redis_connection
from redis._parsers import _HiredisParser

from config.redis import redis_client
from jobs.transport import Channel, UnreadableEnvelope

# sha256 of `inspect.getsource(kombu.transport.redis.Channel._brpop_read)` in kombu 5.7.0,
# reviewed for jobs.transport: it pops an entry, decodes it with kombu.utils.json.loads
# (a JSONDecodeError whose `doc` is the entry), builds the message with Channel.Message
# before a consumer sees it, and resets its poll state in a `finally`.
REVIEWED_BRPOP_READ = "c42518699709f2df90f55a048fe6346612ae5527e5c4a6819f2c0920dc62088f"


def test_the_private_kombu_method_overridden_is_the_version_reviewed():
    source = inspect.getsource(redis.Channel._brpop_read)
    assert hashlib.sha256(source.encode()).hexdigest() == REVIEWED_BRPOP_READ, (
        "kombu changed Channel._brpop_read: check jobs.transport against the new code "
        "(what it raises for an entry it cannot read, and that its finally still resets "
        "the poll state), then update REVIEWED_BRPOP_READ"
    )


@pytest.mark.parametrize(
    "payload",
    [
        {"body": "no properties"},
        {"body": "x", "properties": {"delivery_tag": "t", "body_encoding": "base64"}},
        ["not", "an", "object"],
    ],
)
def test_a_payload_that_is_not_an_envelope_cannot_become_a_message(payload):
    with pytest.raises(UnreadableEnvelope) as raised:
        Channel.Message(payload, channel=object.__new__(Channel))
    assert raised.value.payload == payload


def test_an_envelope_becomes_kombus_message():
    envelope = {"body": "eA==", "properties": {"delivery_tag": "t", "body_encoding": "base64"}}
    message = Channel.Message(envelope, channel=object.__new__(Channel))
    assert (message.body, message.delivery_tag) == (b"x", "t")


def test_redis_replies_are_parsed_in_c():
    """hiredis is what redis-py parses every reply with, the broker's included (kombu's
    channels build their clients from redis-py's default connection class). Without it
    redis-py falls back to its Python parser silently, at about a fifth more CPU for each
    reply (DECISIONS.md, "The broker side of an audit")."""
    assert redis_connection.DefaultParser is _HiredisParser
    connection = redis_client().connection_pool.make_connection()
    try:
        assert isinstance(connection._parser, _HiredisParser)
    finally:
        connection.disconnect()
