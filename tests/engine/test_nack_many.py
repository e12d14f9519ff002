"""nack_many.lua records many failures in one call exactly as nack.lua records each: the same
states (a retry after the job's own backoff, dead at its own max_attempts, fatal, an operator's
cancel, a stale token refused), the same counters and the same events; a call sent again
answers as the first did."""

from __future__ import annotations

import time
from typing import Any

from jobqueue import Queue
from jobqueue.engine.scripts.answers import Nacked

CASES: list[tuple[dict[str, Any], float | None, bool, bool]] = [
    ({"max_attempts": 3, "backoff": 10}, None, False, False),  # scheduled in 10 s
    ({"max_attempts": 3, "backoff": 30}, None, False, False),  # scheduled in 30 s
    ({"max_attempts": 1}, None, False, False),  # dead: its budget is spent
    ({"max_attempts": 5}, 0, False, False),  # pending again now
    ({"max_attempts": 5}, None, True, False),  # dead: fatal
    ({}, None, False, True),  # cancelled: an operator asked
]
"""Per job: its options, retry_in, fatal, and whether an operator flags it for cancel."""


def claimed(queue: Queue, lane: str) -> list[Any]:
    refs = [queue.enqueue({"case": i}, lane=lane, **options) for i, (options, *_) in enumerate(CASES)]
    leases = {lease.job_id: lease for lease in queue.dequeue(count=100, lease=30, worker="t")}
    for ref, (*_, cancel) in zip(refs, CASES, strict=True):
        if cancel:
            queue.cancel(ref.id)
    return [leases[ref.id] for ref in refs]


def outcome(queue: Queue, lease: Any) -> tuple[Any, ...]:
    info = queue.get(lease.job_id)
    assert info is not None
    due = queue.client.zscore(queue.shard(lease.shard).key("schedule"), lease.job_id)
    return (
        info.state,
        info.attempts,
        info.last_error,
        len(info.history),
        None if due is None else round((due - time.time() * 1000) / 1000),
    )


def test_many_failures_in_one_call_end_as_each_nack_would(queue: Queue) -> None:
    alone, together = claimed(queue, "a"), claimed(queue, "b")
    stale = together[0]._replace(token=together[0].token + 1)
    meta = queue.shard(0).key("meta")
    before = queue.client.hgetall(meta)
    answers = [
        queue.leases.nack(lease, f"boom {i}", retry_in, fatal=fatal)
        for i, (lease, (_, retry_in, fatal, _)) in enumerate(zip(alone, CASES, strict=True))
    ]
    middle = queue.client.hgetall(meta)
    items = [
        (lease, f"boom {i}", retry_in, fatal)
        for i, (lease, (_, retry_in, fatal, _)) in enumerate(zip(together, CASES, strict=True))
    ]
    assert queue.leases.nack_many([(stale, "late", None, False), *items]) == [Nacked(None, False), *answers]
    after = queue.client.hgetall(meta)
    assert [a.state for a in answers] == ["scheduled", "scheduled", "dead", "pending", "dead", "cancelled"]
    assert [outcome(queue, lease) for lease in together] == [outcome(queue, lease) for lease in alone]
    for field in ("n_failed", "n_dead", "n_cancelled"):
        assert int(after.get(field, 0)) - int(middle.get(field, 0)) == int(middle.get(field, 0)) - int(
            before.get(field, 0)
        ), field
    events = [fields for _, fields in queue.client.xrange(queue.shard(0).key("done"))]
    assert sorted(e["state"] for e in events if e["lane"] == "a") == sorted(
        e["state"] for e in events if e["lane"] == "b"
    )
    # sent again (its reply lost): each job answers as it did, nothing changes
    again = queue.leases.nack_many(items)
    assert again == answers and queue.client.hgetall(meta) == after
