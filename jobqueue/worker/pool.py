"""`runworker --processes`: each runner thread runs its jobs in a process of its own.

A runner thread hands its job to its process over a pipe and waits for the outcome. The process
sets Django up once (the handlers imported, as the worker did) and runs `execute` for each job,
its database connections closed or checked before and after each job as around a request
(CONN_MAX_AGE, CONN_HEALTH_CHECKS; a transaction a job left open is rolled back). A batch
(batches.py) goes to a process as one job does, and is run there with one call of its handler
(`batchcall.run_batch`); what is said below of a job holds for each job of the batch. Because
each process runs one known job (or batch) at a time:

- a handler that ends its process (`os._exit`, a crash, the kernel's OOM killer) fails its own
  job only, charged once ("its process exited"), and the runner starts a new process for its
  next job: no other job is charged for it, none is sent to a process known to be gone;
- a run past its time limit (`timeout`, counted from when the process is up and has the job)
  has its process killed at the deadline and fails with JobTimeout; the runner starts a new
  process for its next job;
- a stopping worker ends the processes that still run a job (past the grace, or at a second
  stop) before it hands their jobs back, so no job runs on beside its next run elsewhere;
- the processes leave stop signals to the worker: Ctrl-C in a terminal, or a SIGTERM to the
  process group (supervisord's `stopasgroup`), reaches them too, and their jobs get the
  worker's grace like any other. On Linux each dies with the thread that started it (the
  parent-death signal), so none outlives a worker killed with SIGKILL.

Processes are spawned (not forked: the worker runs threads), started with a runner's first job.
With `--max-memory`, a process whose resident memory has passed it after a job is closed once
the job's outcome was handed over (`settle`), and the runner's next job starts a fresh one (a
leaky handler's leak goes with it); a process past the limit as soon as it is ready is kept
(`recycling.PoolLimit`: a fresh one would be too).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import math
import multiprocessing
import os
import signal
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from .. import collector
from .._compat import connection_closer
from ..api.handler import timeout_error
from ..records import Lease
from .batchcall import run_batch
from .executor import Outcome, execute, timed_out
from .recycling import PoolLimit, megabytes

log = logging.getLogger("jobqueue.worker")
STOPS = {signal.SIGINT, signal.SIGTERM}
CLOSE_WAIT = 5.0
"""Seconds an idle process gets to exit when its runner stops, before it is killed."""


class Abandoned(Exception):
    """The stopping worker ended the process that ran the job: it hands the job back, and the
    run has no outcome."""


class PoolProcess:
    """The process of one runner thread: started on its first job, started again after it
    died, ended by the worker when it stops (`end`) or by the runner when it exits (`close`)."""

    def __init__(self, limit: PoolLimit | None = None) -> None:
        """`limit`: the `--max-memory` past which the process is replaced after its job."""
        self._limit = limit
        self._held_to_limit = False
        """Whether this process is replaced when past the limit (not if it started past it)."""
        self._past: int | None = None
        """Its resident bytes after its last job, when past the limit: `settle` replaces it."""
        self._process: BaseProcess | None = None
        self._pipe: Connection | None = None
        self._busy = False
        """A job is with the process (set and read around the runner's wait for it)."""
        self._ending = False
        """The worker ended the process: the job it ran has no outcome."""

    def run(self, lease: Lease, start: Callable[[Lease], Lease] = Lease.started) -> Outcome:
        """Run a job in the process; its outcome. Abandoned when the worker ended it. `start`
        gives the lease as its run starts (`HeldJobs.start`), once the process is up: the
        process's start (Django's setup there) is not charged to the run's time limit."""
        outcome = self._exchange([lease], None, start)
        assert isinstance(outcome, Outcome)
        return outcome

    def run_batch(self, leases: list[Lease], lanes: list[str],
                  start: Callable[[Lease], Lease]) -> list[Outcome]:
        """Run a batch (one call of its handler: worker/batches.py) in the process; each
        job's outcome (the batch's time limit, the smallest, ends it as `run`'s does)."""
        answer = self._exchange(leases, lanes, start)
        return answer if isinstance(answer, list) else [answer] * len(leases)

    def _exchange(self, leases: list[Lease], lanes: list[str] | None,
                  start: Callable[[Lease], Lease]) -> Outcome | list[Outcome]:
        """Send the process a job (`lanes` None) or a batch, and wait for what it answers."""
        self._busy = True
        try:
            if self._process is None:
                problem = self._start()
                if problem is not None:
                    return Outcome(False, error=f"the worker's pool process could not start: "
                                                f"{problem}")
            assert self._pipe is not None
            if self._ending:  # (the worker stopped while the process started)
                raise Abandoned
            leases = [start(lease) for lease in leases]
            lease = min(leases, key=lambda held: held.deadline or math.inf)
            self._pipe.send(leases[0] if lanes is None else (leases, lanes))
            if lease.deadline and not self._pipe.poll(max(lease.deadline - time.monotonic(), 0)):
                return self._expired(lease)
            outcome: Outcome | list[Outcome] = self._pipe.recv()
            if self._limit is not None and self._held_to_limit and self._process is not None:
                self._past = self._limit.past(self._process.pid or 0)
            return outcome
        except (EOFError, OSError) as exc:
            return self._died(exc)
        finally:
            self._busy = False

    def end(self) -> None:
        """Kill the process if it runs (or is starting for) a job: the stopping worker hands
        the job back. A job that comes after has no outcome either."""
        self._ending = True
        process = self._process
        if self._busy and process is not None:
            process.kill()

    def settle(self) -> None:
        """After a job's outcome was handed over: close the process if its resident memory had
        passed the limit (the next job starts a fresh one)."""
        if self._past is not None and self._limit is not None:
            log.info("a pool process holds %s, past --max-memory %d MB: replacing it",
                     megabytes(self._past), self._limit.max_memory)
            self._past = None
            self.close()

    def close(self) -> None:
        """Let the process exit (killed if it does not, or runs a job); the runner stops."""
        process, pipe = self._process, self._pipe
        if process is None or pipe is None:
            return
        with contextlib.suppress(OSError):
            pipe.send(None)
        process.join(CLOSE_WAIT)
        if process.is_alive():
            process.kill()
            process.join()
        pipe.close()
        self._process = self._pipe = None

    def _start(self) -> str | None:
        """Start the process and wait until Django is set up there; why it could not start,
        if it could not."""
        context = multiprocessing.get_context("spawn")
        pipe, theirs = context.Pipe()
        process = context.Process(target=serve, name="jobqueue-pool", args=(
            theirs, os.environ.get("DJANGO_SETTINGS_MODULE"), os.getpid()))
        # Started with the stop signals blocked (the mask is inherited): until the process has
        # said it ignores them, a Ctrl-C would end it with a traceback.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)
        try:
            process.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        theirs.close()
        self._process, self._pipe = process, pipe  # (from here on, `end` can kill it)
        try:
            problem: str | None = pipe.recv()  # None once Django is set up there
        except (EOFError, OSError):
            process.join(CLOSE_WAIT)
            problem = _ended(process)
        if problem is None:
            self._held_to_limit = self._limit is not None and self._limit.holds(process.pid or 0)
            return None
        self.close()
        if self._ending:
            raise Abandoned
        log.error("a pool process could not start: %s", problem)
        return problem

    def _expired(self, lease: Lease) -> Outcome:
        """The run passed its time limit: its process is killed (the next job starts another)
        and the run fails with JobTimeout."""
        process, pipe = self._process, self._pipe
        assert process is not None and pipe is not None
        process.kill()
        process.join(CLOSE_WAIT)
        pipe.close()
        self._process = self._pipe = None
        if self._ending:  # (the stopping worker ended it first: it hands the job back)
            raise Abandoned
        log.warning("job=%s: its run passed its timeout (%g s); its process was killed",
                    lease.job_id, lease.timeout)
        return timed_out(timeout_error(lease), lease.timeout)

    def _died(self, exc: Exception) -> Outcome:
        """The process ended while it ran the job: Abandoned when the worker ended it, else
        the job's failure (a handler ended it: its job is charged, once)."""
        process, pipe = self._process, self._pipe
        if process is None or pipe is None:  # (it could not even be started: no fork, no pipe)
            log.error("a pool process could not start: %r", exc)
            return Outcome(False, error=f"the worker's pool process could not start: {exc!r}")
        process.join(CLOSE_WAIT)
        pipe.close()
        self._process = self._pipe = None
        if self._ending:
            raise Abandoned
        log.warning("a pool process ended while it ran a job (%s); starting another",
                    _ended(process))
        return Outcome(False, error=f"the job's process {_ended(process)} while it ran the job")


def _ended(process: BaseProcess) -> str:
    code = process.exitcode
    if code is None:
        return "stopped answering"
    return f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"


def serve(pipe: Connection, settings_module: str | None, parent: int) -> None:
    """A pool process: set Django up, then run each job the pipe brings until it brings None
    (or closes)."""
    for stop in STOPS:  # (a Python handler, not SIG_IGN: processes a handler starts get the
        signal.signal(stop, _ignore)  # default back when they exec)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)
    _die_with_parent(parent)
    try:
        _set_up(settings_module)
    except BaseException:  # noqa: BLE001 - said to the worker, which fails the job with it
        pipe.send(traceback.format_exc(limit=10)[-4000:])
        return
    pipe.send(None)
    close = connection_closer()
    while True:
        try:
            lease = pipe.recv()
        except EOFError:  # the worker is gone
            return
        if lease is None:
            return
        close()  # as a request starts: a kept connection past CONN_MAX_AGE, or broken, goes
        outcome = execute(lease) if isinstance(lease, Lease) else run_batch(*lease)
        close()  # as a request ends (and what the job left open is rolled back)
        pipe.send(outcome)


def _ignore(signum: int, frame: Any) -> None:
    """Stop signals are the worker's: it ends this process itself when it must."""


def _die_with_parent(parent: int) -> None:
    """SIGKILL when the thread that started this process ends (Linux's PR_SET_PDEATHSIG): a
    worker killed with SIGKILL leaves no job running here. Elsewhere a process outlives a
    killed worker until its job ends."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    if os.getppid() != parent:  # (the worker died before that call)
        os._exit(1)


def _set_up(settings_module: str | None) -> None:
    """Set Django up in a pool process and import the handlers, as the worker did."""
    import django
    from django.utils.module_loading import autodiscover_modules

    if settings_module:
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", settings_module)
    django.setup()
    autodiscover_modules("jobs")
    collector.resume()  # (a spawned process given a runworker's argv: see jobqueue.collector)
