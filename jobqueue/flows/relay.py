"""Delivers "member done" across shards: a flow's member that finished on one shard of a queue
while a job waiting for it lives on another, of its queue or of another queue (graph.py), left,
in the same script call that recorded its outcome, an entry in its shard's `:outcomes` STREAM
(`forward` in `_flows.lua`; its `shard` the other shard's index, or '<queue>#<index>' for a
shard of another queue). An entry is a pack: the outcomes one script call sent to one shard (a
worker's batch of acks sends a chord's callback one entry, not one per member). `relay_shard`
applies each entry on the dependent's shard (`deliver.lua`) and only then deletes it; a
delivery that ends jobs there (a cascade of cancels) may forward in turn, from that shard, and
is relayed on. A queue's workers relay its
streams, whichever queue the entries go to: the dependent's queue's workers claim it once
released, as any job.

Who relays: the worker that recorded the outcome, right after (its ack's or terminal nack's
answer flags a job that forwarded: `after`, on the worker's relay thread: worker/relaying.py);
the writer of a flow whose link found a member finished already (graph.py); `flows.cancel`; and
every worker's maintenance turn, for the shards it claims from (`relay_queue`; a resize settles
only once its retiring shards' streams are empty), so an entry left by a finisher killed before
its relay, or found after a restart from the AOF (entries are plain keys), is delivered all the
same. Two relays may deliver one entry: the delivery is idempotent (a set, not a counter) and
fenced (an outcome older than the slot's last one changes nothing: `fenced` in `_flows.lua`). A
dependent is written before any of its members can forward to it (graph.py writes dependents
first), so an entry whose dependent is not on its shard names one that expired or was deleted,
or a node that lost data: it is kept until it is stale (see `_stale`), then dropped with a
warning.

A delivery that brings back a job a member's failure had cancelled (its member, retried by an
operator, succeeded) makes the workers claim from its shard again (`layouts.reopen`), should a
resize have retired that shard meanwhile, as an operator's retry of a job there does.

Touches `:outcomes` and an earlier version's `:forward` (read, delete) and, through
`deliver`, the dependents' shards (of any queue).
"""

from __future__ import annotations

import json
import logging
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from typing import Any, Protocol

from redis.exceptions import RedisError

from ..conf import get_config
from ..engine import layouts
from ..engine.scripts import calls
from ..engine.scripts.answers import Delivered
from ..engine.store import Queue
from ..keys import QUEUE_NAME, RELAY_STREAMS, ShardKeys
from ..records import Lease

log = logging.getLogger("jobqueue.relay")
BATCH = 200
"""Entries read from a stream at a time."""
STREAM, LEGACY = RELAY_STREAMS
"""Where a finish writes the outcomes it sends to other shards (an entry a pack of them), and
where workers of an earlier version write them (an entry an outcome in fields of its own:
`FIELDS`, `token`), relayed by the maintenance turns (`relay_queue`) during a rolling
upgrade."""
FIELDS = ("dep", "slot", "policy", "member", "state", "value")
DELIVER_BYTES = 128 * 1024
"""About how much of packs one deliver call takes (~1,800 outcomes of a small result): a
backlog's relay makes several calls rather than one that holds Valkey long."""
Entry = tuple[str, dict[str, str]]
"""A stream entry to deliver: its id, and its fields (shard, pack, since: `_relay_batch`)."""
AOF_WAIT_MS = 2000
"""How long a relay waits for another node's AOF to hold a delivery (everysec: about 1 s)."""


