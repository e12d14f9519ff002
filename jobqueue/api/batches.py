"""Batch handlers, the handler's side: `@job(batch=n, batch_wait=s)` options, the `BatchItem`s a
batch handler gets, and the `ctx` of a `takes_context=True` batch handler (`BatchContext`).

A batch handler takes a list of `BatchItem` (one per job: its id, args, kwargs, lane and
attempt) and returns one result per item, in order; an exception instance in that list fails
that job alone. Jobs are enqueued one by one as any other (`handler.enqueue(x)`): the worker
groups them (worker/batches.py). Each job keeps its own id, state, retries, lane and result.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

from redis.exceptions import RedisError

from ..engine.store import Queue
from ..exceptions import InvalidOption, JobTimeout
from ..options import seconds, whole_number
from ..records import Lease
from .handler import JobCancelled, JobContext, timeout_error

MAX_BATCH = 1000
"""The most jobs one call of a batch handler gets."""
MAX_BATCH_WAIT = 3600.0
DEFAULT_BATCH_WAIT = 0.1
"""Seconds a batch waits for more jobs after its first, unless the handler says otherwise."""


class BatchItem(NamedTuple):
    """One job of a batch, as its handler gets it."""

    id: str
    args: list[Any]
    kwargs: dict[str, Any]
    lane: str
    """The job's lane ('' for the default one)."""
    attempt: int
    """Its attempt (1 on its first run): the fencing token of this run."""


def check_options(name: str, batch: object, batch_wait: object) -> tuple[int | None, float]:
    """`@job`'s `batch` and `batch_wait`, checked (InvalidOption, naming the handler, else):
    `batch` an int in 1…1000 (None: not a batch handler), `batch_wait` seconds in 0…3600."""
    if batch is None:
        if batch_wait is not None:
            raise InvalidOption(f"{name}: batch_wait= needs batch= (the most jobs per call)")
        return None, DEFAULT_BATCH_WAIT
    count = whole_number(batch, f"{name}: batch", 1, MAX_BATCH)
    wait = (
        DEFAULT_BATCH_WAIT
        if batch_wait is None
        else seconds(batch_wait, f"{name}: batch_wait", low=0, high=MAX_BATCH_WAIT)
    )
    return count, wait


class BatchContext:
    """What a `takes_context=True` batch handler gets as `ctx`: the batch's progress and cancel.

    `ctx.progress(value)` notes the value on every job of the batch (written as a single job's
    is: a few times a second, fenced by each job's attempt). `ctx.cancelled` turns true once
    the run passed its time limit (the smallest `timeout` of its jobs) or an operator cancelled
    any job of the batch; `ctx.cancelled_ids()` says which jobs were (an item the handler
    answers with a `JobCancelled` instance ends cancelled, alone). A checkpoint belongs to one
    job: a batch has none (`save_checkpoint` refuses)."""

    def __init__(self, leases: list[Lease], limit: Lease | None) -> None:
        """`limit`: the started lease of the job whose time limit is the batch's (None: no
        limit)."""
        self.job_ids = [lease.job_id for lease in leases]
        self._jobs = [JobContext(lease) for lease in leases]
        self._leases = leases
        self._limit = limit
        self._cancelled: set[str] = set()
        self._next_check = 0.0

    def progress(self, value: Any) -> None:
        """Report how far the batch has come (any JSON value), on each of its jobs."""
        for job in self._jobs:
            job.progress(value)

    @property
    def timed_out(self) -> bool:
        """True once the run passed its time limit (the smallest of its jobs')."""
        return self._limit is not None and time.monotonic() >= self._limit.deadline

    def cancelled_ids(self) -> set[str]:
        """The jobs of the batch an operator asked to cancel (read from Valkey at most once a
        second, one round trip per queue)."""
        now = time.monotonic()
        if now >= self._next_check:
            self._next_check = now + 1.0
            try:
                self._cancelled |= _cancel_requested(self._leases)
            except RedisError:  # (asked again at the next look)
                self._next_check = now
        return set(self._cancelled)

    @property
    def cancelled(self) -> bool:
        """True once the run passed its timeout or any job of the batch was cancelled."""
        return self.timed_out or bool(self.cancelled_ids())

    def raise_if_cancelled(self) -> None:
        """Stop the whole batch here if it timed out (JobTimeout) or every job of it was
        cancelled (JobCancelled); a batch with some jobs cancelled answers those with
        `JobCancelled` instances instead (`cancelled_ids`)."""
        if self._limit is not None and self.timed_out:
            raise JobTimeout(timeout_error(self._limit))
        if self.cancelled_ids() >= set(self.job_ids):
            raise JobCancelled(f"every job of the batch ({len(self.job_ids)}) was cancelled")

    def save_checkpoint(self, data: Any) -> bool:
        raise InvalidOption(
            "a batch has no checkpoint: a checkpoint belongs to one job (run "
            "a handler that checkpoints without batch=)"
        )

    def unwritten(self) -> list[JobContext]:
        """The jobs' contexts whose progress waits to be written (before their outcomes are)."""
        return [job for job in self._jobs if job.progress_unwritten]


def _cancel_requested(leases: list[Lease]) -> set[str]:
    """The jobs among `leases` whose current attempt an operator asked to cancel."""
    found: set[str] = set()
    by_queue: dict[str, list[Lease]] = {}
    for lease in leases:
        by_queue.setdefault(lease.queue, []).append(lease)
    for name, group in by_queue.items():
        queue = Queue(name)
        pipe = queue.client.pipeline(transaction=False)
        for lease in group:
            pipe.hmget(queue.shard(lease.shard).job(lease.job_id), "cancel", "attempts")
        for lease, (cancel, attempts) in zip(group, pipe.execute(), strict=True):
            if cancel == "1" and attempts == str(lease.token):
                found.add(lease.job_id)
    return found
