"""Tenant controls on lanes: caps set live, and the lanes' slots and holds as the console and the
metrics read them.

A queue's settings cap each lane (`lane_concurrency`) and rate it (`lane_rate`); the claim script
enforces both (claim.lua) and every transition that ends an attempt frees its slot (_lanes.lua).
A cap set live (`set_cap`) is kept in each shard's `caps` hash, marked in its `meta` (a claim of
a queue without one skips the read, and an enqueue hands no job over while one is set); a shard
that a resize or a raised `shards` setting adds copies shard 0's (`copy_caps`, which layouts.py
calls). This module reads and writes `caps`, and only reads `slots`, `capped` and `rated`, which
the scripts keep.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from ..keys import ShardKeys, validate_lane
from ..options import EVERY_LANE, QueueOptions, lane_cap
from .scripts import operator_calls


def set_cap(client: Any, queue: str, shards: int, lane: str, cap: int | None) -> None:
    """Set `lane`'s cap live on each of `shards` ('' the default lane, "*" every named lane the
    caps do not name), or drop it with None (the settings' cap applies again)."""
    if lane not in ("", EVERY_LANE):
        validate_lane(lane)
    value = 0 if cap is None else lane_cap(cap, f"the cap of lane {lane!r}")
    for index in range(shards):
        operator_calls.set_lane_concurrency(client, ShardKeys(queue, index), lane, value)


def live_caps(client: Any, queue: str) -> dict[str, int]:
    """The caps set live (shard 0 holds every one: `set_cap` writes each shard)."""
    return {lane: int(cap) for lane, cap in client.hgetall(ShardKeys(queue, 0).key("caps")).items()}


def copy_caps(client: Any, queue: str, shards: int) -> None:
    """Give shards 1…shards-1 the caps set live on shard 0 (a resize, or a raised `shards`
    setting, added shards)."""
    caps = live_caps(client, queue)
    if not caps:
        return
    for index in range(1, shards):
        shard = ShardKeys(queue, index)
        client.hset(shard.key("caps"), mapping=caps)
        client.hset(shard.key("meta"), "caps", "1")


def cap_for(options: QueueOptions, live: dict[str, int], lane: str) -> tuple[int | None, bool]:
    """A lane's cap as the claim finds it — set live for the lane, else the settings' for it,
    else (a named lane) the "*" one, live before settings — and whether it was set live; None:
    uncapped."""
    given = dict(options.lane_concurrency)
    for source, name in ((live, lane), (given, lane), (live, EVERY_LANE), (given, EVERY_LANE)):
        if name in source and (name == lane or lane):
            return source[name], source is live
    return None, False


@dataclass(frozen=True)
class LaneState:
    """One lane as the console shows it: its cap, its slots in use and what holds it back."""

    lane: str
    active: int
    """Its jobs running now that hold a slot of its cap."""
    cap: int | None
    live: bool
    """Whether the cap was set live (`set_cap`), not by the settings."""
    held: str = ""
    """"cap" (at its cap, with ready work, taken off the ring by the claim that met it there),
    "rate" (out of tokens), or "" (on the ring)."""
    due_ms: int | None = None
    """For a lane held by its rate: the server time (ms) its next token is due."""


def states(client: Any, queue: str, shards: int, options: QueueOptions,
           limit: int = 50) -> list[LaneState]:
    """The busiest lanes (slots in use), then those held back, at most `limit`: each shard's
    `slots` hash holds only lanes with jobs running, so the read is bounded by them."""
    active: Counter[str] = Counter()
    held: dict[str, tuple[str, int | None]] = {}
    for index in range(shards):
        shard = ShardKeys(queue, index)
        with client.pipeline(transaction=False) as pipe:
            pipe.hgetall(shard.key("slots"))
            pipe.srandmember(shard.key("capped"), limit)
            pipe.zrange(shard.key("rated"), 0, limit - 1, withscores=True)
            slots, capped, rated = pipe.execute()
        active.update({lane: int(n) for lane, n in slots.items()})
        held.update({lane: ("cap", None) for lane in capped})
        held.update({lane: ("rate", int(due)) for lane, due in rated})
    live = live_caps(client, queue)
    names = [lane for lane, _ in active.most_common(limit)]
    names += [lane for lane in sorted(held) if lane not in active][: max(limit - len(names), 0)]
    return [LaneState(lane, active[lane], *cap_for(options, live, lane), *held.get(lane, ("", None)))
            for lane in names]


def busiest(client: Any, queue: str, shards: int, top: int = 10) -> list[tuple[str, int]]:
    """The `top` lanes with the most slots in use (the metrics' bounded `jobqueue_lane_active`)."""
    active: Counter[str] = Counter()
    for index in range(shards):
        active.update({lane: int(n) for lane, n in
                       client.hgetall(ShardKeys(queue, index).key("slots")).items()})
    return active.most_common(top)
