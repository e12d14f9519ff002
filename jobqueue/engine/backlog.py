"""How long ready work has waited: a read model for the console, the metrics and the worker's
summary line, over the shards' lane heads (`heads.lua`), and the rate buckets' level on Valkey's
clock.

`sample` writes the dashboard's per-minute samples (`m:<minute>` hashes of shard 0, kept two
hours) that the console's charts read; everything else here only reads.
"""

from __future__ import annotations

from ..options import rate as spec_rate
from .scripts import operator_calls
from .scripts.answers import Head
from .store import Queue

SAMPLE_TTL = 7200
"""Seconds a minute's sample is kept (the charts show the last two hours)."""


def server_ms(queue: Queue) -> int:
    """Valkey's clock, in ms (the clock every lease, due time and wait is measured on)."""
    seconds, micros = queue.client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def heads(queue: Queue, index: int, lanes: int = 1000, bands: int = 10) -> list[Head]:
    """(lane, job id, ms it became ready) of the first job of each priority band of shard
    `index`'s lanes with ready work (the first `lanes` of its ring, and up to `lanes` each of
    those held back by their cap or rate): where its longest waits are."""
    return operator_calls.heads(queue.client, queue.shard(index), lanes, bands)


def oldest_wait(queue: Queue, now: int | None = None, lanes: int = 1000) -> float | None:
    """Seconds the longest-waiting ready job has waited (server clock, `now` in ms if the caller
    has it), among the lanes `heads` reads on each shard; None when none waits."""
    if now is None:
        now = server_ms(queue)
    oldest = min((ready for i in range(queue.claim_shards()) for _, _, ready in heads(queue, i, lanes)),
                 default=None)
    return None if oldest is None else max(now - oldest, 0) / 1000


def sample(queue: Queue, waiting: int, oldest: float | None) -> None:
    """Note this minute's backlog and oldest wait for the dashboard's charts (workers call it at
    each summary; the last sample of a minute stands)."""
    seconds, _ = queue.client.time()
    key = queue.shard(0).key(f"m:{int(seconds) // 60}")
    queue.client.hset(key, mapping={"backlog": waiting, "oldest_ms": round((oldest or 0.0) * 1000)})
    queue.client.expire(key, SAMPLE_TTL)


def bucket_level(queue: Queue, now: int) -> float | None:
    """How many jobs a rate-limited queue's buckets would admit at `now` (server ms)."""
    limit = spec_rate(queue.options.rate)
    if limit is None:
        return None
    share, period = limit[0] / queue.shards, limit[1]
    capacity = max(share, 1.0)  # as the claim script keeps it
    level = 0.0
    for index in range(queue.shards):
        tokens, at = queue.client.hmget(queue.shard(index).key("bucket"), "tokens", "at")
        if tokens is None or at is None:
            level += capacity  # never used: full
            continue
        level += min(capacity, float(tokens) + max(now - int(at), 0) * share / period)
    return level
