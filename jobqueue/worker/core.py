"""The worker: claim in batches, run on runner threads, renew leases, record outcomes, mirror,
stop well. This module is its loop; each other job has a room of its own.

Threads, each with one job:
- the main loop claims work when there is room (`Worker.run`; what and where it claims, and
  how claimed jobs reach the runners, is `claims.py`'s), records what finished (`outcomes.py`:
  it is the only thread that takes outcomes off their hand-off) and runs maintenance, schedules
  and the summary when due (`maintenance.py`);
- `concurrency` runner threads run the claimed jobs (with `--processes`, each through a process
  of its own: `pool.py`), and `async def` ones run on one event loop, at most `concurrency` at
  once (`runners.py`), each handing its outcome to `outcomes.py`; the jobs of batch handlers
  are gathered and each batch run by one runner with one call of its handler (`batches.py`:
  a worker that serves such handlers holds room for their batches);
- a heartbeat renews the lease of every held job at a third of its length (`heartbeat.py`);
- a progress writer writes what handlers gave `ctx.progress`, a few times a second
  (`handler.ProgressBoard`);
- a relay thread delivers what recorded outcomes forwarded to flows' jobs on other shards or
  queues, so the main loop does not wait for it (`relaying.py`);
- one waiter per shard blocks on the shard's `wake` list while the worker has room
  (`waiters.py`: kept connections, idle offers, hand-offs, unblocking; on the event loop, a
  wait goes through `waitline.py`); a token makes the waiter claim at once (`claims.py`:
  claims take one lock, so the main loop and the waiters never both count the same room);
- the mirror moves terminal events into MySQL and resends durable jobs (`mirror_thread.py`: a
  slow database never slows claiming; `runworker` runs it in a process of its own).
What every room reads (the config, the queues served, the jobs held) is in `serving.py`;
worker presence (what the console lists) in `presence.py`. A thread of these that dies of an
error stops the worker, which says so (`threads.py`): it never goes on short of a thread.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time

from redis.exceptions import RedisError

from .. import collector
from ..api.handler import PROGRESS
from ..api.registry import largest_batch
from ..exceptions import VALKEY_DOWN, JobQueueError
from . import presence
from .batches import grown
from .claims import Claims
from .heartbeat import Heartbeat
from .maintenance import Maintenance
from .mirror_thread import MirrorThread
from .outcomes import Outcomes
from .recycling import RECYCLE_EXIT, Recycler
from .relaying import Relayer
from .runners import EventLoop, Runners
from .serving import HeldJobs, Served, WorkerConfig, find_queues
from .threads import Threads
from .waiters import Waiters

log = logging.getLogger("jobqueue.worker")
ADVERTISE_WHILE_DRAINING = 1.0
"""Seconds between the presence entries a draining worker writes (a recycle's drain may last
as long as its longest job: the console must not show it as stale)."""


def _wait_for_valkey(served: Served, claims: Claims, stop: threading.Event,
                     exc: Exception) -> None:
    """Until Valkey answers again (or a stop)."""
    log.warning("Valkey unreachable (%s); retrying", exc)
    delay = 0.1
    while not stop.is_set():
        try:
            if served.queues:
                served.queues[0].client.ping()
            claims.recover_lost()
            log.info("Valkey is back")
            return
        except VALKEY_DOWN:
            stop.wait(delay)
            delay = min(delay * 2, 5.0)


class Worker:
    """Runs jobs from some queues until asked to stop (or, in burst mode, until they are empty)."""

    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self.abandoned = 0
        self.served = Served()
        self.held = HeldJobs(config.capacity, config.concurrency)
        self.wake = threading.Event()
        """Wakes the main loop (a stop, an outcome to record)."""
        self._stop_claiming = threading.Event()
        self._threads_stop = threading.Event()
        self.relayer = Relayer(self.served, self._threads_stop)
        """Relays what its recorded outcomes forwarded, on a thread of its own."""
        self.outcomes = Outcomes(self.held, self.served, config.batch, self.wake, self.relayer)
        self.maintenance = Maintenance(config, self.served, self.held, self.outcomes)
        self.claims = Claims(config, self.served, self.held, self.outcomes,
                             stop_claiming=self._stop_claiming, threads_stop=self._threads_stop,
                             wake=self.wake)
        """What it claims and hands to its runners (and hands back)."""
        self.recycler = Recycler.of(config.max_jobs, config.max_memory, self._recycle)
        """When this process makes way for a fresh one (`--max-jobs`, `--max-memory`); None
        without them."""
        self.claims.recycler = self.recycler
        self.waiters = Waiters(config, self.held, stop_claiming=self._stop_claiming,
                               threads_stop=self._threads_stop, take=self.claims.take,
                               claim=self.claims.claim_woken, loop=self._loop,
                               spent=self.recycler.spent if self.recycler else None)
        self.claims.fell_busy = self.waiters.withdraw_offers
        self.claims.spent = lambda: self.waiters.unblock(every=True)
        self._stop_asked = False
        self._grace_ends: float | None = None
        """When running jobs must have finished: `--grace` after the first stop; None before
        one (a recycle's drain waits for its running jobs however long they take)."""
        self._abort = threading.Event()
        self._threads = Threads(stop=self._stop_claiming, wake=self.wake)
        self.runners: Runners | None = None
        """The runner threads (and event loop) that run the claimed jobs, once started."""
        self._mirror: MirrorThread | None = None
        self.unmirrored = False
        """A burst's mirror gave up its final pass (its own thread's, or the mirror process's
        that runs it: runworker sets it then): events it ran wait in Valkey."""
        self._batches = False
        """Whether it serves batch handlers (`_fit_batches`)."""

    @property
    def processed(self) -> int:
        return self.outcomes.processed

    @property
    def failed(self) -> int:
        return self.outcomes.failed

    @property
    def recycle_reason(self) -> str | None:
        """Why this worker stopped to make way for a fresh process (None: it did not)."""
        return self.recycler.reason if self.recycler is not None else None

    @property
    def exit_code(self) -> int:
        """The exit code its process ends with: RECYCLE_EXIT when it recycled, 1 when its burst
        ran jobs its mirror could not record (`unmirrored`), else 0."""
        return RECYCLE_EXIT if self.recycle_reason else 1 if self.unmirrored else 0

    def _loop(self) -> EventLoop | None:
        return self.runners.loop if self.runners else None

    # -- control ---------------------------------------------------------------------------

    def request_stop(self) -> None:
        """First call: stop claiming and let running jobs finish. Second: release them now."""
        # (a recycle stops claiming too, but a signal during its drain is still the first)
        if self._stop_asked if self.recycle_reason else self._stop_claiming.is_set():
            log.warning("second stop request: releasing running jobs now")
            self._abort.set()
        else:
            log.info("stop requested: finishing running jobs (grace %.0fs)", self.config.grace)
        self._stop_asked = True
        if self._grace_ends is None:  # (a recycle's drain has none until a stop arrives)
            self._grace_ends = time.monotonic() + self.config.grace
        self._stop_claiming.set()
        self.wake.set()

    def _recycle(self, reason: str, why: str) -> None:
        """The recycler found this worker due (under the claim lock, on any thread): stop
        claiming and drain, with no deadline (a job cut short would go back uncharged, and a
        job that takes every process past `--max-memory` would never end); a stop during the
        drain gives the jobs `--grace` from then. `runworker` then exits RECYCLE_EXIT."""
        log.info("worker %s recycled (%s): handing back prefetched jobs, finishing running "
                 "ones; a fresh process takes its place", self.config.name, why)
        self._stop_claiming.set()
        self.wake.set()

    def run(self) -> None:
        """The main loop; returns when stopped (or when a burst run has nothing left). Raises
        JobQueueError when a thread of the worker died, which stopped it."""
        if not self._start():
            return
        try:
            while not self._stop_claiming.is_set():
                self.wake.clear()
                try:
                    busy = self.turn()
                except VALKEY_DOWN as exc:
                    _wait_for_valkey(self.served, self.claims, self._stop_claiming, exc)
                    continue
                except RedisError:  # e.g. OOM or a failover: the next turn may succeed
                    log.exception("Valkey refused a command; retrying in 1 s")
                    self._stop_claiming.wait(1.0)
                    continue
                if busy:
                    continue
                if self.config.burst and self._burst_done():
                    break
                if self.outcomes.empty():  # (a success queued unannounced: record it now)
                    self.wake.wait(self._idle_wait())
            self._drain()
        finally:
            self._stop_threads()
        if self._threads.broken is not None:
            raise JobQueueError(f"worker {self.config.name} stopped: its thread "
                                f"{self._threads.broken} died (the log above says of what)")

    # -- starting ----------------------------------------------------------------------------

    def _start(self) -> bool:
        """Find the queues and start the threads; False when stopped before Valkey answered."""
        from django.utils.module_loading import autodiscover_modules

        autodiscover_modules("jobs")
        collector.settle()  # (before waiting for Valkey, which may take long)
        found = find_queues(self.config, self._stop_claiming)
        if found is None:
            log.info("worker %s stopped before Valkey answered", self.config.name)
            return False
        for queue, shards in found:
            self.served.add(queue, shards)
        self._fit_batches()
        self.start_runners()
        self.held.room.set()
        heartbeat = Heartbeat(self.held, self.served.queue, self._threads_stop,
                              default_lease=self.config.lease or 30.0)
        self._threads.start(heartbeat.run, "heartbeat")
        self._threads.start(PROGRESS.run, "progress", self._threads_stop)
        self._threads.start(self.relayer.run, "relay")
        if self.config.mirror:
            self._mirror = MirrorThread(lambda: list(self.served.queues), self.config.name,
                                        self._threads_stop)
            self._threads.start(self._mirror.run, "mirror")
        self._ensure_waiters()
        log.info("worker %s serving %s with concurrency %d%s", self.config.name,
                 ",".join(q.name for q in self.served.queues) or "(no queues yet)",
                 self.config.concurrency, " (burst)" if self.config.burst else "")
        return True

    def _fit_batches(self) -> None:
        """Gather the jobs of batch handlers if the project has any (a job may be enqueued on
        another queue than its handler's), and hold room for the batches of those registered
        on the queues it serves (batches.py); a worker of a project without one stays as
        configured, its runners as they are."""
        self._batches = largest_batch() > 0
        most = largest_batch(queue.name for queue in self.served.queues)
        if not most:
            return
        self.config = grown(self.config, most)
        self.held.capacity = self.config.capacity
        self.claims.resize(self.config)
        self.outcomes.resize(self.config.batch)

    def start_runners(self) -> None:
        """Start the runners (`run` does, once it found its queues; a test that drives
        `turn()` itself calls it). At concurrency 1 a runner claims the next job itself."""
        done = self.claims.finished_one if self.config.concurrency == 1 else self.outcomes.finished
        self.runners = Runners(self.config.concurrency, done, processes=self.config.processes,
                               held=self.held, max_memory=self.config.max_memory,
                               queue=self.served.queue,
                               batches=self.outcomes.finished_many if self._batches else None)
        self.claims.runners = self.runners

    def _ensure_waiters(self) -> None:
        for queue, index in self.waiters.missing(self.served.queues, self.served.shards):
            self._threads.start(self.waiters.serve, f"wake-{queue.name}#{index}", queue, index)

    # -- the loop ----------------------------------------------------------------------------

    def turn(self) -> bool:
        """One turn of the main loop (`run` makes them; a test may drive them itself): failures
        recorded, maintenance when due, then per queue one call that records the successes and
        claims the next batch. True if it claimed work."""
        successes = self.outcomes.record(defer_acks=True)
        try:
            if self.maintenance.run_due():
                self._ensure_waiters()
        finally:
            claimed = self.claims.claim(successes)
        if self.held.idle and self.waiters.plain_waiting:
            self.waiters.unblock()
        return claimed > 0

    def _idle_wait(self) -> float:
        """Until maintenance, the next scheduled job, a schedule's next tick, a rate limit's
        next token, or the acks held for a claim."""
        now = time.monotonic()
        wait = self.maintenance.next_wake()
        refill = self.claims.next_refill(now)
        if refill is not None:
            wait = min(wait, max(refill - now, 0.001))
        ack_due = self.outcomes.ack_due()
        if ack_due is not None:
            wait = min(wait, max(ack_due - now, 0.0005))
        return wait

    def _burst_done(self) -> bool:
        """Nothing held or unrecorded here, and nothing left to do in the queues."""
        if self.held.jobs or self.outcomes.unrecorded():
            return False
        return self.maintenance.nothing_left()

    # -- stopping ----------------------------------------------------------------------------

    def _drain(self) -> None:
        """Hand back prefetched jobs at once, let running jobs finish within the grace period,
        then end what still runs where it can (`Runners.abandon`) and release it."""
        with contextlib.suppress(RedisError):  # (Valkey down: their leases will lapse instead)
            self.waiters.unblock(every=True)  # (a job handed over meanwhile goes back)
            self.claims.recover_lost()  # (and those of a claim whose reply was lost)
        unstarted = self.runners.take_unstarted() if self.runners else []
        try:
            self.claims.release(unstarted)
        except RedisError:
            log.warning("could not release prefetched jobs: their leases will expire instead")
        # (a call that fails gives back what it did not record: the next try records it)
        with contextlib.suppress(RedisError):
            self.claims.claim()  # stopping: records the successes that waited for a claim
        if self._grace_ends is None and not self.recycle_reason:  # (a thread died, a burst ended)
            self._grace_ends = time.monotonic() + self.config.grace
        advertised = time.monotonic()
        while self.held.jobs and not self._abort.is_set() and self._in_grace():
            self.wake.clear()
            with contextlib.suppress(RedisError):
                self.outcomes.record()
                if time.monotonic() - advertised >= ADVERTISE_WHILE_DRAINING:
                    advertised = time.monotonic()  # (a long drain is no silent worker)
                    self.maintenance.advertise()
            self.wake.wait(0.1)
        if self.held.jobs and self.runners is not None:
            self.runners.abandon()  # (ended before they are handed back: none runs on)
        try:
            self.outcomes.record()
            leftovers = self.held.leases()
            self.claims.release(leftovers)
            self.abandoned = len(leftovers)
        except RedisError:
            log.warning("could not release running jobs: their leases will expire instead")
        with contextlib.suppress(RedisError):  # (else they lapse with the leases)
            for queue in self.served.queues:
                queue.leases.give_back()  # a global cap's permits, to the other workers

    def _in_grace(self) -> bool:
        """Whether running jobs may still finish: until `--grace` after a stop (a recycle's
        drain has no deadline until one arrives, or a thread of the worker dies: without its
        heartbeat, say, it must not wait on)."""
        if self._grace_ends is None and self._threads.broken is not None:
            self._grace_ends = time.monotonic() + self.config.grace
        ends = self._grace_ends
        return ends is None or time.monotonic() < ends

    def _stop_threads(self) -> None:
        self._threads_stop.set()
        self.held.wake()
        PROGRESS.wake()
        self.relayer.wake()
        deadline = time.monotonic() + 15
        for thread in self._threads.started:
            while thread.is_alive() and time.monotonic() < deadline:
                with contextlib.suppress(RedisError):  # (again: a wait that began after the last)
                    self.waiters.unblock(every=True)
                thread.join(timeout=0.2)
        if self._mirror is not None and not self._mirror.final_pass(
                insist=self.config.burst, abort=self._abort, limit=self.config.grace):
            self.unmirrored = True
        if self.runners is not None:
            # (an overrunning run's thread may never return: the process's exit ends it)
            self.runners.stop(wait=not self.abandoned and not self.held.overrunning)
        if self.served.queues:
            with contextlib.suppress(*VALKEY_DOWN):
                if self.recycle_reason:  # (stopped meanwhile: no fresh process takes its name)
                    presence.recycled(self.served.queues[0].client, self.config.name,
                                      self.recycle_reason, final=self._stop_asked)
                else:
                    presence.goodbye(self.served.queues[0].client, self.config.name)
        log.info("worker %s stopped: processed=%d failed=%d released=%d", self.config.name,
                 self.processed, self.failed, self.abandoned)

