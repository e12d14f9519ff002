"""The handler's API: what an `@job` function may use while it runs.

`RetryLater` and `JobCancelled` are exceptions a handler raises; `JobContext` is the `ctx` a
`takes_context=True` handler gets. All three are re-exported from `jobqueue`. (`Unretryable` is
for bridges: contrib/celery.py.)

`ctx.progress(value)` only notes the value: the process's `PROGRESS` board keeps the latest per
job and a worker thread (`ProgressBoard.run`) writes them a few times a second, one script call
(`progress`, fenced by each attempt's token) per queue and shard. The runner writes what is left
when the job ends, before its outcome is recorded, so the last value stays on the row. Outside a
worker (a handler called inline, a process pool's child) the context writes itself, at most
every PROGRESS_EVERY seconds.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import defaultdict
from typing import Any

from redis.exceptions import RedisError

from .. import sealing
from ..engine.scripts import calls
from ..engine.store import Queue
from ..exceptions import JobTimeout
from ..records import Lease
from ..sealing import SEALED
from ..spec import dumps

log = logging.getLogger("jobqueue.worker")
PROGRESS_EVERY = 0.25
"""Seconds between two progress writes of a job (the board's flushes, or an unattended
context's own writes)."""


class RetryLater(Exception):
    """Raise from a handler to retry after `retry_in` seconds without a traceback."""

    def __init__(self, reason: str = "retry requested", retry_in: float | None = None) -> None:
        super().__init__(reason)
        self.retry_in = retry_in


class JobCancelled(Exception):
    """Raised by `ctx.raise_if_cancelled()`: the job is recorded as cancelled."""


class Unretryable(Exception):
    """Raised from the handler's error (`raise Unretryable() from exc`) to end the job's run as a
    failure no retry follows, whatever budget is left: a bridge's tasks whose own semantics say
    so (a Celery task that raises without `self.retry` fails once). The job's error is the
    cause's traceback."""


def timeout_error(lease: Lease) -> str:
    """What a run past its time limit failed with (the attempt's error)."""
    return (f"the run of job {lease.job_id} (attempt {lease.token}) passed its timeout of "
            f"{lease.timeout:g} s")


class JobContext:
    """What a `takes_context=True` handler gets as `ctx`."""

    def __init__(self, lease: Lease) -> None:
        self.job_id = lease.job_id
        self.attempt = lease.token
        self.queue = lease.queue
        self._sealed = isinstance(lease.payload, dict) and SEALED in lease.payload
        """A sealed job (sealing.py): its checkpoint and progress are sealed as they are stored."""
        self.checkpoint = (sealing.open_value(lease.checkpoint, lease.job_id, "checkpoint")
                           if self._sealed else lease.checkpoint)
        self._lease = lease
        self._cancelled = False
        self._next_check = 0.0
        self._progress: str | None = None
        """The latest progress value not yet written (JSON)."""
        self._progress_lock = threading.Lock()
        self._sending = threading.Lock()
        """Held while a write of this job's progress is in flight: writes land in order."""
        self._next_write = 0.0

    @property
    def cancelled(self) -> bool:
        """True once an operator asked to cancel this job (Cancel on its page, or
        `Queue.cancel`), or once the run passed its `timeout` (`timed_out`). Read from Valkey
        at most once a second, so a loop may ask often."""
        now = time.monotonic()
        if not self._cancelled and self.timed_out:
            self._cancelled = True
        if not self._cancelled and now >= self._next_check:
            self._next_check = now + 1.0
            self._cancelled = Queue(self.queue).leases.cancel_requested(self._lease)
        return self._cancelled

    @property
    def timed_out(self) -> bool:
        """True once the run passed its `timeout` (counted from the run's start; read from the
        clock): the attempt fails with JobTimeout (the worker records it at the deadline, or as
        the handler returns, whichever comes first), and whatever the handler returns now is
        discarded (stop soon: until it returns, its thread holds one of the worker's slots)."""
        deadline = self._lease.deadline
        return bool(deadline) and time.monotonic() >= deadline

    def raise_if_cancelled(self) -> None:
        """Stop here if an operator cancelled the job (it is recorded as cancelled), or if the
        run passed its timeout (JobTimeout: the attempt fails so, whichever of the worker's timer
        and this raise comes first)."""
        if self.timed_out:
            raise JobTimeout(timeout_error(self._lease))
        if self.cancelled:
            raise JobCancelled(f"job {self.job_id} was cancelled while it ran")

    def save_checkpoint(self, data: Any) -> bool:
        """Store progress so a re-run (after a crash) starts from it; False if the lease was lost."""
        stored = (sealing.keyring().seal(dumps(data, "checkpoint"), self.job_id, "checkpoint")
                  if self._sealed else data)
        saved = Queue(self._lease.queue).checkpoint(self._lease, stored)
        if saved:
            self.checkpoint = data
        return saved

    def progress(self, value: Any) -> None:
        """Report how far the job has come (any JSON value): `get_job(...).progress` and the
        console show the latest. Cheap in a tight loop: writes are coalesced, a few a second."""
        encoded = dumps(value, "progress")
        if self._sealed:
            encoded = sealing.seal_json(encoded, self.job_id, "progress")
        with self._progress_lock:
            self._progress = encoded
        if PROGRESS.attached:
            PROGRESS.put(self)
        elif time.monotonic() >= self._next_write:
            self.flush_progress()

    @property
    def progress_unwritten(self) -> bool:
        """Whether a progress value waits to be written, or is being written (the progress
        thread took it and its write has yet to land): the runner writes the one, and waits
        for the other, before the outcome is recorded. (A value is taken only under `_sending`,
        which is let go once its write is answered.)"""
        return self._progress is not None or self._sending.locked()

    def flush_progress(self) -> bool:
        """Write the latest progress now if one is waiting; False when the lease was lost."""
        with self._sending:
            with self._progress_lock:
                value, self._progress = self._progress, None
            if value is None:
                return True
            self._next_write = time.monotonic() + PROGRESS_EVERY
            return write_progress([(self._lease, value)])[0]

    def _take_progress(self) -> str | None:
        with self._progress_lock:
            value, self._progress = self._progress, None
            return value

    # For `async def` handlers: the same, with the round trip to Valkey made off the event loop
    # (on its default thread pool), so the worker's other async jobs run meanwhile.

    async def acancelled(self) -> bool:
        """`cancelled`, awaited. Between its once-a-second looks it answers at once."""
        if not self._cancelled and self.timed_out:
            self._cancelled = True
        if self._cancelled or time.monotonic() < self._next_check:
            return self._cancelled
        return await asyncio.to_thread(lambda: self.cancelled)

    async def araise_if_cancelled(self) -> None:
        """`raise_if_cancelled`, awaited."""
        if self.timed_out:
            raise JobTimeout(timeout_error(self._lease))
        if await self.acancelled():
            raise JobCancelled(f"job {self.job_id} was cancelled while it ran")

    async def asave_checkpoint(self, data: Any) -> bool:
        """`save_checkpoint`, awaited."""
        return await asyncio.to_thread(self.save_checkpoint, data)


def write_progress(items: list[tuple[Lease, str]]) -> list[bool]:
    """Store running jobs' progress (JSON), one call per shard of each queue; per job whether
    it was stored (False: the attempt is over, or another holds the job)."""
    by_queue: dict[str, list[int]] = defaultdict(list)
    for i, (lease, _) in enumerate(items):
        by_queue[lease.queue].append(i)
    stored = [False] * len(items)
    for name, positions in by_queue.items():
        answers = calls.progress(Queue(name).client, name, [items[i] for i in positions])
        for i, ok in zip(positions, answers, strict=True):
            stored[i] = ok
    return stored


class ProgressBoard:
    """The running jobs of this process whose progress changed since it was last written; a
    worker's thread (`run`) writes them a few times a second."""

    def __init__(self) -> None:
        self.attached = False
        """Whether a thread is writing the board (else each context writes itself)."""
        self._changed: dict[int, JobContext] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()

    def put(self, ctx: JobContext) -> None:
        with self._lock:
            self._changed[id(ctx)] = ctx
        self._wake.set()

    def wake(self) -> None:
        """End `run`'s wait now (its stop event was just set)."""
        self._wake.set()

    def run(self, stop: threading.Event) -> None:
        """Write what changed, at most every PROGRESS_EVERY seconds, until `stop` is set."""
        self.attached = True
        try:
            while not stop.is_set():
                if self._wake.wait(0.5):
                    self._wake.clear()
                    self.flush()
                    stop.wait(PROGRESS_EVERY)
        finally:
            self.attached = False
            self.flush()

    def flush(self) -> None:
        """Write every changed job's latest progress (a job's own write in flight goes first)."""
        with self._lock:
            changed, self._changed = list(self._changed.values()), {}
        held = [ctx for ctx in changed if ctx._sending.acquire()]
        items = [(ctx, value) for ctx in held if (value := ctx._take_progress()) is not None]
        try:
            if items:
                write_progress([(ctx._lease, value) for ctx, value in items])
        except RedisError as exc:  # kept for the next flush (or the job's end), unless superseded
            log.warning("could not write progress (%s); retrying", exc)
            for ctx, value in items:
                with ctx._progress_lock:
                    ctx._progress = ctx._progress or value
                self.put(ctx)
        finally:
            for ctx in held:
                ctx._sending.release()


PROGRESS = ProgressBoard()
"""This process's board: `JobContext.progress` puts to it; a worker runs it (`run`)."""
