"""Run timeouts of plain handlers on runner threads: a thread cannot be stopped, so at its run's
deadline the run is left overrunning instead.

One timer thread (started with the first run that has a time limit) watches the runs in
progress (each deadline counted from its run's start: `HeldJobs.start`). At a run's deadline,
if its thread has not returned, the run's failure (JobTimeout) is handed over as its outcome,
and the run is counted overrunning (`HeldJobs.overrun`): its thread keeps its slot, so the
worker never runs more threads than its concurrency, and claims no job for it meanwhile; under a
global cap it keeps its permit too (`Permits.overran`), so the cap counts the thread. The
handler sees `ctx.cancelled` (and `ctx.timed_out`) turn true; when its thread returns at last,
what it returned is dropped here (its attempt's token would refuse it anyway: the job may be
running again elsewhere) and the slot comes back (`HeldJobs.overrun_returned`), and the permit.

A batch (batches.py) is one run: its time limit is the smallest of its jobs', and at its
deadline each of its jobs fails with JobTimeout while its one thread overruns.

An `async def` handler's run is cancelled by its event loop instead (`executor.execute_async`),
and a run in a pool process (`--processes`) ends with its process (`pool.py`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..api.handler import timeout_error
from ..records import Lease
from .executor import Outcome, timed_out
from .serving import HeldJobs

if TYPE_CHECKING:
    from ..engine.store import Queue

log = logging.getLogger("jobqueue.worker")
Done = Callable[[Lease, Outcome], None]


class Run:
    """One run with a time limit, from its start on a runner thread until its thread returns."""

    __slots__ = ("batch", "kept_permit", "lease", "started", "timed_out")

    def __init__(self, lease: Lease, batch: tuple[Lease, ...] = ()) -> None:
        self.lease = lease
        self.batch = batch
        """The jobs of a batch run (batches.py: `lease` is the one whose time limit is the
        batch's), each failed at the deadline; () for a run of one job."""
        self.started = time.monotonic()
        self.timed_out = False
        """Set by the timer at the deadline (the run overruns from then)."""
        self.kept_permit = False
        """It overran holding a permit of its queue's global cap, kept until it returns."""


class Deadlines:
    """The runs with a time limit in progress on the runner threads (at most the worker's
    concurrency, the overrunning ones among them), and the timer that ends each past its
    deadline."""

    def __init__(self, done: Done, held: HeldJobs,
                 queue: Callable[[str], Queue] | None = None,
                 done_many: Callable[[list[tuple[Lease, Outcome]]], None] | None = None) -> None:
        """`queue`: the worker's queue of a name (whose global cap's permits an overrunning
        run keeps); `done_many`: where a batch's outcomes go together (batches.py)."""
        self._done, self._held, self._queue = done, held, queue
        self._done_many = done_many
        self._runs: set[Run] = set()
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None

    def start(self, lease: Lease, batch: tuple[Lease, ...] = ()) -> Run:
        """A run begins on this thread (`lease.deadline` counted from now): watch it (a
        batch's jobs, `batch`, end with it)."""
        run = Run(lease, batch)
        with self._changed:
            self._runs.add(run)
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name="jobqueue-deadlines",
                                                daemon=True)
                self._thread.start()
            self._changed.notify()
        return run

    def returned(self, run: Run, outcome: Outcome) -> Outcome | None:
        """The run's thread returned with `outcome`: the outcome to hand over (its JobTimeout
        when it returned past its deadline before the timer saw it), or None when the run
        overran (its failure recorded at its deadline; its slot is free now)."""
        with self._changed:
            self._runs.discard(run)  # (the timer no longer sees it)
            overran, late = run.timed_out, time.monotonic() >= run.lease.deadline
        if not overran:
            return timed_out(timeout_error(run.lease), outcome.duration) if late else outcome
        self._held.overrun_returned()
        if run.kept_permit and self._queue is not None:
            self._queue(run.lease.queue).leases.permits.returned()
        log.warning("job=%s: the run that overran its timeout (%g s) returned after %.1f s; "
                    "what it returned is discarded", run.lease.job_id, run.lease.timeout,
                    time.monotonic() - run.started)
        return None

    def _watch(self) -> None:
        """End each run past its deadline whose thread has not returned (it overruns)."""
        while True:
            with self._changed:
                now = time.monotonic()
                due = [run for run in self._runs if not run.timed_out and run.lease.deadline <= now]
                for run in due:  # (its slot counted before its thread may return)
                    run.timed_out = True
                    self._held.overrun()
                if not due:
                    waiting = [run.lease.deadline for run in self._runs if not run.timed_out]
                    self._changed.wait(min(waiting, default=now + 60.0) - now)
                    continue
            for run in due:
                self._overran(run)

    def _overran(self, run: Run) -> None:
        lease = run.lease
        log.warning("job=%s: its run passed its timeout (%g s) on a thread that cannot be "
                    "stopped; recorded failed, the thread keeps its slot until it returns",
                    lease.job_id, lease.timeout)
        outcome = timed_out(timeout_error(lease), time.monotonic() - run.started)
        try:
            if self._queue is not None:  # (before its failure is recorded, which frees it)
                run.kept_permit = self._queue(lease.queue).leases.permits.overran(lease)
            if run.batch and self._done_many is not None:  # (recorded together)
                self._done_many([(each, outcome) for each in run.batch])
            else:
                for each in run.batch or (lease,):
                    self._done(each, outcome)
        except Exception:  # (a bug in the bookkeeping: said, and the timer goes on)
            log.exception("job=%s: its timeout could not be handed over", lease.job_id)
