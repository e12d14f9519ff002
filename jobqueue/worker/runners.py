"""What runs claimed jobs: a lean thread pool for plain handlers, one event loop for `async def`
ones.

`concurrent.futures` would cost a Future, a lock, a callback and a queue hop per job — more than
a short job itself. Here N runner threads take jobs from one inbox and hand each outcome to
`done(lease, outcome)`. Jobs not yet started can be taken back (a stopping worker releases
them). With `processes=True` each runner hands its job to a process of its own and waits for it
(pool.py), so CPU-bound handlers use every core while the worker's own bookkeeping stays in
threads. A worker of a project with batch handlers first gives their jobs to `batches.py`,
which hands each batch back as one entry of the inbox, run by `BatchRunner.run`.

An `async def` handler's jobs run as tasks on one event loop in its own thread (started with
the first such job; uvloop's when it is installed, see `conf.loop_factory`), many at once
without a thread each, and at most the worker's concurrency at once: the others wait on the
loop's own list, where a stopping worker takes them back as it does the inbox's. A loop that
outlives a job lets the handler keep async clients (redis.asyncio, httpx, asyncpg pools) between
jobs. A watchdog thread logs the call a handler is in when it holds the loop (a blocking call in
an async handler stalls every async job).

A run with a time limit (`timeout`) is ended at its deadline, counted from the run's start (as
a runner or the loop starts it, or once its pool process is up: `HeldJobs.start`), not from its
claim: an async task is cancelled by the loop (executor.py), a pool process killed (pool.py),
and a plain handler's thread, which cannot be stopped, left overrunning (deadlines.py: its
failure recorded at once, its slot kept until it returns, its late return dropped).

A stopping worker that hands back jobs still running first ends what it can (`abandon`): the
pool processes running them are killed, and their async tasks cancelled. Only that cancel ends
an async run without an outcome; a `CancelledError` the handler raised itself fails its job
(executor.py). A plain handler on a runner thread cannot be stopped: the process's exit ends it.

The GIL's switch interval that suits these threads is set here too (with the first `async def`
handler); the cyclic collector's settings are `jobqueue.collector`'s.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Coroutine
from functools import partial
from queue import Empty, SimpleQueue
from typing import Any, TypeVar

from .. import signals, tracing
from .._compat import connection_closer
from ..conf import loop_factory
from ..engine.store import Queue
from ..records import Lease
from .batches import Batch, BatchRunner, DoneMany, leases_of
from .deadlines import Deadlines
from .executor import Outcome, Resolved, execute, execute_async, is_async, resolve, unexpected
from .pool import Abandoned, PoolProcess
from .recycling import PoolLimit
from .serving import HeldJobs

log = logging.getLogger("jobqueue.worker")
Done = Callable[[Lease, Outcome], None]
DEFAULT_SWITCH = 0.005
"""CPython's interval (seconds) after which a thread that wants the GIL makes the holder let go."""
SWITCH = 0.0002
"""The interval once a worker runs async handlers. Its main loop and its event loop then both
spend their time between socket reads: at the default, a thread whose reply has arrived may wait
up to 5 ms for the other to let go, and the short interval makes such a worker faster. A worker
of plain handlers keeps the default: with its runner threads all busy, the short interval costs
more handovers than it saves (both measured in bench/RESULTS.md, "uvloop, the garbage collector
and the GIL")."""
EAGER = sys.version_info >= (3, 12)
"""Whether tasks can start eagerly (`asyncio.Task(..., eager_start=True)`)."""
Job = tuple[Lease, Resolved | Outcome | Batch | None]
T = TypeVar("T")
BLOCKED = 0.5
"""Seconds the event loop may go without running a callback before its watchdog logs where the
loop's thread is: an async handler that makes a blocking call stalls every async job."""
ABANDON_WAIT = 1.0
"""Seconds cancelled async jobs get to end (their `finally` blocks) before a stopping worker
hands them back."""
STOP_WAIT = 5.0
"""Seconds a stop waits for the event loop's thread (a handler may hold the loop)."""