def relay_shard(queue: Queue, index: int, streams: tuple[str, ...] = (STREAM,)) -> int:
    """Deliver the entries of shard `index`'s `streams` (and of the shards, of any queue, their
    deliveries forwarded to); how many it took off (delivered, or dropped: see
    `_relay_batch`)."""
    queues = {queue.name: queue}
    delivered, todo = 0, [(queue.name, index, stream, "-") for stream in streams]
    while todo:
        name, shard, stream, start = todo.pop()
        count, onward, last = _relay_batch(queues[name], shard, stream, start, queues)
        delivered += count
        todo.extend((q, i, STREAM, "-") for q, i in onward
                    if all((q, i, STREAM) != (tq, ts, tst) for tq, ts, tst, _ in todo))
        if last is not None:  # (a full batch: read on after it)
            todo.append((name, shard, stream, "(" + last))
    return delivered


def target(queue: Queue, raw: str) -> tuple[str, int] | None:
    """The shard an entry's `shard` field names: (queue, index); None when malformed."""
    if raw.isdigit():
        return queue.name, int(raw)
    name, mark, index = raw.rpartition("#")
    if mark and index.isdigit() and QUEUE_NAME.fullmatch(name):
        return name, int(index)
    return None


def pack_of(fields: dict[str, str]) -> str | None:
    """An entry's outcomes as deliver takes them (JSON: a list of [dep, slot, policy, member,
    state, value, token]): its `pack`, or the one outcome of an earlier version's entry; None
    when it has neither (deliver checks what a pack holds)."""
    if "pack" in fields:
        return fields["pack"]
    if all(name in fields for name in FIELDS):  # (one written before tokens has none)
        return json.dumps([[*(fields[name] for name in FIELDS), fields.get("token", "")]],
                          ensure_ascii=False)
    return None


def _relay_batch(queue: Queue, index: int, stream: str, start: str, queues: dict[str, Queue]
                 ) -> tuple[int, set[tuple[str, int]], str | None]:
    """One batch of a stream from `start`: (delivered, shards that forwarded in turn, the last
    entry's id when the batch was full). `queues`: the queues met so far, by name (one more
    is added for a delivery to another queue)."""
    client, key = queue.client, queue.shard(index).key(stream)
    entries = client.xrange(key, min=start, count=BATCH)
    if not entries:
        return 0, set(), None
    by_shard: dict[tuple[str, int], list[Entry]] = defaultdict(list)
    gone, onward = [], set()
    for entry_id, fields in entries:
        aim, pack = target(queue, str(fields.get("shard", ""))), pack_of(fields)
        if aim is not None and pack is not None:
            since = fields.get("since", "")  # (a kept rest's: see `_keep_absent`)
            by_shard[aim].append((entry_id, {
                "shard": fields["shard"], "pack": pack,
                "since": since if since.isdigit() else entry_id.split("-")[0]}))
        else:  # (hand-written or corrupt: it could never be delivered)
            log.warning("queue=%s shard %d: dropped a malformed entry %s", queue.name, index,
                        entry_id)
            gone.append(entry_id)
    retention = round(get_config().retention * 1000)
    for (name, shard), batch in _chunks(by_shard):
        there = queues.get(name) or queues.setdefault(name, Queue(name, client=client))
        reply, kept = _deliver(queue.shard(index), there, shard, retention,
                               [fields["pack"] for _, fields in batch])
        if reply.forwarded:
            onward.add((name, shard))
        if reply.waits_again:  # (claimed from there, retired or not)
            layouts.reopen(client, name, there.configured, shard)
        for (entry_id, fields), absent in zip(batch, reply.absent, strict=True):
            if absent is None:
                log.warning("queue=%s shard %d: dropped entry %s, whose outcomes are malformed",
                            queue.name, index, entry_id)
                gone.append(entry_id)
            elif absent and _stale(int(fields["since"]), retention):
                log.warning("queue=%s: a job of entry %s never reached shard %d of queue %s; "
                            "dropped what it holds for it: %s", queue.name, entry_id, shard,
                            name, fields["pack"][:500])
                gone.append(entry_id)
            elif kept and (not absent or _keep_absent(client, key, fields, absent)):
                gone.append(entry_id)
    if gone:
        client.xdel(key, *gone)
    return len(gone), onward, entries[-1][0] if len(entries) == BATCH else None


