"""The worker: claim in batches, run on runner threads, renew leases, record outcomes, mirror,
stop well.

Threads, each with one job:
- the main loop claims work when there is room and records finished jobs (acks in one script
  call per shard, nacks one by one) — it is the only thread that records outcomes;
- `concurrency` runner threads run the claimed jobs (`runners.py`);
- a heartbeat renews the lease of every running job at a third of its length (`heartbeat.py`);
- one waiter per shard blocks on the shard's `wake` list while the worker has room, so an idle
  worker sleeps in BLPOP instead of polling; a token makes the waiter claim at once (claims
  take one lock, so the main loop and the waiters never both count the same room; on the event
  loop, a wait goes through `waitline.py`);
- the mirror moves terminal events into MySQL and relays durable jobs (`mirror_thread.py`: a
  slow database never slows claiming).
Worker presence (what the console lists) lives in `presence.py`.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import socket
import ssl
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from queue import Empty, SimpleQueue
from typing import Any

from django.db import DatabaseError
from redis.cluster import RedisCluster
from redis.exceptions import AuthenticationError, RedisError, ResponseError
from redis.exceptions import ConnectionError as ValkeyConnectionError

from .. import autoscale, backlog, layouts, outbox, schedule, signals, spec, wire
from ..conf import get_client, get_config
from ..exceptions import ConfigurationError
from ..records import Lease
from ..states import State
from ..store import READ_SLACK, Queue, known_queues
from . import presence
from .executor import Outcome
from .heartbeat import Heartbeat, Held
from .mirror_thread import VALKEY_DOWN, MirrorThread, close_db
from .runners import Runners
from .waitline import WaitLine

log = logging.getLogger("jobqueue.worker")
DRAINED = 0.05
"""Seconds a queue whose claim came back short is not asked again, unless a wake token for it
arrives first: a busy worker serving many queues then does not make a round trip per idle
queue per claim (an enqueue wakes an idle worker at once through its shard's wake list)."""
SETTLE_EVERY = 2.0
"""Seconds between checks of a settling resize (one worker per queue does it)."""
GC_GEN0 = 10_000
"""The worker's threshold for collecting its youngest objects (CPython 3.12 starts at 700)."""
IDLE_WAIT = 5
"""Seconds a waiter blocks on its kept connection (and an idle worker's offer lasts): an enqueue's
token or hand-off ends the wait at once, and the worker unblocks it when it stops (or falls
idle, for a wait without an offer). The main loop's claims each maintenance turn catch anything
a token did not announce."""
ACK_WAIT = 0.005
"""Seconds finished jobs may wait for the next claim to carry their acks: a busy worker whose
jobs finish one by one then records them in batches, not a script call each."""


@dataclass(frozen=True)
class WorkerConfig:
    """How one worker runs; `manage.py runworker` builds it from its options."""

    queues: tuple[str, ...] = ()
    """Queues to serve; empty: every known queue."""
    concurrency: int = 4
    prefetch: int | None = None
    """Jobs claimed beyond those running (default: as many as `concurrency`); they wait in the
    pool's queue with their leases renewed, so claims and acks travel in batches."""
    burst: bool = False
    lease: float | None = None
    """Overrides the job's and the queue's lease when set."""
    name: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")
    processes: bool = False
    grace: float = 30.0
    maintenance_every: float = 1.0
    summary_every: float = 30.0
    mirror: bool = True

    def __post_init__(self) -> None:
        spec.whole_number(self.concurrency, "concurrency", 1)
        if self.prefetch is not None:
            spec.whole_number(self.prefetch, "prefetch", 0)
        if self.lease is not None:
            spec.validate_lease(self.lease)
        spec.seconds(self.grace, "grace", low=0, high=86_400)

    @property
    def capacity(self) -> int:
        """How many claimed jobs the worker holds at most (running plus prefetched)."""
        return self.concurrency + (self.concurrency if self.prefetch is None else self.prefetch)


def _settle_gc() -> None:
    """Once the handlers' modules are loaded: hide what start-up made (Django, the app, ~70k
    objects) from the cyclic collector, and run its youngest pass less often. A job makes and
    frees dozens of objects (tasks, futures, replies): at CPython's defaults a no-op job spent
    ~8 % of its time in collections, most of it in full passes over start-up's objects, each a
    pause of ~20 ms. An application that set a higher threshold keeps its own."""
    gc.collect()
    gc.freeze()
    gen0, *older = gc.get_threshold()
    if 0 < gen0 < GC_GEN0:  # (0: the application turned collection off)
        gc.set_threshold(GC_GEN0, *older)


@dataclass
class _Lines:
    """One wake waiter's own connections (see `Worker._wait_for_wake`)."""

    plain: bool
    """A burst run: plain BLPOPs on the client, nothing kept."""
    hand_off: bool = True
    """Whether the worker, idle, offers itself for hand-offs (not for a queue with a
    `concurrency` cap or a rate limit: only the claim script enforces those)."""
    offered: bool = False
    """Whether it ever did (it withdraws the offer when it stops)."""
    node: Any = None
    """The client of the server holding the shard (the standalone client itself, or a cluster
    node's), found at the first wait and again after an error (a failover moves a shard)."""
    conn: Any = None
    """A connection of `node`'s, kept for the waits."""
    conn_id: int | None = None
    """Its id on the server, once asked (a wait registers it, to be unblocked)."""
    line: WaitLine | bool | None = None
    """Its connection for the waits on the event loop, once opened; False when there can be
    none."""


class Worker:
    """Runs jobs from some queues until asked to stop (or, in burst mode, until they are empty)."""

    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self.queues: list[Queue] = []
        self.shard_totals: dict[str, int] = {}
        self.abandoned = 0
        self.processed = 0
        self.failed = 0
        self._running: dict[str, Held] = {}
        self._held: Counter[str] = Counter()
        """Jobs held per queue (what `concurrency` caps)."""
        self._drained_until: dict[str, float] = {}
        self._advertised = (time.monotonic(), 0)
        """(when, jobs done) at the last advertisement: the rate the console shows."""
        """Queues whose last claim came back short, not asked again until then (or a wake)."""
        self._lock = threading.Lock()
        self._claim_lock = threading.Lock()
        self._finished: SimpleQueue[tuple[Lease, Outcome]] = SimpleQueue()
        self._unrecorded: list[tuple[Lease, Outcome]] = []
        self._acks_waiting: list[tuple[Lease, Outcome]] = []
        """Successes waiting (ACK_WAIT at most) for a claim to carry them."""
        self._acks_since = 0.0
        self._batch = max(1, config.capacity // 4)
        """Room a claim waits for (one claim serves many jobs), and successes that make an ack
        call of their own."""
        self._tick = threading.Event()
        self._room = threading.Event()
        self._stop_claiming = threading.Event()
        self._abort = threading.Event()
        self._threads_stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._waiting_on: set[tuple[str, int]] = set()
        self._plain_waits: dict[tuple[str, int], tuple[Any, int]] = {}
        """Waiters blocked without an offer (queue, shard -> the client of the server they wait
        on, and their connection's id there)."""
        self._quiet_waits: dict[tuple[str, int], tuple[Any, int]] = {}
        """Other waiters blocked on a kept connection (only a token or a stop ends their wait
        early): with an offer, or of a queue that never offers (see `_wait_for_wake`)."""
        self._refused_said = False
        """Whether the worker said that the server takes no offer (see `_past_offer`)."""
        self._next_maintenance = 0.0
        self._next_fire = 0.0
        self._next_summary = time.monotonic() + config.summary_every
        self._summarised = 0
        self._next_due: float | None = None
        self._runners: Runners | None = None
        self._mirror: MirrorThread | None = None
        self._rotation = 0

    # -- control ---------------------------------------------------------------------------

    def request_stop(self) -> None:
        """First call: stop claiming and let running jobs finish. Second: release them now."""
        if self._stop_claiming.is_set():
            log.warning("second stop request: releasing running jobs now")
            self._abort.set()
        else:
            log.info("stop requested: finishing running jobs (grace %.0fs)", self.config.grace)
        self._stop_claiming.set()
        self._tick.set()

    def run(self) -> None:
        """The main loop; returns when stopped (or when a burst run has nothing left)."""
        if not self._start():
            return
        try:
            while not self._stop_claiming.is_set():
                self._tick.clear()
                try:
                    busy = self._cycle()
                except VALKEY_DOWN as exc:
                    self._wait_for_valkey(exc)
                    continue
                except RedisError:  # e.g. OOM or a failover: the next turn may succeed
                    log.exception("Valkey refused a command; retrying in 1 s")
                    self._stop_claiming.wait(1.0)
                    continue
                if busy:
                    continue
                if self.config.burst and self._burst_done():
                    break
                if self._finished.empty():  # (a success queued unannounced: record it now)
                    self._tick.wait(self._idle_wait())
            self._drain()
        finally:
            self._stop_threads()

    # -- the loop --------------------------------------------------------------------------

    def _start(self) -> bool:
        """Find the queues and start the threads; False when stopped before Valkey answered."""
        from django.utils.module_loading import autodiscover_modules

        autodiscover_modules("jobs")
        delay = 0.1
        while True:  # a worker may start before Valkey does: wait for it, as after a restart
            try:
                names = self.config.queues or tuple(known_queues())
                queues = [Queue(name) for name in names]
                self.shard_totals = {q.name: q.claim_shards() for q in queues}
                self.queues = queues
                break
            except AuthenticationError as exc:  # waiting would not help: say so and stop
                raise ConfigurationError(f"Valkey refused the credentials in the URL: {exc}") from None
            except VALKEY_DOWN as exc:
                if isinstance(exc.__context__, ssl.SSLCertVerificationError):
                    raise ConfigurationError(
                        f"Valkey's TLS certificate is not trusted (name the CA file in the URL: "
                        f"?ssl_ca_certs=/path/ca.pem): {exc}") from None
                log.warning("Valkey unreachable at start (%s); retrying", exc)
                if self._stop_claiming.wait(delay):
                    log.info("worker %s stopped before Valkey answered", self.config.name)
                    return False
                delay = min(delay * 2, 5.0)
        _settle_gc()
        self._runners = Runners(self.config.concurrency, self._finished_one,
                                processes=self.config.processes)
        self._room.set()
        heartbeat = Heartbeat(self._running, self._lock, self._queue, self._threads_stop,
                              default_lease=self.config.lease or 30.0)
        self._spawn(heartbeat.run, "heartbeat")
        if self.config.mirror:
            self._mirror = MirrorThread(lambda: list(self.queues), self.config.name,
                                        self._threads_stop)
            self._spawn(self._mirror.run, "mirror")
        self._ensure_waiters()
        log.info("worker %s serving %s with concurrency %d%s", self.config.name,
                 ",".join(names) or "(no queues yet)", self.config.concurrency,
                 " (burst)" if self.config.burst else "")
        return True

    def _cycle(self) -> bool:
        """One turn: failures recorded, maintenance when due, then per queue one call that
        records the successes and claims the next batch. True if it claimed work."""
        successes = self._record(defer_acks=True)
        try:
            now = time.monotonic()
            if now >= self._next_maintenance:
                self._maintain()
                self._next_maintenance = now + self.config.maintenance_every
            if now >= self._next_fire:
                self._fire_schedule()
            if now >= self._next_summary:
                self._summary()
                self._next_summary = now + self.config.summary_every
        finally:
            claimed = self._claim(successes)
        if not self._running and self._plain_waits:
            self._unblock_waiters()
        return claimed > 0

    def _claim(self, successes: list[tuple[Lease, Outcome]] | None = None,
               woken: tuple[Queue, int] | None = None) -> int:
        """Record `successes` and claim what there is room for (the main loop, or a wake waiter
        that just got a token: one lock, so their counts of room never race). A waiter passes
        the queue and shard its token came from: the claim asks only there."""
        with self._claim_lock:
            since = self._acks_since if self._acks_waiting else time.monotonic()
            successes = self._acks_waiting + (successes or [])
            self._acks_waiting = []
            try:
                return self._claim_locked(successes, since, woken)
            except VALKEY_DOWN:
                self._unrecorded = successes + self._unrecorded  # acked once Valkey is back
                raise

    def _claim_locked(self, successes: list[tuple[Lease, Outcome]], since: float,
                      woken: tuple[Queue, int] | None) -> int:
        room, batch = self.config.capacity - len(self._running), self._batch
        by_queue: dict[str, list[tuple[Lease, Outcome]]] = defaultdict(list)
        for lease, outcome in successes:
            by_queue[lease.queue].append((lease, outcome))
        if (self._stop_claiming.is_set() or not self.queues or room <= 0
                or (self._running and room < batch)):
            # Nothing to claim (a batch's worth must be free: one claim serves many jobs). The
            # successes wait a moment for that claim, unless they make a batch of their own.
            if (successes and len(successes) < batch and not self._stop_claiming.is_set()
                    and time.monotonic() - since < ACK_WAIT):
                self._acks_waiting, self._acks_since = successes, since
                return 0
            for name, items in by_queue.items():
                self._ack(self._queue(name), items)
            return 0
        claimed = 0
        now = time.monotonic()
        if woken is None:
            self._rotation = (self._rotation + 1) % len(self.queues)  # no queue always goes first
            order = self.queues[self._rotation:] + self.queues[: self._rotation]
        else:  # (the main loop serves the others: a token must not cost a round trip per queue)
            order = [woken[0]]
        for queue in order:
            items = by_queue.pop(queue.name, [])
            # A queue's `concurrency` caps the jobs of that queue this worker holds at once, so a
            # busy queue cannot take every slot from the others (Pacer's isolation).
            limit = queue.options.concurrency or self.config.capacity
            take = min(room - claimed, limit - self._held[queue.name])
            if take <= 0 or now < self._drained_until.get(queue.name, 0.0):
                if items:
                    self._ack(queue, items)
                continue
            answers, leases = queue.ack_and_dequeue(
                [(lease, outcome.result) for lease, outcome in items],
                count=take, lease=self.config.lease, worker=self.config.name,
                override_lease=self.config.lease is not None,
                shards=self.shard_totals[queue.name], only=woken[1] if woken else None,
            )
            self._acked(items, answers)
            if queue.rate_wait:  # its rate limit holds the rest back: serve the others meanwhile
                self._drained_until[queue.name] = now + queue.rate_wait
            elif len(leases) < take:  # drained: skip the queue a moment (see DRAINED; after a
                # waiter's claim of one shard too: work on the others wakes their own waiters)
                self._drained_until[queue.name] = now + DRAINED
            self._submit(leases)
            claimed += len(leases)
        for name, items in by_queue.items():  # a queue no longer served
            self._ack(self._queue(name), items)
        return claimed

    def _submit(self, leases: list[Lease]) -> None:
        assert self._runners is not None
        with self._lock:
            for lease in leases:
                self._running[lease.job_id] = Held(lease)
                self._held[lease.queue] += 1
            if len(self._running) >= self.config.capacity:
                self._room.clear()
        self._runners.submit(leases)

    def _finished_one(self, lease: Lease, outcome: Outcome) -> None:
        """Called by a runner thread: queue the outcome for the main loop to record. The loop
        is woken for a failure, for the first success (its ACK_WAIT starts) and for a batch's
        worth, not for every job: between those it would only wait again."""
        self._finished.put((lease, outcome))
        waiting = self._finished.qsize() + len(self._acks_waiting)
        if (not outcome.ok or waiting <= 1 or waiting >= self._batch) and not self._tick.is_set():
            self._tick.set()  # (set already: the loop has yet to clear it, and will look then)

    def _record(self, defer_acks: bool = False) -> list[tuple[Lease, Outcome]]:
        """Turn finished runs into transitions: failures one by one, successes in one ack call
        per queue, or, with `defer_acks`, handed back for the next claim to carry. The jobs are
        forgotten either way: their slots are free for that claim."""
        while True:
            try:
                self._unrecorded.append(self._finished.get_nowait())
            except Empty:
                break
        if not self._unrecorded:
            return []
        pending, self._unrecorded = self._unrecorded, []
        successes = [(lease, out) for lease, out in pending if out.ok]
        recorded: set[str] = set()
        try:
            for lease, out in pending:
                if not out.ok:
                    state = self._queue(lease.queue).nack(lease, out.error, out.retry_in,
                                                          fatal=out.fatal)
                    self._log(lease, out, state or "stale")
                    self._forget_one(lease)
                    recorded.add(lease.job_id)
            if not defer_acks:
                by_queue: dict[str, list[tuple[Lease, Outcome]]] = defaultdict(list)
                for lease, out in successes:
                    by_queue[lease.queue].append((lease, out))
                for name, items in by_queue.items():
                    self._ack(self._queue(name), items)
                    recorded.update(lease.job_id for lease, _ in items)
                return []
        except VALKEY_DOWN:  # what was not recorded yet is, once Valkey is back
            self._unrecorded = [item for item in pending
                                if item[0].job_id not in recorded] + self._unrecorded
            raise
        with self._lock:
            for lease, _ in successes:
                self._forget(lease)
            self._room.set()
        return successes

    def _ack(self, queue: Queue, items: list[tuple[Lease, Outcome]]) -> None:
        self._acked(items, queue.ack_encoded([(lease, out.result) for lease, out in items]))

    def _acked(self, items: list[tuple[Lease, Outcome]], answers: list[bool]) -> None:
        """Log recorded successes and forget their jobs."""
        for (lease, out), recorded in zip(items, answers, strict=True):
            self._log(lease, out, State.SUCCEEDED if recorded else "stale")
        with self._lock:  # (most were forgotten already: their slots went to the claim)
            for lease, _ in items:
                self._forget(lease)
            self._room.set()

    def _forget_one(self, lease: Lease) -> None:
        with self._lock:
            self._forget(lease)
            self._room.set()

    def _log(self, lease: Lease, outcome: Outcome, state: str) -> None:
        """Count, log and signal a recorded outcome."""
        if outcome.ok:
            self.processed += 1
        else:
            self.failed += 1
        signals.send(signals.job_finished, Queue, lease=lease, state=str(state),
                     duration=outcome.duration)
        # A line per success would cost more than a short job: successes are logged at DEBUG
        # (the summary line counts them), failures always.
        if outcome.ok:
            level = logging.DEBUG
        else:
            level = logging.INFO if state in (State.SCHEDULED, State.PENDING) else logging.WARNING
        if log.isEnabledFor(level):
            reason = "" if outcome.ok else " error=" + json.dumps(outcome.error.strip().splitlines()[-1:])
            log.log(level, "queue=%s job=%s attempt=%d duration=%.3fs outcome=%s%s", lease.queue,
                    lease.job_id, lease.token, outcome.duration, state, reason)

    def _forget(self, lease: Lease) -> None:
        """Drop a job this worker no longer holds (call with the lock held)."""
        if self._running.pop(lease.job_id, None) is not None:
            self._held[lease.queue] -= 1

    def _queue(self, name: str) -> Queue:
        return next(q for q in self.queues if q.name == name)

    # -- maintenance, waiting, summary -------------------------------------------------------

    def _maintain(self) -> None:
        """promote + reap on every shard (idempotent, cheap), and advertise this worker."""
        if not self.config.queues:  # serving every known queue: pick up queues created since
            for name in known_queues(self.queues[0].client if self.queues else None):
                if name not in self.shard_totals:
                    self.queues.append(Queue(name))
                    self.shard_totals[name] = self.queues[-1].claim_shards()
                    log.info("serving new queue %s", name)
        next_due: float | None = None
        for queue in self.queues:
            self._settle(queue)
            if queue.options.auto_shards and not self.config.burst:
                resized = autoscale.check(queue, get_config().auto_shards)
                if resized:
                    log.info("queue %s: %d → %d shards (automatic)", queue.name, *resized)
            self.shard_totals[queue.name] = queue.claim_shards()
            for index in range(self.shard_totals[queue.name]):
                _, wait = queue.promote_shard(index)
                if wait is not None:
                    next_due = wait if next_due is None else min(next_due, wait)
            queue.reap(shards=self.shard_totals[queue.name])
        self._next_due = None if next_due is None else time.monotonic() + next_due
        self._ensure_waiters()
        self._advertise()

    def _fire_schedule(self) -> None:
        """Enqueue the schedules' due ticks, and wake again just after the next one: an
        every-second entry must not lose a tick to a maintenance turn that ran late."""
        entries = get_config().schedule
        if not entries or self.config.burst:  # a --burst run drains; it does not start work
            self._next_fire = float("inf")
            return
        schedule.fire_due(entries, get_client())
        now = datetime.now(UTC)
        ticks = [tick for entry in entries.values() if (tick := entry.next_tick(now)) is not None]
        until = min(((tick - now).total_seconds() + 0.002 for tick in ticks),
                    default=self.config.maintenance_every)
        self._next_fire = time.monotonic() + min(until, self.config.maintenance_every)

    def _settle(self, queue: Queue) -> None:
        """While a resize settles, one worker every few seconds checks whether it is done."""
        layout = queue.layout()
        if not layout.settling or not layouts.one_turn(queue.client, layouts.SETTLE_TURN + queue.name,
                                                        SETTLE_EVERY):
            return
        done = queue.settle()
        if done is not None:
            retired = range(done.live, layout.span)
            log.info("queue %s: resize settled at %d shard(s)%s", queue.name, done.live,
                     f"; retired shard(s) {', '.join(map(str, retired))}" if retired else "")

    def _advertise(self) -> None:
        if not self.queues:
            return
        with self._lock:
            held = [[h.lease.queue, job_id] for job_id, h in list(self._running.items())[:20]]
        now = time.monotonic()
        done = self.processed + self.failed
        last_at, last_done = self._advertised
        rate = (done - last_done) / (now - last_at) if now > last_at else 0.0
        self._advertised = (now, done)
        presence.advertise(self.queues[0].client, self.config.name, {
            "pid": os.getpid(), "host": socket.gethostname(), "queues": [q.name for q in self.queues],
            "running": len(self._running), "concurrency": self.config.concurrency,
            "processed": self.processed, "failed": self.failed, "rate": round(rate, 1),
            "jobs": held})

    def _idle_wait(self) -> float:
        """Until maintenance, the next scheduled job, a schedule's next tick, or a rate limit's
        next token."""
        now = time.monotonic()
        wait = min(self.config.maintenance_every, max(self._next_fire - now, 0.001))
        if self._next_due is not None:
            wait = min(wait, max(self._next_due - now, 0.001))
        refills = [until for q in self.queues if q.rate_wait
                   and (until := self._drained_until.get(q.name, 0.0)) > now]
        if refills:
            wait = min(wait, max(min(refills) - now, 0.001))
        if self._acks_waiting:
            wait = min(wait, max(self._acks_since + ACK_WAIT - now, 0.0005))
        return wait

    def _ensure_waiters(self) -> None:
        for queue in self.queues:
            for index in range(self.shard_totals[queue.name]):
                if (queue.name, index) not in self._waiting_on:
                    self._waiting_on.add((queue.name, index))
                    self._spawn(self._wait_for_wake, f"wake-{queue.name}#{index}", queue, index)

    def _wait_for_wake(self, queue: Queue, index: int) -> None:
        """Block on one shard's wake list while there is room; a token means work: claim it.

        An idle worker first offers itself for hand-offs, on a connection this thread keeps
        (`Queue.wait_commands`): an enqueue that finds nothing else ready on the shard leases
        the job to it and pushes it onto the worker's own list, which the same BLPOP watches,
        so the job arrives leased, with no claim call between. Once the worker has an event
        loop (it ran an `async def` handler), that wait runs on the loop, so an async job
        starts on the thread that received it. A busy worker waits without an offer (a job
        handed over then would wait for room), and claims what it has room for when a token
        comes; when it falls idle, the main loop unblocks that wait (`_unblock_waiters`) so the
        next wait makes the offer. A queue with a `concurrency` cap or a rate limit never
        offers. On a cluster the kept connection is to the node that holds the shard, found
        again after an error (a failover moves the shard); a burst run waits the plain way
        (1 s BLPOPs on the client). On a kept connection a wait lasts up to IDLE_WAIT: a token,
        a hand-off, a stop or the worker falling idle ends it sooner (`_unblock_waiters`)."""
        options = queue.options
        lines = _Lines(self.config.burst, hand_off=not options.claim_only)
        try:
            while not (self._stop_claiming.is_set() or self._threads_stop.is_set()):
                if not self._room.wait(0.5):
                    continue
                try:
                    woken = self._wait_once(queue, index, lines)
                    if woken:
                        # Claim here rather than wake the main loop to do it: an enqueue reaches
                        # a worker's runner in one hop.
                        self._drained_until.pop(queue.name, None)
                        self._claim(woken=(queue, index))
                except RedisError as exc:
                    log.debug("wait on %s shard %d: %r", queue.name, index, exc)
                    self._drop_lines(lines)  # (taken anew: on a cluster, maybe on another node)
                    self._threads_stop.wait(1.0)
        finally:
            if lines.offered:
                try:
                    self._release(queue.withdraw(index, self.config.name))
                except RedisError:
                    log.warning("could not withdraw the idle offer on %s: a job handed over "
                                "meanwhile waits for its lease to expire", queue.name)
            self._drop_lines(lines)

    @staticmethod
    def _node(queue: Queue, index: int) -> Any:
        """The client of the server that holds a shard: a cluster node's, or the client."""
        client = queue.client
        if not isinstance(client, RedisCluster):
            return client
        node = client.get_node_from_key(queue.shard(index).key("wake"))
        if node is None:
            raise ValkeyConnectionError(f"no cluster node serves {queue.name}'s shard {index}")
        return client.get_redis_connection(node)

    def _drop_lines(self, lines: _Lines) -> None:
        """Give a waiter's connections back (after an error: taken anew at the next wait)."""
        if lines.conn is not None:
            lines.node.connection_pool.release(lines.conn)
        lines.conn, lines.conn_id = None, None
        line, loop = lines.line, self._runners.loop if self._runners else None
        if isinstance(line, WaitLine):
            lines.line = None
            if loop is not None:
                with contextlib.suppress(RuntimeError):  # (the loop closed already)
                    loop.call_soon(line.close)

    def _wait_once(self, queue: Queue, index: int, lines: _Lines) -> bool:
        """One wait on a shard, in the form `_wait_for_wake` says; a job handed over is taken
        here. True when a token came and the caller should claim."""
        if lines.plain:
            return bool(queue.client.blpop([queue.shard(index).key("wake")], timeout=1))
        if lines.conn is None:
            lines.node = self._node(queue, index)
            lines.conn = lines.node.connection_pool.get_connection()
        if lines.conn_id is None:
            lines.conn_id = wire.call_on(lines.conn, [("CLIENT", "ID")])[0]
        idle = lines.hand_off and not self._running
        commands = queue.wait_commands(index, IDLE_WAIT, self.config.name, idle=idle,
                                       lease=self.config.lease,
                                       override_lease=self.config.lease is not None)
        lines.offered = lines.offered or idle
        loop = self._runners.loop if self._runners else None
        if idle and loop is not None and lines.line is None:
            lines.line = loop.run(self._open_line(lines.node)) or False
        if idle and loop is not None and isinstance(lines.line, WaitLine):
            return loop.run(self._wait_on_loop(queue, index, lines, commands)) is True
        waits = self._plain_waits if lines.hand_off and not idle else self._quiet_waits
        with self._registered(waits, (queue.name, index), (lines.node, lines.conn_id)):
            replies = wire.call_on(lines.conn, commands, IDLE_WAIT + READ_SLACK)
        return self._arrived(queue, index, lines, replies, offered=idle) is True

    @contextlib.contextmanager
    def _registered(self, waits: dict[tuple[str, int], tuple[Any, int]], where: tuple[str, int],
                    conn: tuple[Any, int]) -> Iterator[None]:
        """A wait in progress, listed so that another thread can unblock it."""
        waits[where] = conn
        try:
            yield
        finally:
            waits.pop(where, None)

    @staticmethod
    async def _open_line(node: Any) -> WaitLine | None:
        twin = wire.async_twin(node)
        return None if twin is None else await WaitLine.open(twin)

    async def _wait_on_loop(self, queue: Queue, index: int, lines: _Lines,
                            commands: list[tuple[Any, ...]]) -> list[Lease] | bool:
        """The idle form's wait, on the worker's event loop: the replies are read as they
        arrive and an async job handed over starts right there, without a hand-over from the
        waiter's thread."""
        def took(replies: list[Any]) -> list[Lease] | bool:
            return self._arrived(queue, index, lines, replies, offered=True)

        line = lines.line
        assert isinstance(line, WaitLine)
        with self._registered(self._quiet_waits, (queue.name, index), (lines.node, line.id)):
            return await line.call(commands, took, IDLE_WAIT + READ_SLACK)

    def _arrived(self, queue: Queue, index: int, lines: _Lines, replies: list[Any], *,
                 offered: bool) -> list[Lease] | bool:
        """What a wait's replies brought (`Queue.after_wait`); a job handed over is taken here.
        `offered`: the wait began with an offer, whose reply comes first."""
        got = queue.after_wait(index, self._past_offer(queue, lines, replies) if offered
                               else replies)
        if isinstance(got, list):
            self._take(queue, got)
        return got

    def _past_offer(self, queue: Queue, lines: _Lines, replies: list[Any]) -> list[Any]:
        """An idle wait's replies after its offer's. A server that refuses the offer (no HSETEX
        before Valkey 9 and Redis 8, or an ACL that denies it) ends the waiter's offers: it
        waits for tokens from then on, as a capped queue's waiter does."""
        refused, *rest = replies
        if isinstance(refused, ResponseError):
            lines.hand_off = False
            with self._lock:
                said, self._refused_said = self._refused_said, True
            if not said:
                log.warning("queue %s: the server takes no offer (%s): idle workers wait for "
                            "wake tokens and claim, instead of taking jobs handed over",
                            queue.name, refused)
        return rest

    def _unblock_waiters(self, every: bool = False) -> None:
        """The worker fell idle: end its waiters' plain waits, so that they wait with an offer
        (see `_wait_for_wake`); `every`: it stops, end every wait. An unblocked BLPOP
        returns as if it timed out."""
        by_node: dict[Any, list[int]] = defaultdict(list)
        for node, conn_id in [*self._plain_waits.values(),
                              *(self._quiet_waits.values() if every else ())]:
            by_node[node].append(conn_id)
        for node, ids in by_node.items():
            with node.pipeline(transaction=False) as pipe:
                for conn_id in ids:
                    pipe.client_unblock(conn_id)
                pipe.execute()

    def _take(self, queue: Queue, leases: list[Lease]) -> None:
        """Run the jobs a waiter's claim or a hand-off brought, or hand them back when the worker
        stops."""
        with self._claim_lock:
            if not (self._stop_claiming.is_set() or self._threads_stop.is_set()):
                self._drained_until.pop(queue.name, None)
                self._submit(leases)
                return
        self._release(leases)

    def _summary(self) -> None:
        """One line per period: throughput, jobs held, backlog and lag (the oldest wait)."""
        if self.queues:
            presence.forget_silent(self.queues[0].client)  # workers that died without a word
        done = self.processed + self.failed
        rate = (done - self._summarised) / self.config.summary_every
        self._summarised = done
        pending, lag = 0, 0.0
        for queue in self.queues:
            counts, wait = queue.counts(), backlog.oldest_wait(queue)
            backlog.sample(queue, counts["pending"] + counts["scheduled"], wait)
            pending += counts["pending"]
            lag = max(lag, wait or 0.0)
        log.info("summary: %.1f jobs/s, processed=%d failed=%d in_flight=%d pending=%d lag=%.1fs",
                 rate, self.processed, self.failed, len(self._running), pending, lag)

    def _wait_for_valkey(self, exc: Exception) -> None:
        log.warning("Valkey unreachable (%s); retrying", exc)
        delay = 0.1
        while not self._stop_claiming.is_set():
            try:
                if self.queues:
                    self.queues[0].client.ping()
                log.info("Valkey is back")
                return
            except VALKEY_DOWN:
                self._stop_claiming.wait(delay)
                delay = min(delay * 2, 5.0)

    def _burst_done(self) -> bool:
        """Nothing running here, no durable job left to relay, and no pending (unless paused),
        scheduled or active job left."""
        if self._running or self._unrecorded or self._acks_waiting or not self._finished.empty():
            return False
        if any(q.options.durable for q in self.queues):
            try:
                if outbox.relay(self.queues, grace=0):
                    return False
            except DatabaseError as exc:
                log.warning("relay: %s; retrying", exc)
                close_db()
                return False
        for queue in self.queues:
            counts = queue.counts()
            waiting = counts["scheduled"] + (0 if queue.is_paused() else counts["pending"])
            if waiting + counts["active"]:
                return False
        return True

    # -- stopping ----------------------------------------------------------------------------

    def _drain(self) -> None:
        """Hand back prefetched jobs at once, let running jobs finish within the grace period,
        then release the rest."""
        with contextlib.suppress(RedisError):
            self._unblock_waiters(every=True)  # (a job handed over meanwhile goes back)
        unstarted = self._runners.take_unstarted() if self._runners else []
        try:
            self._release(unstarted)
        except RedisError:
            log.warning("could not release prefetched jobs: their leases will expire instead")
        with contextlib.suppress(*VALKEY_DOWN):
            self._claim()  # stopping: records the successes that waited for a claim
        deadline = time.monotonic() + self.config.grace
        while self._running and not self._abort.is_set() and time.monotonic() < deadline:
            self._tick.clear()
            with contextlib.suppress(*VALKEY_DOWN):
                self._record()
            self._tick.wait(0.1)
        try:
            self._record()
            with self._lock:
                leftovers = [r.lease for r in self._running.values()]
            self._release(leftovers)
            self.abandoned = len(leftovers)
        except RedisError:
            log.warning("could not release running jobs: their leases will expire instead")

    def _release(self, leases: list[Lease]) -> None:
        """Give claimed jobs back without charging their budget, and forget them here."""
        by_queue: dict[str, list[Lease]] = defaultdict(list)
        for lease in leases:
            by_queue[lease.queue].append(lease)
        for name, group in by_queue.items():
            released = self._queue(name).release_many(group)
            for lease, ok in zip(group, released, strict=True):
                log.info("queue=%s job=%s attempt=%d outcome=%s", name, lease.job_id,
                         lease.token, "released" if ok else "stale")
        with self._lock:
            for lease in leases:
                self._forget(lease)

    def _spawn(self, target: Any, name: str, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, name=f"jobqueue-{name}", daemon=True)
        thread.start()
        self._threads.append(thread)

    def _stop_threads(self) -> None:
        self._threads_stop.set()
        self._room.set()
        deadline = time.monotonic() + 15
        for thread in self._threads:
            while thread.is_alive() and time.monotonic() < deadline:
                thread.join(timeout=0.2)
                with contextlib.suppress(RedisError):  # (a wait that began after the last unblock)
                    self._unblock_waiters(every=True)
        if self._mirror is not None:
            self._mirror.final_pass(insist=self.config.burst, abort=self._abort)
        if self._runners is not None:
            self._runners.stop(wait=not self.abandoned)
        if self.queues:
            with contextlib.suppress(*VALKEY_DOWN):
                presence.goodbye(self.queues[0].client, self.config.name)
        log.info("worker %s stopped: processed=%d failed=%d released=%d", self.config.name,
                 self.processed, self.failed, self.abandoned)