class Runners:
    """N threads running jobs from an inbox (each through a pool process of its own with
    `--processes`: pool.py), and an event loop for `async def` handlers, until stopped."""

    def __init__(self, count: int, done: Done, held: HeldJobs, *, processes: bool = False,
                 max_memory: int | None = None,
                 queue: Callable[[str], Queue] | None = None,
                 batches: DoneMany | None = None) -> None:
        """`held`: the worker's held jobs (each run's start and overrun noted there);
        `queue`: the worker's queue of a name (an overrunning run keeps its cap's permit);
        `max_memory`: resident MB past which a pool process is replaced after its job;
        `batches`: where a batch's outcomes go, when batch handlers are served (None: no job
        is gathered into batches: batches.py)."""
        self._inbox: SimpleQueue[Job | None] = SimpleQueue()
        self._held = held
        self.deadlines = Deadlines(done, held, queue, batches)
        """Plain runs with a time limit on the runner threads (deadlines.py)."""
        self._batches = (BatchRunner(self._batch_ready, batches, held.start, self.deadlines)
                         if batches is not None else None)
        self._done = done
        self._count = count
        self._processes = processes
        self._pool_limit = PoolLimit(max_memory) if max_memory is not None else None
        self._pool: list[PoolProcess] = []
        """The runners' processes (`--processes`), ended by `abandon`."""
        self._loop: EventLoop | None = None
        self._tracer = tracing.worker_tracer()
        self._threads: list[threading.Thread] = []
        """Started as plain jobs come, up to `count` (a worker of async handlers needs none)."""
        self._most = count
        self._grow = threading.Lock()

    def submit(self, leases: list[Lease]) -> None:
        """Start claimed jobs: async ones on the event loop, the others on the threads (a
        process pool resolves its jobs itself: what a handler is cannot cross processes)."""
        on_loop: list[tuple[Lease, Resolved]] = []
        plain = 0
        if self._batches is not None:
            leases = self._batches.gather(leases)
        for lease in leases:
            resolved = None if self._processes else resolve(lease)
            if resolved is not None and is_async(resolved):
                on_loop.append((lease, resolved))
            else:
                self._inbox.put((lease, resolved))
                plain += 1
        if plain and len(self._threads) < self._most:
            self._start_threads(plain)
        if on_loop:
            if self._loop is None:
                self._loop = EventLoop(self._done, self._count, self._held.start)
            self._loop.submit(on_loop)

    def _batch_ready(self, batch: Batch) -> None:
        """A batch is due: to a runner thread, as a job (batches.py)."""
        self._inbox.put((batch.leases[0], batch))
        if len(self._threads) < self._most:
            self._start_threads(1)

    def _start_threads(self, jobs: int) -> None:
        """One more runner per job just queued, up to `count`."""
        with self._grow:
            for _ in range(min(jobs, self._most - len(self._threads))):
                thread = threading.Thread(target=self._loop_thread, daemon=True,
                                          name=f"jobqueue-job-{len(self._threads)}")
                thread.start()
                self._threads.append(thread)

    @property
    def loop(self) -> EventLoop | None:
        """The event loop for async handlers, once one has run."""
        return self._loop

    def take_unstarted(self) -> list[Lease]:
        """Leases no runner has started yet, taken back (the stopping worker releases them):
        plain jobs in the inbox, async ones waiting for room on the loop."""
        taken: list[Lease] = self._loop.take_unstarted() if self._loop is not None else []
        if self._batches is not None:
            taken += self._batches.gathering.take_unstarted()
        while True:
            try:
                job = self._inbox.get_nowait()
            except Empty:
                return taken
            if job is not None:
                taken += leases_of(*job)

    def abandon(self) -> None:
        """End what still runs, before the stopping worker hands it back: the pool processes
        that run a job are killed and async jobs cancelled (given ABANDON_WAIT seconds to end).
        A handler on a runner thread cannot be stopped: the process's exit ends it."""
        for process in list(self._pool):
            process.end()
        if self._loop is not None:
            self._loop.abandon()

    def stop(self, wait: bool) -> None:
        """Let each runner finish its job and exit; wait for them unless told not to (then
        `abandon` has ended what could be ended, and the process's exit ends the rest)."""
        with self._grow:
            self._most = 0  # (no runner starts after this)
            threads = list(self._threads)
        for _ in threads:
            self._inbox.put(None)
        if self._loop is not None:
            self._loop.stop(wait)
        if wait:
            for thread in threads:
                thread.join()

    def _loop_thread(self) -> None:
        # A job ends like a request: its thread's database connection is closed unless
        # CONN_MAX_AGE keeps it, and a kept one is health-checked (CONN_HEALTH_CHECKS) by the
        # next job's first query, so one the server dropped meanwhile is replaced. After an
        # idle wait they are looked at again before the job (a kept one may have grown too old).
        close_old_connections, inbox = connection_closer(), self._inbox
        process = PoolProcess(self._pool_limit) if self._processes else None
        if process is not None:
            self._pool.append(process)
        try:
            while True:
                try:
                    job = inbox.get_nowait()
                except Empty:
                    job = inbox.get()
                    close_old_connections()
                if job is None:
                    return
                self._one(*job, process, close_old_connections)
                if process is not None:
                    process.settle()  # (past --max-memory: replaced, its outcome handed over)
        finally:
            if process is not None:
                process.close()

    def _one(self, lease: Lease, resolved: Resolved | Outcome | Batch | None,
             process: PoolProcess | None, close_old_connections: Callable[[], None]) -> None:
        """Run one job and hand its outcome over. A job's own errors are its outcome
        (`execute`); an error of the worker's code around it fails the job (or, past its
        outcome, is logged): either way the runner goes on to the next job."""
        if isinstance(resolved, Batch):  # (batches.py)
            assert self._batches is not None
            return self._batches.run(resolved, process, close_old_connections)
        run = None
        if process is None:  # (a pool process starts its run once it is up: pool.py)
            lease = self._held.start(lease)
            if lease.deadline:
                run = self.deadlines.start(lease)
        outcome: Outcome | None
        try:
            signals.send(signals.job_started, Queue, lease=lease)
            outcome = (self._run(lease, resolved, process) if self._tracer is None else
                       tracing.run(self._tracer, lease,
                                   partial(self._run, lease, resolved, process)))
        except Abandoned:  # (ended by the stopping worker, which hands the job back)
            return
        except Exception as exc:  # (logged, and the job's failure)
            log.exception("job=%s: the runner failed around it", lease.job_id)
            outcome = unexpected(exc)
        if run is not None:  # (None: it overran, its timeout recorded at its deadline)
            outcome = self.deadlines.returned(run, outcome)
        try:
            close_old_connections()
        finally:
            if outcome is not None:
                hand_over(self._done, lease, outcome)

    def _run(self, lease: Lease, resolved: Resolved | Outcome | None,
             process: PoolProcess | None) -> Outcome:
        if process is None:
            return execute(lease, resolved)
        return process.run(lease, self._held.start)  # (the run starts once the process is up)


