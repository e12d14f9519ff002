"""Worker presence: each worker advertises itself in one Valkey hash the console reads.

A worker writes its entry at every maintenance turn and deletes it when it stops; an entry left
by a worker that died without a word (SIGKILL) is dropped once it has been silent for
`FORGOTTEN_AFTER` seconds, by any worker.
"""

from __future__ import annotations

import json
import time
from typing import Any

from ..keys import WORKERS_KEY

FORGOTTEN_AFTER = 600.0
"""Seconds without a heartbeat after which a worker is dropped from the console's list."""


def advertise(client: Any, name: str, info: dict[str, Any]) -> None:
    client.hset(WORKERS_KEY, name, json.dumps({**info, "name": name, "heartbeat": time.time()}))


def goodbye(client: Any, name: str) -> None:
    client.hdel(WORKERS_KEY, name)


def workers(client: Any, stale_after: float = 30.0) -> list[dict[str, Any]]:
    """Workers that advertised themselves, newest heartbeat first, marked stale when quiet."""
    now = time.time()
    found = []
    for raw in client.hvals(WORKERS_KEY):
        try:
            info = json.loads(raw)
            info["age"] = max(now - float(info["heartbeat"]), 0.0)
        except (ValueError, KeyError, TypeError):
            continue
        info["stale"] = info["age"] > stale_after
        found.append(info)
    return sorted(found, key=lambda w: w["age"])


def forget_silent(client: Any, older_than: float = FORGOTTEN_AFTER) -> None:
    """Drop the entries of workers silent for longer than `older_than` seconds."""
    gone = [w["name"] for w in workers(client) if w["age"] > older_than]
    if gone:
        client.hdel(WORKERS_KEY, *gone)