def _chunks(by_shard: dict[tuple[str, int], list[Entry]]
            ) -> Iterator[tuple[tuple[str, int], list[Entry]]]:
    """Each shard's entries in runs of at most DELIVER_BYTES of packs (at least one entry
    each): (the shard, a run)."""
    for aim, batch in by_shard.items():
        chunk: list[Entry] = []
        size = 0
        for entry in batch:
            if chunk and size + len(entry[1]["pack"]) > DELIVER_BYTES:
                yield aim, chunk
                chunk, size = [], 0
            chunk.append(entry)
            size += len(entry[1]["pack"])
        yield aim, chunk


def _deliver(source: ShardKeys, queue: Queue, target: int, retention: int,
             packs: list[str]) -> tuple[Delivered, bool]:
    """The deliver call on shard `target` of `queue`: (its reply, whether its writes are safe
    to delete the entries for). On a cluster whose node of `target` is not `source`'s, that
    node's AOF must hold the delivery first (WAITAOF): were it to restart from an everysec AOF
    without it while `source`'s node kept the delete, the dependent would wait forever. (One
    server writes its AOF in order: a lost delivery loses the later delete too.) Not confirmed
    in time: the entries stay, delivered again (idempotent) at the next relay."""
    reply, kept = calls.deliver(queue.client, queue.shard(target), retention, packs,
                                source=source, aof_wait_ms=AOF_WAIT_MS)
    if not kept:
        log.warning("queue=%s shard %d: its node's AOF did not confirm a delivery within %d "
                    "ms; the entries stay for the next relay", queue.name, target, AOF_WAIT_MS)
    return reply, kept


def _stale(since_ms: int, retention_ms: int) -> bool:
    """Whether an entry written at `since_ms` is older than the retention, and at least a
    minute old: a queue without retention still gives a delivery a minute."""
    return time.time() * 1000 - since_ms > max(retention_ms, 60_000)


def _keep_absent(client: Any, key: str, fields: dict[str, str], absent: list[int]) -> bool:
    """An entry (`fields`: its shard, pack and the ms it was first written at, `since`) some
    of whose outcomes found no job (the others applied): those alone stay, in an entry of
    their own (the same `since`), so that the applied ones are not applied again at each
    relay (a failure's outcome would cancel again a dependent an operator has retried
    meanwhile). True when the entry is to be deleted (its rest is written); False when every
    outcome of it is absent, or it cannot be read (kept whole)."""
    try:
        outcomes = json.loads(fields["pack"])
    except ValueError:
        return False
    if len(absent) >= len(outcomes):
        return False
    client.xadd(key, {**fields, "pack": json.dumps([outcomes[at] for at in absent],
                                                   ensure_ascii=False)})
    return True


def relay_queue(queue: Queue, shards: int | None = None) -> int:
    """Deliver the entries of every shard of `queue` (`shards`: how many; else all it has), an
    earlier version's too."""
    return sum(relay_shard(queue, index, (STREAM, LEGACY))
               for index in range(shards or queue.all_shards()))


class Queues(Protocol):
    """What gives the finisher its queue by name (the worker's `Served`)."""

    def queue(self, name: str) -> Queue: ...


def after(queues: Queues, leases: Iterable[Lease]) -> None:
    """The finisher's relay: the shards of `leases` (whose outcomes forwarded entries),
    each once."""
    after_shards(queues, {(lease.queue, lease.shard) for lease in leases})


def after_shards(queues: Queues, shards: Iterable[tuple[str, int]]) -> None:
    """Relay each of `shards` ((queue, index)). A failure is left to the next maintenance turn
    (the entries stay)."""
    for name, index in shards:
        try:
            relay_shard(queues.queue(name), index)
        except RedisError as exc:
            log.warning("queue=%s shard %d: relay failed (%s); the next maintenance turn "
                        "relays it", name, index, exc)
