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

This module owns those keys, the resize history and counts, and the shards' `draining`,
`listed` and `uniqs_indexed` marks; it has `lanes` copy the caps set live onto the shards a
resize or a raised `shards` setting adds. `resize`, `settle` and `reopen` change a layout
(`Queue.resize` and `Queue.retry` call them, and the worker's maintenance settles); `read`,
`read_again` and `history` read; `list_queue` adds to the registry and `known_queues` reads it.
`place` says which shard a job belongs to and `destinations` where an enqueue sends each job of a
batch.
"""

from __future__ import annotations

import json
import secrets
import time
import weakref
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .. import ids
from ..conf import get_client, get_config
from ..exceptions import InvalidOption, JobQueueError
from ..keys import REGISTRY_KEY, RELAY_STREAMS, ShardKeys, placement_hash
from ..spec import Prepared
from . import lanes, permits
from .scripts import operator_calls

LAYOUT_KEY = "{emq}:shards"
HISTORY_KEY = "{emq}:resizes"
"""LIST of the last resizes of every queue, newest first (JSON: at, queue, from, to, by)."""
RESIZES_KEY = "{emq}:resize-counts"
"""HASH `<queue>:grow` / `<queue>:shrink` → how many, for the metrics."""
HISTORY_LENGTH = 200
SETTLE_TURN = "{emq}:settling:"
TTL = 1.0
MAX_SHARDS = 1024
LIVE_STATES = ("pending", "scheduled", "active", "waiting")

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
        if configured > max(int(seen or 0), 1):
            _widen(client, name, configured)
    known[name, configured] = (now + TTL, layout)
    return layout


def _widen(client: Any, name: str, configured: int) -> None:
    """The `shards` setting names more shards than the queue ever had (a deploy raised it): give
    the new ones the lane caps and the global cap set live, as a resize's `_mark` does for the
    shards it adds,
    before this process sends a job there or claims one; then record the count in the registry,
    so that this runs once, not at each read."""
    lanes.copy_caps(client, name, configured)
    permits.copy_mark(client, name, configured)
    operator_calls.raise_widest(client, REGISTRY_KEY, name, configured)


def read_again(client: Any, name: str, configured: int, turns: int) -> Layout:
    """The layout read afresh after a shard turned an enqueue's jobs away for the `turns`-th
    time (it is draining). A resize marks its shards before it writes the layout, so the new
    layout may take a few tries to appear; past 50 the enqueue gives up (having written no job
    twice)."""
    if turns > 50:
        raise JobQueueError(f"queue {name!r}: its shards keep turning jobs away (a resize that "
                            f"did not finish?); nothing was enqueued twice")
    if turns > 2:
        time.sleep(0.01 * turns)
    return read(client, name, configured, fresh=True)


def last_read(client: Any, name: str, configured: int) -> int:
    """The live count this process last read (else `configured`), without asking Valkey."""
    hit = _cache.get(client, {}).get((name, configured))
    return hit[1].live if hit is not None else configured


def forget(name: str) -> None:
    """Drop this process's cached layouts of a queue (after changing it here)."""
    for known in _cache.values():
        for key in [k for k in known if k[0] == name]:
            del known[key]


def list_queue(client: Any, name: str, index: int, live: int) -> None:
    """Record a queue (and its widest shard count) in the registry `known_queues` reads, then
    mark shard `index` 'listed'. The enqueue script answers whether its shard has the mark, so
    a producer lists its queue again once Valkey lost its data, at no cost to an enqueue
    otherwise (the mark is read in the same call)."""
    seen = client.hget(REGISTRY_KEY, name)
    if seen is None or int(seen) < live:
        client.hset(REGISTRY_KEY, name, live)
    client.hset(ShardKeys(name, index).key("meta"), "listed", "1")


def list_missing(client: Any, counts: Mapping[str, int]) -> list[str]:
    """Record in the registry the queues of `counts` (name -> shard count) it lacks; the names
    written. A worker does it each maintenance turn for the queues it serves: on a cluster the
    registry and a shard's 'listed' mark (`list_queue`) live on different nodes, so the
    registry's node may lose its data while the marks tell every producer not to list again.
    One HMGET while nothing is missing."""
    names = list(counts)
    missing = {name: counts[name] for name, seen in zip(names, client.hmget(REGISTRY_KEY, names),
                                                         strict=True) if seen is None}
    if missing:
        client.hset(REGISTRY_KEY, mapping=missing)
    return list(missing)


def known_queues(client: Any = None) -> list[str]:
    """Every queue named in settings or that ever held a job (the registry in Valkey)."""
    client = client if client is not None else get_client()
    return sorted(set(get_config().queues) | set(client.hkeys(REGISTRY_KEY)))


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
    done = operator_calls.layout_cas(client, [LAYOUT_KEY, REGISTRY_KEY, f"{{emq}}:resize-op:{name}"],
                                     name, before.raw, after.encode(), after.widest,
                                     secrets.token_hex(8))
    forget(name)
    return done


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


def candidates(client: Any, name: str, configured: int, job_id: str) -> Iterator[int]:
    """Shards that may hold a job (`job_id` validated by the caller): its id's shard among the
    live ones, then every other the queue ever had, retired ones too."""
    now = read(client, name, configured)
    first = ids.hash32(ids.decode(job_id)[1]) % now.live
    yield first
    yield from (i for i in range(now.widest) if i != first)


def place(job_id: str, lane: str, unique_key: str, shards: int) -> int:
    """The shard a job belongs to among `shards`, computed from its identity (never looked up):
    its lane's, else its unique key's, else its id's."""
    if shards == 1:
        return 0
    if lane:
        return placement_hash(lane) % shards
    if unique_key:
        return placement_hash(unique_key) % shards
    return ids.hash32(ids.decode(job_id)[1]) % shards


def resize(client: Any, name: str, configured: int, count: int, by: str = "") -> Layout:
    """Set a queue's live shard count: growing spreads new jobs over `count` shards at once;
    shrinking stops new jobs landing on shards ≥ `count`, which workers drain and then retire.
    While the last resize settles, only undoing it is allowed unless it has been worked off
    (checked here, as workers do). `by` says who, in the resize history. Returns the new
    layout."""
    before = before_resize(client, name, configured, count)
    after = plan(before, count)
    if after == before:
        return before
    _index_unique_keys(client, name, before.widest)
    _mark(client, name, after)  # first, so that no producer strands a job on a shard being retired
    if not write(client, name, before, after):
        _mark(client, name, read(client, name, configured, fresh=True))
        raise JobQueueError(f"queue {name!r} was resized by someone else meanwhile; "
                            f"look at its layout and try again")
    record(client, name, before.live, after.live, by)
    return after


def before_resize(client: Any, name: str, configured: int, count: int) -> Layout:
    """The layout a resize to `count` starts from, read now: a last resize that has been worked
    off is settled first (as a worker would), so that only one really in flight refuses it."""
    before = read(client, name, configured, fresh=True)
    if before.prior and count not in (before.live, before.prior) and settle(client, name, configured):
        before = read(client, name, configured, fresh=True)  # worked off: no worker said so yet
    return before


def _mark(client: Any, name: str, layout: Layout) -> None:
    """Flag the shards beyond the live count as draining (their enqueue turns jobs away) and
    clear the flag on live ones; a paused queue's new shards start paused, and with the lane
    caps and the global cap set live."""
    lanes.copy_caps(client, name, layout.widest)
    permits.copy_mark(client, name, layout.widest)
    paused = client.hget(ShardKeys(name, 0).key("meta"), "paused") == "1"
    for i in range(layout.widest):
        meta = ShardKeys(name, i).key("meta")
        if i < layout.live:
            client.hdel(meta, "draining")
        else:
            client.hset(meta, "draining", "1")
        if paused:
            client.hset(meta, "paused", "1")


def _index_unique_keys(client: Any, name: str, shards: int) -> None:
    """Once per queue, before its first resize: add to each shard's `uniqs` set the live unique
    jobs written before the scripts kept it (one SCAN of the keyspace for all the queue's
    shards). From then on the scripts keep the sets, and a settling resize reads them, not the
    keyspace."""
    marker = ShardKeys(name, 0).key("meta")
    if client.hget(marker, "uniqs_indexed") == "1":
        return
    bases = {ShardKeys(name, i).base: ShardKeys(name, i) for i in range(shards)}
    # Queue names hold no glob characters; `emq:{name*` also matches other queues whose names
    # start with this one: their keys' bases are not among ours and are skipped.
    for key in client.scan_iter(match=f"emq:{{{name}*:uniq:*", count=1000):
        base, _, unique = key.partition(":uniq:")
        shard = bases.get(base)
        job_id = client.get(key) if shard else None
        if shard and job_id and client.hget(shard.job(job_id), "state") in LIVE_STATES:
            client.sadd(shard.key("uniqs"), unique)
    client.hset(marker, "uniqs_indexed", "1")


def reopen(client: Any, name: str, configured: int, index: int) -> None:
    """Claim from shard `index` again (a retry put work on a retired shard)."""
    while (now := read(client, name, configured, fresh=True)).span <= index:
        grown = Layout(now.live, now.prior, index + 1, max(now.widest, index + 1))
        if write(client, name, now, grown):
            return


def settle(client: Any, name: str, configured: int) -> Layout | None:
    """Finish a resize once it has been worked off: no draining shard holds waiting or running
    jobs or entries to relay (a flow's :outcomes, or an earlier version's :forward), and no
    lane with ready jobs or live unique key sits on a shard other than its live one. Returns the
    settled layout, or None (not yet, or nothing to settle)."""
    now = read(client, name, configured, fresh=True)
    if not now.settling:
        return None
    done = settled(now, lambda index: _settled_shard(client, ShardKeys(name, index), now))
    if done is None or not write(client, name, now, done):
        return None
    # An operator's retry may have made a job pending on a shard this retires, after the look
    # above (it reopens the shard after its transition, but may have read the layout before this
    # write): look again, and claim from such a shard again.
    for index in range(done.live, now.span):
        if not _settled_shard(client, ShardKeys(name, index), done):
            reopen(client, name, configured, index)
    return done


def _settled_shard(client: Any, shard: ShardKeys, now: Layout) -> bool:
    if shard.index >= now.live:  # (and no flow's "member done" left to relay from it: workers
        # relay the shards they claim from, so a retired shard's entries would wait forever)
        counts = operator_calls.counts(client, shard)
        return (not any(counts[state] for state in LIVE_STATES)
                and not any(client.xlen(shard.key(stream)) for stream in RELAY_STREAMS))
    if not now.prior:
        return True
    if any(lane and placement_hash(lane) % now.live != shard.index
           for lane in _ready_lanes(client, shard)):
        return False
    for unique in client.sscan_iter(shard.key("uniqs"), count=1000):
        job_id = client.get(shard.key(f"uniq:{unique}"))
        state, lane = client.hmget(shard.job(job_id), "state", "lane") if job_id else (None, None)
        if state in LIVE_STATES and place(job_id, lane or "", unique, now.live) != shard.index:
            return False  # a live job whose lane or key now belongs on another shard
    return True


def _ready_lanes(client: Any, shard: ShardKeys) -> Iterator[str]:
    """The lanes with ready jobs on a shard: those on its ring, and those held off it at their
    cap (`capped`) or by their rate (`rated`), whose jobs wait there just the same."""
    yield from client.lrange(shard.key("ring"), 0, -1)
    yield from client.sscan_iter(shard.key("capped"), count=1000)
    yield from (lane for lane, _ in client.zscan_iter(shard.key("rated"), count=1000))


def destinations(layout: Layout, jobs: Sequence[Prepared], todo: Iterable[int],
                 live_only: set[int]) -> dict[tuple[int, str], list[int]]:
    """Where an enqueue sends each job of `todo` (positions in `jobs`): (shard, mode) →
    positions. While a resize settles, a job with a lane or unique key whose shard differs
    under the prior count goes first to its prior shard in 'prior' mode (see enqueue.lua),
    unless it is in `live_only` (its prior shard answered 'absent')."""
    out: dict[tuple[int, str], list[int]] = defaultdict(list)
    for i in todo:
        job = jobs[i]
        home = place(job.job_id, job.lane, job.unique_key, layout.live)
        if layout.prior and (job.lane or job.unique_key) and i not in live_only:
            before = place(job.job_id, job.lane, job.unique_key, layout.prior)
            if before != home:
                out[before, "prior"].append(i)
                continue
        out[home, ""].append(i)
    return out