def hand_over(done: Done, lease: Lease, outcome: Outcome) -> None:
    """`done(lease, outcome)`, an error of which is logged: the runner (or the event loop) that
    hands an outcome over goes on either way."""
    try:
        done(lease, outcome)
    except Exception:  # (a bug in the bookkeeping: said, and the runner goes on)
        log.exception("job=%s: its outcome could not be handed over (the worker holds it "
                      "until it stops)", lease.job_id)


class EventLoop:
    """One asyncio loop in its own thread; each job a task on it, at most `limit` at once (the
    worker's concurrency: the others wait here, prefetched, and can be taken back)."""

    def __init__(self, done: Done, limit: int, start: Callable[[Lease], Lease]) -> None:
        """`start`: a job's lease as its run starts (`HeldJobs.start`: its deadline from now)."""
        self._done = done
        self._limit = limit
        self._start = start
        if sys.getswitchinterval() == DEFAULT_SWITCH:  # (an application's own setting stays)
            sys.setswitchinterval(SWITCH)
        self._loop = loop_factory()()
        self._tracer = tracing.worker_tracer()
        self._tasks: set[asyncio.Task[None]] = set()
        self._waiting: deque[tuple[Lease, Resolved]] = deque()
        """Jobs claimed but not started (prefetched); taken from other threads under `_lock`."""
        self._lock = threading.Lock()
        self._running = 0
        """Jobs started and not ended (read and written on the loop only)."""
        self._abandoning = False
        """Set once the stopping worker cancels what runs: the runs it cancels have no outcome."""
        self._starting = False
        """While `_fill` starts tasks eagerly: a job that ends within its eager start (a handler
        that never awaits) reports its outcome at the loop's next turn, not inside its caller,
        which may hold the worker's claim lock (at concurrency 1 the caller is the claim that
        the previous job's outcome made: a deadlock)."""
        self._thread = threading.Thread(target=self._loop.run_forever, name="jobqueue-asyncio",
                                        daemon=True)
        self._thread.start()
        self._closed = threading.Event()
        threading.Thread(target=self._watch, name="jobqueue-asyncio-watch", daemon=True).start()

    def submit(self, jobs: list[tuple[Lease, Resolved]]) -> None:
        with self._lock:
            self._waiting.extend(jobs)
        if threading.get_ident() == self._thread.ident:  # (claimed on the loop: start them now)
            self._fill(eager=EAGER)
        else:
            self._loop.call_soon_threadsafe(self._fill)  # one wake-up for the whole batch

    def take_unstarted(self) -> list[Lease]:
        """The jobs not started yet, taken back (the stopping worker releases them)."""
        with self._lock:
            taken = [lease for lease, _ in self._waiting]
            self._waiting.clear()
        return taken

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine on the loop from another thread; its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def call_soon(self, callback: Callable[[], object]) -> None:
        """Have the loop call `callback` from another thread, without waiting for it."""
        self._loop.call_soon_threadsafe(callback)

    def _fill(self, eager: bool = False) -> None:
        """Start waiting jobs while fewer than `limit` run. `eager` (a job an idle wait brought,
        on the loop) runs each to its first await at once, in the same turn as its claim's reply
        (Python 3.12's eager tasks); a batch from the main loop starts at the loop's next turn:
        eager starts for every batch measured slower on a busy worker (bench/RESULTS.md, "The
        idle worker and the idle wait's read path")."""
        room = self._limit - self._running
        with self._lock:
            jobs = [self._waiting.popleft() for _ in range(min(room, len(self._waiting)))]
        self._running += len(jobs)
        self._starting = eager
        try:
            for lease, resolved in jobs:
                coroutine = self._run(lease, resolved)
                task = (asyncio.Task(coroutine, loop=self._loop, eager_start=True) if eager
                        else self._loop.create_task(coroutine))
                if not task.done():
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
        finally:
            self._starting = False

    async def _run(self, lease: Lease, resolved: Resolved) -> None:
        """One job's task. As on a runner thread, an error of the worker's code around the
        handler fails the job (or, past its outcome, is logged), and the loop goes on."""
        try:
            if signals.job_started.receivers:  # (off the loop: a receiver may use the ORM)
                await asyncio.to_thread(signals.send_from_worker, signals.job_started, Queue,
                                        lease=lease)
            lease = self._start(lease)  # (its time limit counts from here, not its claim)
            if self._tracer is None:
                outcome = await execute_async(lease, resolved)
            else:
                outcome = await tracing.run_async(self._tracer, lease,
                                                  partial(execute_async, lease, resolved))
        except Exception as exc:  # (logged, and the job's failure)
            log.exception("job=%s: the event loop failed around it", lease.job_id)
            outcome = unexpected(exc)
        finally:
            self._running -= 1
        if self._abandoning and _cancelled():  # (the stopping worker's cancel: it hands the
            return  # job back; a run that ended before it did reports its outcome)
        if self._starting:  # (it never awaited: see `_starting`)
            self._loop.call_soon(hand_over, self._done, lease, outcome)
        else:
            hand_over(self._done, lease, outcome)
        if self._waiting:  # (its room goes to the next; inside an eager start, at the next turn)
            if self._starting:
                self._loop.call_soon(self._fill)
            else:
                self._fill()

    def abandon(self, wait: float = ABANDON_WAIT) -> None:
        """Cancel the running jobs (the stopping worker hands them back) and give them `wait`
        seconds to end. A handler that holds the loop, or swallows its cancel, is left to the
        process's exit."""
        self._abandoning = True

        async def cancel() -> None:
            tasks = list(self._tasks)
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.wait(tasks, timeout=wait)

        cancelled = asyncio.run_coroutine_threadsafe(cancel(), self._loop)
        try:
            cancelled.result(timeout=wait + BLOCKED)
        except TimeoutError:
            cancelled.cancel()
        if any(not task.done() for task in list(self._tasks)) or not cancelled.done():
            log.warning("async jobs still run after their cancel (a handler holds the event "
                        "loop or swallowed its cancel); handed back all the same")

    def _watch(self) -> None:
        """Once a second, ask the loop to answer. When it does not within BLOCKED seconds, a
        handler holds it: log the call it is in, and for how long it held the loop."""
        while not self._closed.wait(1.0):
            answered, asked = threading.Event(), time.monotonic()
            try:
                self._loop.call_soon_threadsafe(answered.set)
            except RuntimeError:  # the loop was closed meanwhile
                return
            if answered.wait(BLOCKED):
                continue
            frame = sys._current_frames().get(self._thread.ident or 0)
            where = "".join(traceback.format_stack(frame, limit=8)) if frame else "(unknown)\n"
            while not answered.wait(0.5):
                if self._closed.is_set():
                    return
            log.warning("an async handler blocked the worker's event loop for %.1fs or more, "
                        "holding up every async job (use await, or sync_to_async for blocking "
                        "calls); it was in:\n%s", time.monotonic() - asked, where.rstrip())

    def stop(self, wait: bool) -> None:
        """Stop the loop: once its jobs have ended (`wait`: none should still run, but a stop
        never waits on a held loop for more than STOP_WAIT seconds), or at once (`abandon`
        has cancelled them). A loop a handler holds is left to the process's exit."""
        self._closed.set()
        if wait:
            ended = asyncio.run_coroutine_threadsafe(_ended(self._tasks), self._loop)
            try:
                ended.result(timeout=STOP_WAIT)
            except TimeoutError:
                ended.cancel()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=STOP_WAIT if wait else BLOCKED)
        if wait and not self._thread.is_alive():
            self._loop.close()


def _cancelled() -> bool:
    """Whether the running task was asked to cancel (only the stopping worker asks)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


async def _ended(tasks: set[asyncio.Task[None]]) -> None:
    await asyncio.gather(*tasks, return_exceptions=True)
