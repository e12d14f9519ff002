"""Adaptive shards (`"shards": "auto"`, `"max_shards": 16`): a queue's live count follows its load.

Every `every` seconds one worker (a lock key per queue) looks at each automatic queue: its
backlog (pending and scheduled jobs) and its finish rate (jobs/s), per live shard. Past the grow
thresholds for `grow_after` checks in a row, the count doubles (up to `max_shards`); below the
shrink thresholds for `shrink_after` checks in a row, it halves (down to 1), and the shards
beyond drain, then retire (`layout`). Growing is quick and shrinking slow, and the two thresholds
are far apart, so the count does not flap; no change is made while the last one settles.
Thresholds: `JOBQUEUE["AUTO_SHARDS"]` (`conf.AutoShards`).
"""

from __future__ import annotations

import json
import time

from ..conf import AutoShards
from ..engine import layouts
from ..engine.store import Queue

STATE_KEY = "{emq}:autoscale"
TURN_KEY = "{emq}:autoscale-turn:"


def check(queue: Queue, limits: AutoShards) -> tuple[int, int] | None:
    """Look at one automatic queue if it is this worker's turn; (from, to) when it resized."""
    client = queue.client
    if not layouts.one_turn(client, TURN_KEY + queue.name, limits.every):
        return None
    layout = queue.layout(fresh=True)
    counts = queue.counts()
    finished = sum(counts[state] for state in ("succeeded", "dead", "cancelled", "expired"))
    backlog = counts["pending"] + counts["scheduled"]
    state = _state(client.hget(STATE_KEY, queue.name))
    now = time.time()
    rate = 0.0
    if "at" in state and now > state["at"]:
        rate = max(finished - state.get("finished", finished), 0) / (now - state["at"])
    live = layout.live
    busy = backlog / live > limits.grow_backlog or rate / live > limits.grow_rate
    quiet = backlog / live < limits.shrink_backlog and rate / live < limits.shrink_rate
    grow = state.get("grow", 0) + 1 if busy else 0
    shrink = state.get("shrink", 0) + 1 if quiet else 0
    target = live
    if not layout.settling:
        if grow >= limits.grow_after and live < queue.options.max_shards:
            target = min(live * 2, queue.options.max_shards)
        elif shrink >= limits.shrink_after and live > 1:
            target = max(live // 2, 1)
    if target != live:
        queue.resize(target, by=f"auto: backlog {backlog}, {rate:.0f} jobs/s")
        grow = shrink = 0
    client.hset(STATE_KEY, queue.name, json.dumps(
        {"at": now, "finished": finished, "grow": grow, "shrink": shrink}))
    return (live, target) if target != live else None


def _state(raw: str | None) -> dict[str, float]:
    """The last check's state; a corrupt one starts counting afresh (it must not stop a worker)."""
    try:
        state = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return state if isinstance(state, dict) else {}

