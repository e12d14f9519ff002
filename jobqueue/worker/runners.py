"""What runs claimed jobs: a lean thread pool for plain handlers, one event loop for `async def`
ones.

`concurrent.futures` would cost a Future, a lock, a callback and a queue hop per job — more than
a short job itself. Here N runner threads take jobs from one inbox and hand each outcome to
`done(lease, outcome)`. Jobs not yet started can be taken back (a stopping worker releases
them). With `processes=True` each runner hands its job to a process pool and waits for it, so
CPU-bound handlers use every core while the worker's own bookkeeping stays in threads.

An `async def` handler's jobs run as tasks on one event loop in its own thread (started with
the first such job; uvloop's when it is installed, see `conf.loop_factory`), many at once
without a thread each; the worker's concurrency bounds them all the same. A loop that outlives a
job lets the handler keep async clients (redis.asyncio, httpx, asyncpg pools) between jobs. A
watchdog thread logs the call a handler is in when it holds the loop (a blocking call in an
async handler stalls every async job).

The GIL's switch interval that suits these threads is set here too (with the first `async def`
handler); the cyclic collector's settings are `jobqueue.collector`'s.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Coroutine
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from functools import partial
from queue import Empty, SimpleQueue
from typing import Any, TypeVar

from .. import collector, signals, tracing
from .._compat import connection_closer
from ..conf import loop_factory
from ..records import Lease
from ..store import Queue
from .executor import Outcome, Prepared, execute, execute_async, is_async, prepare

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
Job = tuple[Lease, Prepared | Outcome | None]
T = TypeVar("T")
BLOCKED = 0.5
"""Seconds the event loop may go without running a callback before its watchdog logs where the
loop's thread is: an async handler that makes a blocking call stalls every async job."""


class Runners:
    """N threads running jobs from an inbox (or through a process pool), and an event loop
    for `async def` handlers, until stopped."""

    def __init__(self, count: int, done: Done, *, processes: bool = False) -> None:
        self._inbox: SimpleQueue[Job | None] = SimpleQueue()
        self._done = done
        self._count = count
        self._pool: ProcessPoolExecutor | None = _process_pool(count) if processes else None
        self._pool_lock = threading.Lock()
        self._loop: EventLoop | None = None
        self._tracer = tracing.worker_tracer()
        self._threads: list[threading.Thread] = []
        """Started as plain jobs come, up to `count` (a worker of async handlers needs none)."""
        self._most = count
        self._grow = threading.Lock()

    def submit(self, leases: list[Lease]) -> None:
        """Start claimed jobs: async ones on the event loop, the others on the threads (a
        process pool resolves its jobs itself: what a handler is cannot cross processes)."""
        on_loop: list[tuple[Lease, Prepared]] = []
        plain = 0
        for lease in leases:
            prepared = None if self._pool is not None else prepare(lease)
            if prepared is not None and is_async(prepared):
                on_loop.append((lease, prepared))
            else:
                self._inbox.put((lease, prepared))
                plain += 1
        if plain and len(self._threads) < self._most:
            self._start_threads(plain)
        if on_loop:
            if self._loop is None:
                self._loop = EventLoop(self._done)
            self._loop.submit(on_loop)

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
        """Leases no runner has picked up yet, taken back (the stopping worker releases them)."""
        taken: list[Lease] = []
        while True:
            try:
                job = self._inbox.get_nowait()
            except Empty:
                return taken
            if job is not None:
                taken.append(job[0])

    def stop(self, wait: bool) -> None:
        """Let each runner finish its job and exit; wait for them unless told not to (then
        async jobs are cancelled at their next await)."""
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
        if self._pool is not None:
            self._pool.shutdown(wait=wait, cancel_futures=True)

    def _loop_thread(self) -> None:
        close_old_connections = connection_closer()
        while (job := self._inbox.get()) is not None:
            lease, prepared = job
            signals.send(signals.job_started, Queue, lease=lease)
            outcome = (self._run(lease, prepared) if self._tracer is None
                       else tracing.run(self._tracer, lease, partial(self._run, lease, prepared)))
            # A job ends like a request: its thread's database connection is closed unless
            # CONN_MAX_AGE keeps it, and a kept one is health-checked (CONN_HEALTH_CHECKS) by
            # the next job's first query, so one the server dropped meanwhile is replaced.
            close_old_connections()
            self._done(lease, outcome)

    def _run(self, lease: Lease, prepared: Prepared | Outcome | None) -> Outcome:
        pool = self._pool
        if pool is None:
            return execute(lease, prepared)
        try:
            return pool.submit(execute, lease).result()
        except BrokenProcessPool as exc:
            # A handler killed its pool process: its job fails with the pool's error, and a new
            # pool serves the jobs that follow.
            self._renew_pool(pool)
            return Outcome(False, error=f"worker pool failed: {exc!r}")
        except Exception as exc:  # noqa: BLE001 - e.g. a result that cannot be pickled back
            return Outcome(False, error=f"worker pool failed: {exc!r}")

    def _renew_pool(self, broken: ProcessPoolExecutor) -> None:
        with self._pool_lock:
            if self._pool is broken:  # not yet renewed by another runner
                log.warning("process pool broken by a job that died; starting a new pool")
                self._pool.shutdown(wait=False, cancel_futures=True)
                self._pool = _process_pool(self._count)


