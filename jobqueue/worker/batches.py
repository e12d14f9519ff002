"""Batch handlers on the worker: claimed jobs of an `@job(batch=n)` handler gathered and handed to
one call of the handler.

A batch is a worker-side grouping, never a stored object: each job of it stays a claimed job of
its own (an (id, token) entry in `HeldJobs`, renewed by the heartbeat until its outcome is
recorded, each outcome fenced by its own token), so a worker that dies mid-batch gives every job
back when its lease ends, as it would a job run alone.

- Claiming: a worker that serves a queue with batch handlers holds room for a few batches of
  the largest `batch` (one per runner, up to three, and one gathering), if its usual capacity
  is less (`grown`): its claims then bring whole batches in one script call (lanes, weights,
  caps, the global cap and rates apply as to any claim). A worker with no batch handler is
  configured exactly as before, and its claims, runners and acks take the same path (a job
  claimed is looked at for batching only when the worker serves a batch handler).
- Gathering (`Gathering`): `Runners.submit` gives it the claimed jobs of batch handlers (the
  others run as usual); each handler has a buffer, handed on as one `Batch` when it holds
  `batch` jobs or its oldest has waited `batch_wait` seconds (a timer thread, started with the
  first batch job, watches the waits). A stopping worker takes the buffered jobs back with the
  prefetched ones.
- Running (`BatchRunner.run`, batchcall.py): one runner thread (or its pool process under
  `--processes`) calls the handler once with the list of `BatchItem`s (an `async def`
  handler's coroutine runs to its end on an event loop of the call's own, as in a pool
  process). First one script call per shard of each queue (batch.lua) notes on each job's
  row the batch it runs in ('<n> <first id>': the console's job page shows it) and reads the
  jobs' lanes. The outcomes: a value per job, an exception instance in the list failing that job alone; an
  error raised, or an answer that is not a list of one result per job, fails every job of the
  batch. They are handed over together (`Outcomes.finished_many`), so the successes ride the
  worker's next claim in one call and the failures take one more (nack_many.lua), each job
  fenced by its own token. A job's row keeps the batch note, and its terminal event carries
  it into the database history (`Job.batch`).
- Time limits: the batch's is the smallest `timeout` of its jobs, counted from the call's
  start; an async call is cancelled at it, a pool process killed, and a plain call's thread (which cannot be
  stopped) has its late answer replaced by every job's JobTimeout, while its leases, renewed
  no further than a second past the deadline (extend.lua), give the jobs back meanwhile.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import NamedTuple

from .. import signals
from ..api.registry import JobFunction, registered_batch
from ..engine.scripts import calls
from ..engine.store import Queue
from ..records import Lease
from .batchcall import run_batch, time_limit
from .deadlines import Deadlines
from .executor import Outcome, unexpected
from .pool import Abandoned, PoolProcess
from .serving import WorkerConfig

log = logging.getLogger("jobqueue.worker")
DoneMany = Callable[[list[tuple[Lease, Outcome]]], None]


RUNNING = 3
"""Batches of the largest `batch` that a worker that serves batch handlers holds room to run
at once (fewer when its concurrency is less), plus one gathering."""


def grown(config: WorkerConfig, most: int) -> WorkerConfig:
    """`config` for a worker whose handlers take batches of up to `most` jobs: room (its
    prefetch grown, when its capacity is less) for a batch on each of up to RUNNING runners
    and one more gathering, so a claim brings whole batches and its runners do not wait for
    the next claim's round trip."""
    room = (min(config.concurrency, RUNNING) + 1) * most
    if config.capacity >= room:
        return config
    return replace(config, prefetch=room - config.concurrency)


class Batch(NamedTuple):
    """Jobs of one batch handler handed to one call of it (in a runner's inbox, in place of a
    job's resolved handler)."""

    handler: JobFunction
    leases: list[Lease]


def leases_of(lease: Lease, job: object) -> list[Lease]:
    """The jobs a runner's inbox entry holds: a batch's, or its one."""
    return job.leases if isinstance(job, Batch) else [lease]


