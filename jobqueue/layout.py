"""A queue's live shard layout: how many shards take new jobs, which are still drained, and the
count before the last resize while its lanes settle. `manage.py jobqueue resize` changes it
without stopping anything (PinLater's free sharding, Pacer's draining shrink).

In Valkey: `{emq}:shards`, a HASH of queue → "live prior span", next to the queue registry
(`{emq}:queues`: queue → the widest count it ever had). A queue never resized has no entry: its
count is the `shards` setting. Producers and workers read the layout at most once a second.

- `live`: shards that take new jobs; placement is computed over them (`hash mod live`).
- `span`: shards workers claim from: the live ones and those still draining (`live ≤ i < span`).
- `prior`: the live count before the last resize while the move settles, else 0. A job with a
  lane (or a unique key) whose shard differs under the prior count goes first to its prior
  shard, which takes it only while that lane holds ready jobs there (or returns the live job of
  that key): so a lane keeps its order, and a key its single live job, across the resize.

A shard beyond `live` carries `draining` in its `meta` hash: its enqueue script turns away new
jobs (the producer re-reads the layout), so a producer that has not yet seen a shrink cannot
strand a job on a shard about to retire. Workers settle a resize (`settle`): once no draining
shard holds waiting or running work and no lane or live unique key sits on a shard other than
its live one, `prior` returns to 0 and `span` to `live`; the shards beyond are retired.
"""

from __future__ import annotations

import json
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .exceptions import InvalidOption
from .keys import REGISTRY_KEY

LAYOUT_KEY = "{emq}:shards"
HISTORY_KEY = "{emq}:resizes"
"""LIST of the last resizes of every queue, newest first (JSON: at, queue, from, to, by)."""
RESIZES_KEY = "{emq}:resize-counts"
"""HASH `<queue>:grow` / `<queue>:shrink` → how many, for the metrics."""
HISTORY_LENGTH = 200
SETTLE_TURN = "{emq}:settling:"
TTL = 1.0
MAX_SHARDS = 1024

# Write the layout only if nobody changed it since it was read (compare and set), and raise the
# registry's widest count to cover it.
_CAS = """
local cur = redis.call('HGET', KEYS[1], ARGV[1]) or ''
if cur ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
local widest = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0')
if tonumber(ARGV[4]) > widest then redis.call('HSET', KEYS[2], ARGV[1], ARGV[4]) end
return 1
"""


@dataclass(frozen=True)
class Layout:
    live: int
    prior: int
    span: int
    widest: int
    raw: str = ""
    """The stored value this was read from ('' = never resized), for compare-and-set."""

    @property
    def settling(self) -> bool:
        """A resize is being worked off. A queue never resized is not settling even when its
        setting was lowered: producers with the old setting may still place jobs beyond it,
        so those shards are drained for good, as before live resize existed."""
        return bool(self.raw) and (bool(self.prior) or self.span > self.live)

    def status(self, index: int) -> str:
        if index < self.live:
            return "active"
        return "draining" if index < self.span else "retired"

    def encode(self) -> str:
        return f"{self.live} {self.prior} {self.span}"


_cache: weakref.WeakKeyDictionary[Any, dict[tuple[str, int], tuple[float, Layout]]] = (
    weakref.WeakKeyDictionary())


def read(client: Any, name: str, configured: int, *, fresh: bool = False) -> Layout:
    """The queue's layout, from this process's cache when read less than a second ago."""
    known = _cache.get(client)  # (setdefault would make a weak reference per call)
    if known is None:
        known = _cache.setdefault(client, {})
    hit = known.get((name, configured))
    now = time.monotonic()
    if hit is not None and hit[0] > now and not fresh:
        return hit[1]
    pipe = client.pipeline(transaction=False)
    pipe.hget(LAYOUT_KEY, name)
    pipe.hget(REGISTRY_KEY, name)
    raw, seen = pipe.execute()
    widest = max(int(seen or 0), configured)
    if raw:
        live, prior, span = (int(part) for part in raw.split())
        layout = Layout(live, prior, span, max(widest, span), raw)
    else:  # never resized: the setting's count; shards beyond it (a lowered setting) drain
        layout = Layout(configured, 0, widest, widest)
    known[name, configured] = (now + TTL, layout)
    return layout


def last_read(client: Any, name: str, configured: int) -> int:
    """The live count this process last read (else `configured`), without asking Valkey."""
    hit = _cache.get(client, {}).get((name, configured))
    return hit[1].live if hit is not None else configured


def forget(name: str) -> None:
    """Drop this process's cached layouts of a queue (after changing it here)."""
    for known in _cache.values():
        for key in [k for k in known if k[0] == name]:
            del known[key]


def validate_count(count: Any) -> int:
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_SHARDS:
        raise InvalidOption(f"a shard count must be an integer in 1…{MAX_SHARDS}, got {count!r}")
    return count


def plan(current: Layout, count: int) -> Layout:
    """The layout after resizing to `count`, or an error saying why not now."""
    validate_count(count)
    if current.prior and count not in (current.live, current.prior):
        raise InvalidOption(
            f"the last resize ({current.prior} → {current.live} shards) is still settling: its "
            f"lanes and draining shards are being worked off; resize again once it has settled "
            f"(or back to {current.prior})")
    if count == current.live:
        return current
    span = max(current.span, current.live, count)
    return Layout(count, current.live, span, max(current.widest, span))


def write(client: Any, name: str, before: Layout, after: Layout) -> bool:
    """Store `after` if the stored layout is still `before`; False if another change came first."""
    cas = client.register_script(_CAS)
    done = cas(keys=[LAYOUT_KEY, REGISTRY_KEY], args=[name, before.raw, after.encode(), after.widest])
    forget(name)
    return bool(int(done))


def record(client: Any, name: str, before: int, after: int, by: str) -> None:
    """Remember a resize for the console and count it for the metrics."""
    entry = {"at": round(time.time(), 3), "queue": name, "from": before, "to": after, "by": by}
    pipe = client.pipeline(transaction=False)
    pipe.lpush(HISTORY_KEY, json.dumps(entry))
    pipe.ltrim(HISTORY_KEY, 0, HISTORY_LENGTH - 1)
    pipe.hincrby(RESIZES_KEY, f"{name}:{'grow' if after > before else 'shrink'}", 1)
    pipe.execute()


def history(client: Any, name: str | None = None, limit: int = 20) -> list[dict[str, Any]]:
    """The last resizes (of one queue, or of all), newest first."""
    entries = [json.loads(raw) for raw in client.lrange(HISTORY_KEY, 0, HISTORY_LENGTH - 1)]
    return [e for e in entries if name is None or e.get("queue") == name][:limit]


def one_turn(client: Any, key: str, every: float) -> bool:
    """True for one caller per `every` seconds across all workers (a key set if absent, expiring
    then): whose turn it is to check a settling resize, or an automatic queue's load."""
    return bool(client.set(key, "1", nx=True, px=max(int(every * 1000), 1)))


def settled(layout: Layout, shard_is_clear: Callable[[int], bool]) -> Layout | None:
    """The settled layout if every shard in the span is clear, else None."""
    if not all(shard_is_clear(index) for index in range(layout.span)):
        return None
    return Layout(layout.live, 0, layout.live, layout.widest, layout.raw)
