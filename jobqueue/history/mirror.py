"""The durable floor: terminal events from `emq:{q}:done` upserted into MySQL.

Read with a consumer group, write one bulk upsert keyed by job id (a replay rewrites the same
row), commit, then XACK + XDEL. While MySQL is down the entries wait in the stream; entries left
pending by a dead consumer are claimed by another after `claim_idle` seconds.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from django.db import transaction

from ..conf import get_config
from ..engine.store import Queue
from ..records import mirror_columns

GROUP = "mirror"
PRUNE_EVERY = 600.0
"""Seconds between a mirror's prunes of the charts' old rollup rows (`rollup.prune`)."""
NOT_DURABLE = {"durable": False, "relayed": True, "run_after": None, "backoff_ms": None,
               "lease_ms": None, "timeout_ms": None, "expires_at": None, "reopened_after": None, "flow": None}
"""The outbox columns of a row the mirror creates (see outbox.py); it never updates them."""


def upsert(events: Sequence[Mapping[str, str]], queue: str, shard: int = 0,
           replayed: bool = False) -> int:
    """Write a batch of one shard's events as one multi-row upsert keyed by job id. A row only
    moves forward (`models.insert_jobs`): the newest event of a job wins, by its attempts, then
    its finish time on Valkey's clock, in the batch and against the row, so replays, re-runs
    after an operator retry and a batch written late converge on the newest state. The batch's
    finished jobs are added to the charts' rollup (rollup.py) in the same transaction; a
    `replayed` batch (entries delivered before: a mirror may have died between its commit and
    its XACK) leaves out the rows the history already holds as they are, counted then."""
    from ..models import counted_rows, insert_jobs, stale_events, written_fields
    from . import rollup  # (models: not before Django is set up)

    now = datetime.now(UTC)
    kept = {"id", *NOT_DURABLE}  # a durable row keeps its outbox columns
    update = [f.attname for f in written_fields() if f.attname not in kept]
    options = get_config().queue(queue)
    rows: dict[str, dict[str, Any]] = {}
    for event in events:
        row = {**NOT_DURABLE, **mirror_columns(event, queue, shard, options.max_attempts),
               "mirrored_at": now}
        seen = rows.get(row["id"])
        if seen is None or _order(row) >= _order(seen):
            rows[row["id"]] = row
    with transaction.atomic():  # (an operator's retry must not commit between the two)
        if options.durable:
            for job_id in stale_events(rows):
                del rows[job_id]  # a retried run's event: its reopened row stays unfinished
        known = counted_rows(rows.values()) if replayed else frozenset()
        written = insert_jobs(rows.values(), update)
        rollup.add(row for row in rows.values() if row["id"] not in known)  # (the charts' counts)
        return written


def _order(row: Mapping[str, Any]) -> tuple[int, datetime]:
    """Which of two events of a job is newer (see `upsert`)."""
    return row["attempts"], row["changed_at"] or datetime.min.replace(tzinfo=UTC)


def record_shards(queue: Queue, written: dict[tuple[str, int], dict[str, Any]] | None = None) -> None:
    """Refresh the `Shard` rows of a queue: counts seen now, and whether each shard takes new
    jobs (active), is only drained (beyond the live count after a shrink) or is retired.
    `written` (kept by the caller between calls) skips rows whose values it last wrote."""
    from ..models import Shard

    layout = queue.layout(fresh=True)
    for index in range(layout.widest):
        counts = queue.shard_counts(index)
        values = {"status": layout.status(index),
                  **{name: counts[name] for name in ("pending", "scheduled", "active", "dead")}}
        if written is not None and written.get((queue.name, index)) == values:
            continue
        Shard.objects.update_or_create(queue=queue.name, index=index, defaults=values)
        if written is not None:
            written[queue.name, index] = values


class Mirror:
    """Moves terminal events of some queues' shards into the `Job` table."""

    def __init__(self, queues: Sequence[Queue], consumer: str, batch: int = 1000,
                 claim_idle: float = 15.0) -> None:
        self.queues = list(queues)
        self.consumer = consumer
        self.batch = batch
        self.claim_idle_ms = round(claim_idle * 1000)
        self._grouped: set[str] = set()
        self._own_pending = True
        """Entries delivered to us and not yet written may wait (at start, after a failed write,
        or more than a batch of them): the next step reads them first."""
        self._next_takeover = 0.0
        """When the next step looks for other consumers' idle entries (a dead worker's)."""
        self._next_prune = 0.0
        """When the next step drops the rollup's old rows."""

    def _streams(self) -> list[tuple[Any, str, str, int]]:
        """(client, stream key, queue name, shard index) of every shard that may hold events."""
        return [(q.client, q.shard(i).key("done"), q.name, i)
                for q in self.queues for i in range(q.all_shards())]

    def _ensure_group(self, client: Any, stream: str) -> None:
        if stream in self._grouped:
            return
        try:
            client.xgroup_create(stream, GROUP, id="0", mkstream=True)
        except Exception as exc:  # BUSYGROUP: another worker made it first
            if "BUSYGROUP" not in str(exc):
                raise
        self._grouped.add(stream)

    def step(self, *, take_over_all: bool = False) -> int:
        """Mirror what is waiting on every stream once; returns rows written.

        Order per stream: our own unacknowledged entries (a failed write), entries idle with
        another consumer (a dead worker), then new ones. Raises when the database fails; the
        entries then stay pending and the next step retries them.
        """
        written = 0
        now = time.monotonic()
        own, self._own_pending, more_own = take_over_all or self._own_pending, True, False
        takeover = take_over_all or now >= self._next_takeover
        if takeover:  # (a third of the idle time a dead worker's entries must reach first)
            self._next_takeover = now + self.claim_idle_ms / 3000
        for client, stream, queue, shard in self._streams():
            self._ensure_group(client, stream)
            where = (queue, shard)
            if own:
                reply = client.xreadgroup(GROUP, self.consumer, {stream: "0"}, count=self.batch)
                entries = reply[0][1] if reply else []
                written += self._write(client, stream, entries, *where, replayed=True)
                more_own = more_own or len(entries) == self.batch
            if takeover:
                idle = 0 if take_over_all else self.claim_idle_ms
                claimed = client.xautoclaim(stream, GROUP, self.consumer, idle, "0-0",
                                            count=self.batch)
                written += self._write(client, stream, claimed[1], *where, replayed=True)
                if len(claimed[1]) == self.batch:
                    self._next_takeover = 0.0
            while True:
                reply = client.xreadgroup(GROUP, self.consumer, {stream: ">"}, count=self.batch)
                entries = reply[0][1] if reply else []
                written += self._write(client, stream, entries, *where)
                if len(entries) < self.batch:
                    break
        self._own_pending = more_own  # (a step that raised leaves it set: the next reads them)
        if now >= self._next_prune:
            self._next_prune = now + PRUNE_EVERY
            from . import rollup

            rollup.prune(datetime.now(UTC))
        return written

    def _write(self, client: Any, stream: str, entries: list[tuple[str, dict[str, str]]],
               queue: str, shard: int, replayed: bool = False) -> int:
        if not entries:
            return 0
        # Scripts write every event with an id and a state; an entry without them (deleted,
        # or added by hand) is acknowledged and dropped rather than blocking the stream.
        events = [fields for _, fields in entries if fields and fields.get("id") and fields.get("state")]
        written = upsert(events, queue, shard, replayed) if events else 0
        ids = [entry_id for entry_id, _ in entries]
        # One MULTI: an entry acknowledged but not deleted (a crash between two calls) would stay
        # in the stream forever, and a --burst worker waiting for an empty stream with it.
        pipe = client.pipeline(transaction=True)
        pipe.xack(stream, GROUP, *ids)
        pipe.xdel(stream, *ids)
        pipe.execute()
        return written

    def forget_groups(self) -> None:
        """Make the next step create the consumer groups again (Valkey may have lost them)."""
        self._grouped.clear()

    def backlog(self) -> int:
        """Entries still in the streams (pending or unread)."""
        return sum(int(client.xlen(stream)) for client, stream, _, _ in self._streams())