class BatchRunner:
    """The runners' side of batch handlers: gathers their claimed jobs (`gather`), and runs a
    batch on a runner thread (`run`), its outcomes handed over together (`done_many`)."""

    def __init__(
        self,
        ready: Callable[[Batch], None],
        done_many: DoneMany,
        start: Callable[[Lease], Lease],
        deadlines: Deadlines,
    ) -> None:
        """`ready`: gets each batch once due (the runners queue it as a job); `start`: a
        job's lease as its run starts (`HeldJobs.start`); `deadlines`: the runners' timer of
        runs with a time limit."""
        self.gathering = Gathering(ready)
        self.done_many = done_many
        self._start = start
        self._deadlines = deadlines

    def gather(self, leases: list[Lease]) -> list[Lease]:
        """Buffer the jobs of batch handlers; the others, to run as usual."""
        others, batched = [], []
        for lease in leases:
            handler = batch_handler(lease)
            if handler is None:
                others.append(lease)
            else:
                batched.append((handler, lease))
        if batched:
            self.gathering.add(batched)
        return others

    def run(
        self, batch: Batch, process: PoolProcess | None, close_old_connections: Callable[[], None]
    ) -> None:
        """Run a batch with one call of its handler, on this runner thread (or in its pool
        process), and hand its outcomes over together; an error of the worker's code around
        it fails every job of it. On a thread, a batch past its time limit overruns as a
        single run does (deadlines.py): each job's JobTimeout recorded at the deadline."""
        leases, run = batch.leases, None
        try:
            if process is None:  # (a pool process starts the runs once it is up: pool.py)
                leases = [self._start(lease) for lease in leases]
                limit = time_limit(leases)
                run = self._deadlines.start(limit, tuple(leases)) if limit else None
            for lease in leases:
                signals.send(signals.job_started, Queue, lease=lease)
            lanes = noted(leases)
            outcomes = (
                run_batch(leases, lanes) if process is None else process.run_batch(leases, lanes, self._start)
            )
        except Abandoned:  # (ended by the stopping worker, which hands the jobs back)
            return
        except Exception as exc:  # (logged, and the failure of each job of it)
            log.exception(
                "a batch of %d jobs of %s: the runner failed around it", len(leases), batch.handler.name
            )
            outcomes = [unexpected(exc)] * len(leases)
        if run is not None:  # (the timer's: its JobTimeout at the deadline, or when late)
            returned = self._deadlines.returned(run, outcomes[0])
            if returned is None:  # (it overran: its failures were recorded at the deadline)
                return
            if returned is not outcomes[0]:
                outcomes = [returned] * len(leases)
        try:
            close_old_connections()
        finally:
            try:
                self.done_many(list(zip(leases, outcomes, strict=True)))
            except Exception:  # (a bug in the bookkeeping: said, and the runner goes on)
                log.exception(
                    "the outcomes of a batch of %d jobs could not be handed over "
                    "(the worker holds them until it stops)",
                    len(leases),
                )


def batch_handler(lease: Lease) -> JobFunction | None:
    """The batch handler a claimed job's payload names (None: any other job)."""
    payload = lease.payload
    name = payload.get("handler") if isinstance(payload, dict) else None
    return registered_batch(name) if isinstance(name, str) else None


class Gathering:
    """The claimed jobs of batch handlers waiting to make a batch, per handler; `ready(batch)`
    gets each batch once it is full or its oldest job waited the handler's `batch_wait`."""

    def __init__(self, ready: Callable[[Batch], None], clock: Callable[[], float] = time.monotonic) -> None:
        """`clock`: seconds, monotonic (a test may move it itself)."""
        self._ready, self._clock = ready, clock
        self._buffers: dict[str, tuple[JobFunction, list[Lease], float]] = {}
        """Handler name -> (handler, jobs, when the first came: monotonic)."""
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None

    def add(self, jobs: list[tuple[JobFunction, Lease]]) -> None:
        """Buffer the claimed jobs of batch handlers (one claim's); hand on what is due."""
        now = self._clock()
        with self._changed:
            for handler, lease in jobs:
                kept = self._buffers.get(handler.name)
                if kept is None:
                    self._buffers[handler.name] = (handler, [lease], now)
                else:
                    kept[1].append(lease)
            due = self._due(now)
            if self._buffers:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._watch, daemon=True, name="jobqueue-batches")
                    self._thread.start()
                self._changed.notify()
        for batch in due:
            self._ready(batch)

    def take_unstarted(self) -> list[Lease]:
        """Every buffered job, taken back (the stopping worker releases them)."""
        with self._changed:
            taken = [lease for _, leases, _ in self._buffers.values() for lease in leases]
            self._buffers.clear()
        return taken

    def due(self) -> list[Batch]:
        """Take out the batches due now (the timer hands them on; a test may take them)."""
        with self._changed:
            return self._due(self._clock())

    def _due(self, now: float) -> list[Batch]:
        """Take out the full buffers' batches and those that waited long enough (under the
        condition's lock). The jobs a full batch leaves behind came with the claim that filled
        it (a buffer holds less than a batch between claims): their wait starts `now`."""
        due = []
        for name, (handler, leases, since) in list(self._buffers.items()):
            most = handler.options.batch or 1
            if len(leases) >= most:
                while len(leases) >= most:
                    due.append(Batch(handler, leases[:most]))
                    del leases[:most]
                since = now
                self._buffers[name] = (handler, leases, since)
            if leases and now - since >= handler.options.batch_wait:
                due.append(Batch(handler, list(leases)))
                leases.clear()
            if not leases:
                del self._buffers[name]
        return due

    def _watch(self) -> None:
        """Hand on each buffer whose oldest job waited its handler's `batch_wait`."""
        while True:
            with self._changed:
                now = self._clock()
                due = self._due(now)
                if not due:
                    waits = [
                        since + handler.options.batch_wait for handler, _, since in self._buffers.values()
                    ]
                    self._changed.wait(min(waits, default=now + 60.0) - now)
                    continue
            for batch in due:
                self._ready(batch)


def noted(leases: list[Lease]) -> list[str]:
    """Note on each job's row the batch it runs in (one call per queue and shard: batch.lua)
    and read the jobs' lanes ('' for the default lane, or for a job whose attempt is over)."""
    mark = f"{len(leases)} {leases[0].job_id}"
    lanes = [""] * len(leases)
    by_queue: dict[str, list[int]] = {}
    for i, lease in enumerate(leases):
        by_queue.setdefault(lease.queue, []).append(i)
    for name, positions in by_queue.items():
        found = calls.batch(Queue(name).client, name, mark, [leases[i] for i in positions])
        for i, lane in zip(positions, found, strict=True):
            lanes[i] = lane or ""
    return lanes