class EventLoop:
    """One asyncio loop in its own thread; each job a task on it."""

    def __init__(self, done: Done) -> None:
        self._done = done
        if sys.getswitchinterval() == DEFAULT_SWITCH:  # (an application's own setting stays)
            sys.setswitchinterval(SWITCH)
        self._loop = loop_factory()()
        self._tracer = tracing.worker_tracer()
        self._tasks: set[asyncio.Task[None]] = set()
        self._starting = False
        """While `_start` starts tasks eagerly: a job that ends within its eager start (a handler
        that never awaits) reports its outcome at the loop's next turn, not inside its caller,
        which may hold the worker's claim lock (at concurrency 1 the caller is the claim that
        the previous job's outcome made: a deadlock)."""
        self._thread = threading.Thread(target=self._loop.run_forever, name="jobqueue-asyncio",
                                        daemon=True)
        self._thread.start()
        self._closed = threading.Event()
        threading.Thread(target=self._watch, name="jobqueue-asyncio-watch", daemon=True).start()

    def submit(self, jobs: list[tuple[Lease, Prepared]]) -> None:
        if threading.get_ident() == self._thread.ident:  # (claimed on the loop: start them now)
            self._start(jobs, eager=EAGER)
        else:
            self._loop.call_soon_threadsafe(self._start, jobs)  # one wake-up for the whole batch

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine on the loop from another thread; its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def call_soon(self, callback: Callable[[], object]) -> None:
        """Have the loop call `callback` from another thread, without waiting for it."""
        self._loop.call_soon_threadsafe(callback)

    def _start(self, jobs: list[tuple[Lease, Prepared]], eager: bool = False) -> None:
        """Create the jobs' tasks. `eager` (a job an idle wait brought, on the loop) runs each to
        its first await at once, in the same turn as its claim's reply (Python 3.12's eager
        tasks); a batch from the main loop starts at the loop's next turn: eager starts for every
        batch measured slower on a busy worker (bench/RESULTS.md, "The idle worker and the idle
        wait's read path")."""
        self._starting = eager
        try:
            for lease, prepared in jobs:
                coroutine = self._run(lease, prepared)
                task = (asyncio.Task(coroutine, loop=self._loop, eager_start=True) if eager
                        else self._loop.create_task(coroutine))
                if not task.done():
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
        finally:
            self._starting = False

    async def _run(self, lease: Lease, prepared: Prepared) -> None:
        if signals.job_started.receivers:  # (looked at here: per job, and most workers have none)
            signals.send(signals.job_started, Queue, lease=lease)
        if self._tracer is None:
            outcome = await execute_async(lease, prepared)
        else:
            outcome = await tracing.run_async(self._tracer, lease,
                                              partial(execute_async, lease, prepared))
        if self._starting:  # (it never awaited: see `_starting`)
            self._loop.call_soon(self._done, lease, outcome)
        else:
            self._done(lease, outcome)

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
        self._closed.set()

        async def finish() -> None:
            if not wait:
                for task in self._tasks:
                    task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(finish(), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


def _process_pool(count: int) -> ProcessPoolExecutor:
    import multiprocessing

    return ProcessPoolExecutor(
        count, mp_context=multiprocessing.get_context("spawn"),
        initializer=_init_process, initargs=(os.environ.get("DJANGO_SETTINGS_MODULE"),),
    )


def _init_process(settings_module: str | None) -> None:
    """Set Django up in a pool process and import the handlers, as the worker did."""
    import django
    from django.utils.module_loading import autodiscover_modules

    if settings_module:
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", settings_module)
    django.setup()
    autodiscover_modules("jobs")
    collector.resume()  # (a spawned process given a runworker's argv: see jobqueue.collector)
