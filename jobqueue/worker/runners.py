"""The threads that run claimed jobs: a lean pool, one hand-off per job in and one out.

`concurrent.futures` would cost a Future, a lock, a callback and a queue hop per job — more than
a short job itself. Here N runner threads take leases from one inbox and hand each outcome to
`done(lease, outcome)`. Jobs not yet started can be taken back (a stopping worker releases
them). With `processes=True` each runner hands its job to a process pool and waits for it, so
CPU-bound handlers use every core while the worker's own bookkeeping stays in threads.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from queue import Empty, SimpleQueue

from .. import signals
from ..records import Lease
from ..store import Queue
from .executor import Outcome, execute

log = logging.getLogger("jobqueue.worker")
Done = Callable[[Lease, Outcome], None]


class Runners:
    """N threads running leases from an inbox (or through a process pool) until stopped."""

    def __init__(self, count: int, done: Done, *, processes: bool = False) -> None:
        self._inbox: SimpleQueue[Lease | None] = SimpleQueue()
        self._done = done
        self._count = count
        self._pool: ProcessPoolExecutor | None = _process_pool(count) if processes else None
        self._pool_lock = threading.Lock()
        self._threads = [threading.Thread(target=self._loop, name=f"jobqueue-job-{i}", daemon=True)
                         for i in range(count)]
        for thread in self._threads:
            thread.start()

    def submit(self, lease: Lease) -> None:
        self._inbox.put(lease)

    def take_unstarted(self) -> list[Lease]:
        """Leases no runner has picked up yet, taken back (the stopping worker releases them)."""
        taken: list[Lease] = []
        while True:
            try:
                lease = self._inbox.get_nowait()
            except Empty:
                return taken
            if lease is not None:
                taken.append(lease)

    def stop(self, wait: bool) -> None:
        """Let each runner finish its job and exit; wait for them unless told not to."""
        for _ in self._threads:
            self._inbox.put(None)
        if wait:
            for thread in self._threads:
                thread.join()
        if self._pool is not None:
            self._pool.shutdown(wait=wait, cancel_futures=True)

    def _loop(self) -> None:
        while (lease := self._inbox.get()) is not None:
            signals.send(signals.job_started, Queue, lease=lease)
            self._done(lease, self._run(lease))

    def _run(self, lease: Lease) -> Outcome:
        pool = self._pool
        if pool is None:
            return execute(lease)
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
