"""Reading what is really in Redis: queued messages and the messages a worker holds."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from datetime import datetime

# kombu's Redis transport keeps each priority level of a queue in its own list.
PRIORITY_SEPARATOR = "\x06\x16"


@dataclass(frozen=True)
class Message:
    task: str
    id: str
    eta: datetime | None
    args: list

    @classmethod
    def parse(cls, raw: bytes | str | dict) -> Message:
        payload = raw if isinstance(raw, dict) else json.loads(raw)
        headers = payload["headers"]
        args, _kwargs, _embed = json.loads(base64.b64decode(payload["body"]))
        eta = datetime.fromisoformat(headers["eta"]) if headers.get("eta") else None
        return cls(task=headers["task"], id=headers["id"], eta=eta, args=args)


def queued(client, queue: str) -> list[Message]:
    """The messages waiting in `queue` (every priority list)."""
    keys = [queue.encode(), *client.keys(f"{queue}{PRIORITY_SEPARATOR}*")]
    return [Message.parse(raw) for key in keys for raw in client.lrange(key, 0, -1)]


def held(client, queue: str) -> list[Message]:
    """The messages `queue`'s workers have taken but not acknowledged.

    This is where a worker's ETA messages sit while it keeps them in memory.
    """
    return [Message.parse(json.loads(raw)[0]) for raw in client.hvals(f"unacked:{queue}")]


def backlog(client, queue: str) -> int:
    """Messages waiting or taken-but-unfinished: what a queue-depth check would see."""
    return len(queued(client, queue)) + client.hlen(f"unacked:{queue}")
