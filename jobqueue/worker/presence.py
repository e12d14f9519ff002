"""Worker presence: each worker advertises itself in one Valkey hash the console reads.

A worker writes its entry at every maintenance turn and deletes it when it stops; an entry left
by a worker that died without a word (SIGKILL) is dropped once it has been silent for
`FORGOTTEN_AFTER` seconds, by any worker. A worker that recycles itself (`recycling.py`) counts
that in `RECYCLES_KEY` as it goes: by reason for the metrics, by its name for the console (a
supervised worker's fresh process takes the same name); a worker's final stop (also one
during a recycle) drops the latter.
"""

from __future__ import annotations

import json
import time
from typing import Any

from ..keys import RECYCLES_KEY, WORKERS_KEY

FORGOTTEN_AFTER = 600.0
"""Seconds without a heartbeat after which a worker is dropped from the console's list."""


def advertise(client: Any, name: str, info: dict[str, Any]) -> None:
    client.hset(WORKERS_KEY, name, json.dumps({**info, "name": name, "heartbeat": time.time()}))


def goodbye(client: Any, name: str) -> None:
    with client.pipeline(transaction=False) as pipe:
        pipe.hdel(WORKERS_KEY, name)
        pipe.hdel(RECYCLES_KEY, f"name:{name}")
        pipe.execute()


def recycled(client: Any, name: str, reason: str, *, final: bool = False) -> None:
    """The worker `name` makes way for a fresh process (`reason`: "max_jobs", "max_memory");
    `final`: it was stopped meanwhile, so no fresh process follows: counted by reason only."""
    with client.pipeline(transaction=False) as pipe:
        pipe.hdel(WORKERS_KEY, name)
        pipe.hincrby(RECYCLES_KEY, reason, 1)
        if final:
            pipe.hdel(RECYCLES_KEY, f"name:{name}")
        else:
            pipe.hincrby(RECYCLES_KEY, f"name:{name}", 1)
        pipe.execute()


def workers(client: Any, stale_after: float = 30.0) -> list[dict[str, Any]]:
    """Workers that advertised themselves, newest heartbeat first, marked stale when quiet,
    each with how often it was recycled."""
    recycles = client.hgetall(RECYCLES_KEY)
    found = _entries(client)
    for info in found:
        info["stale"] = info["age"] > stale_after
        info["recycles"] = int(recycles.get(f"name:{info.get('name')}") or 0)
    return found


def _entries(client: Any) -> list[dict[str, Any]]:
    """The presence entries, each with its age (seconds since its heartbeat), newest first."""
    now = time.time()
    found = []
    for raw in client.hvals(WORKERS_KEY):
        try:
            info = json.loads(raw)
            info["age"] = max(now - float(info["heartbeat"]), 0.0)
        except (ValueError, KeyError, TypeError):
            continue
        found.append(info)
    return sorted(found, key=lambda w: w["age"])


def forget_silent(client: Any, older_than: float = FORGOTTEN_AFTER) -> None:
    """Drop the entries of workers silent for longer than `older_than` seconds (and their
    recycle counts)."""
    gone = [w["name"] for w in _entries(client) if w["age"] > older_than]
    if gone:
        with client.pipeline(transaction=False) as pipe:
            pipe.hdel(WORKERS_KEY, *gone)
            pipe.hdel(RECYCLES_KEY, *(f"name:{name}" for name in gone))
            pipe.execute()
