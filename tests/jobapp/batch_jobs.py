"""Batch handlers the batch tests enqueue (tests/worker/test_batches.py), on queue `batches`.

Each records what it was given in Valkey lists the test reads: `calls` the size of each call,
`done` the id of each job whose result it returned."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from jobqueue import BatchContext, BatchItem, Queue, job

QUEUE = "batches"
CALLS = "test:batch:calls"
DONE = "test:batch:done"


def _client() -> Any:
    return Queue(QUEUE).client


@job(queue=QUEUE, batch=10, batch_wait=0.3, max_attempts=1)
def double(items: list[BatchItem]) -> list[Any]:
    """Twice each item's number; an item "fail" fails alone (an exception in the list)."""
    _client().rpush(CALLS, len(items))
    return [
        ValueError(f"item {item.id} refused")
        if item.args[0] == "fail"
        else {"double": item.args[0] * 2, "lane": item.lane, "attempt": item.attempt}
        for item in items
    ]


@job(queue=QUEUE, batch=100, batch_wait=0.05)
def count(items: list[BatchItem]) -> list[int]:
    return [item.args[0] for item in items]


@job(queue=QUEUE, batch=5, batch_wait=0.2, max_attempts=1)
def raises(items: list[BatchItem]) -> list[Any]:
    raise RuntimeError(f"the whole batch of {len(items)} fails")


@job(queue=QUEUE, batch=5, batch_wait=0.2, max_attempts=1)
def too_few(items: list[BatchItem]) -> list[Any]:
    return [None] * (len(items) - 1)


@job(queue=QUEUE, batch=10, batch_wait=0.2, lease=2)
def held_until(items: list[BatchItem]) -> list[str]:
    """Its first attempt waits for a file that never comes (the test kills the worker meanwhile);
    a later one records each job once."""
    _client().rpush(CALLS, len(items))
    if any(item.attempt == 1 for item in items):
        marker = Path(items[0].args[0])
        marker.with_suffix(".started").touch()
        while not marker.exists():
            time.sleep(0.05)
    _client().rpush(DONE, *[item.id for item in items])
    return [item.id for item in items]


@job(queue=QUEUE, batch=10, batch_wait=0.2, takes_context=True)
def reports(ctx: BatchContext, items: list[BatchItem]) -> list[Any]:
    """Reports progress on its batch and answers a cancelled job with JobCancelled."""
    from jobqueue import JobCancelled

    ctx.progress({"of": len(items)})
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not ctx.cancelled:
        time.sleep(0.05)
    cancelled = ctx.cancelled_ids()
    return [JobCancelled("cancelled") if item.id in cancelled else item.args[0] for item in items]


@job(queue=QUEUE, batch=10, batch_wait=0.2)
async def adouble(items: list[BatchItem]) -> list[int]:
    import asyncio

    await asyncio.sleep(0)
    return [item.args[0] * 2 for item in items]


@job(queue=QUEUE, batch=3, batch_wait=0.1, timeout=0.5, max_attempts=1)
def overruns(items: list[BatchItem]) -> list[Any]:
    """Takes longer than its run time limit."""
    time.sleep(float(items[0].args[0]))
    return [None] * len(items)


@job(queue=QUEUE, batch=5, batch_wait=0.1, lease=1)
def outlasts_its_lease(items: list[BatchItem]) -> list[int]:
    """Runs longer than its jobs' 1 s lease: the heartbeat renews each of them meanwhile."""
    time.sleep(float(items[0].args[0]))
    return [item.attempt for item in items]


@job(queue=QUEUE, batch=3, batch_wait=0.1, timeout=0.5, max_attempts=1)
async def aoverruns(items: list[BatchItem]) -> list[Any]:
    """`overruns` as an `async def` handler: its coroutine is cancelled at the time limit."""
    import asyncio

    await asyncio.sleep(float(items[0].args[0]))
    return [None] * len(items)


@job(queue=QUEUE, batch=10, batch_wait=0.2, max_attempts=1, takes_context=True)
def confide_batch(ctx: BatchContext, items: list[BatchItem]) -> list[Any]:
    """The encryption tests' batch handler (tests/encryption): reports the batch's secrets as
    progress and returns each item's upper-cased with its id; an item with `fail=True` fails
    alone, quoting its secret."""
    ctx.progress({"at": sorted(item.args[0] for item in items)})
    return [
        ValueError(f"cannot use {item.args[0]}")
        if item.kwargs.get("fail")
        else {"echo": item.args[0].upper(), "id": item.id}
        for item in items
    ]


@job(queue=QUEUE, batch=100, batch_wait=30)
def half_fails(items: list[BatchItem]) -> list[Any]:
    """Fails each item whose argument is "fail" (an exception in the list), returns the others'.
    Its `batch_wait` is long: a test enqueues whole batches before a worker starts."""
    return [ValueError(f"item {item.id} fails") if item.args[0] == "fail" else item.args[0] for item in items]


@job(queue=QUEUE, batch=100, batch_wait=60)
def count_full(items: list[BatchItem]) -> list[int]:
    """`count` whose batches always fill (a test enqueues whole batches)."""
    return [item.args[0] for item in items]
