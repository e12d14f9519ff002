"""The worker's turns besides claiming, each on its own timer, run by the main loop: maintenance
(new queues, settling resizes, automatic shard counts, promote and reap, the registry's entries
of the served queues, the worker's presence), the promotion of scheduled jobs whose due time the
last sweep saw (PROMOTE_GAP), the schedules' ticks, and the summary line.

Owns those timers, when the next scheduled job is due, and the rate the console shows. It may
change what the worker serves (`Served`: a queue created since it started, a shard count that
changed), reads the held jobs and the counts of recorded outcomes, and calls the queues'
maintenance transitions, `layouts`, `schedule` (and `stored_schedules`, the database's periodic
jobs), `autoscale`, `relay` (flows' "member done"
entries across shards), `presence` and (to end a burst) `outbox`. It claims and records nothing.
"""

from __future__ import annotations

import logging
import os
import socket
import time

from django.db import DatabaseError

from ..conf import get_client, get_config
from ..engine import backlog, layouts
from ..engine.store import Queue, known_queues
from ..flows import relay
from ..history import outbox
from ..operations import autoscale, schedule, stored_schedules
from . import presence
from .mirror_thread import close_db
from .outcomes import Outcomes
from .serving import HeldJobs, Served, WorkerConfig

log = logging.getLogger("jobqueue.worker")
SETTLE_EVERY = 2.0
"""Seconds between checks of a settling resize (one worker per queue does it)."""
PROMOTE_GAP = 0.1
"""Seconds at least between two promotions of due scheduled jobs (outside maintenance turns): a
delayed or retried job starts at most this late on an idle worker, and a stream of due times
(lane rates' next tokens, retries) costs each worker no more than a sweep of its shards this
often."""
BURST_HORIZON = 60.0
"""Seconds ahead a burst run waits for scheduled jobs: retries' backoff and short delays are
run, a job due later (a task's run_after hours ahead) waits for a later run."""
BURST_CHECK = 0.02
"""Seconds a burst worker that holds nothing waits before it first asks again whether the run is
done, doubled at each ask up to the maintenance interval: other workers' last jobs (or a lane
held at its cap, whose slots they hold) may end in milliseconds, and no token tells of them."""


class Maintenance:
    """Maintenance, schedules and summary of one worker (see the module's docstring)."""

    def __init__(self, config: WorkerConfig, served: Served, held: HeldJobs,
                 outcomes: Outcomes) -> None:
        self._config, self._served, self._held, self._outcomes = config, served, held, outcomes
        self._next_turn = 0.0
        self._next_fire = 0.0
        self._next_summary = time.monotonic() + config.summary_every
        self._summarised = 0
        self.next_due: float | None = None
        """When the next scheduled job is due (monotonic clock), as of the last turn."""
        self._advertised = (time.monotonic(), 0)
        """(when, jobs done) at the last advertisement: the rate the console shows."""
        self._burst_check = BURST_CHECK
        self._stored = stored_schedules.Loader()
        """The periodic jobs kept in the database, read again when one changes."""

    def hold(self) -> None:
        """Defer every timer for good: for a caller that drives the worker's turns itself (a
        test), so that no turn runs maintenance, fires a schedule or logs a summary."""
        self._next_turn = self._next_fire = self._next_summary = float("inf")

    def run_due(self) -> bool:
        """Whatever is due now; True when a maintenance turn ran (the served queues may have
        changed)."""
        now = time.monotonic()
        turned = now >= self._next_turn
        if turned:
            self.turn()
            self._next_turn = now + self._config.maintenance_every
        elif self.next_due is not None and now >= self.next_due:
            self.promote()  # (its wake tokens, or the claim that follows, take the jobs)
        if now >= self._next_fire:
            self.fire_schedule()
        if now >= self._next_summary:
            self.summary()
            self._next_summary = now + self._config.summary_every
        return turned

    def next_wake(self) -> float:
        """Seconds until the next maintenance turn, scheduled job or schedule tick; in a burst
        run holding nothing, until the next ask whether the run is done (BURST_CHECK)."""
        now = time.monotonic()
        wait = min(self._config.maintenance_every, max(self._next_fire - now, 0.001))
        if self.next_due is not None:
            wait = min(wait, max(self.next_due - now, 0.001))
        if self._config.burst:
            if self._held.jobs:
                self._burst_check = BURST_CHECK
            else:
                wait = min(wait, self._burst_check)
                self._burst_check = min(self._burst_check * 2, self._config.maintenance_every)
        return wait

    def turn(self) -> None:
        """promote + reap + relay on every shard (idempotent, cheap), list the served queues
        again where the registry lost them, and advertise this worker."""
        self._serve_new_queues()
        for queue in self._served.queues:
            self._settle(queue)
            if queue.options.auto_shards and not self._config.burst:
                resized = autoscale.check(queue, get_config().auto_shards)
                if resized:
                    log.info("queue %s: %d → %d shards (automatic)", queue.name, *resized)
            self._served.shards[queue.name] = queue.claim_shards()
        self.promote()
        for queue in self._served.queues:
            shards = self._served.shards[queue.name]
            queue.reap(shards=shards)
            relay.relay_queue(queue, shards)  # (what a finisher recorded but did not relay;
            # a shard being retired keeps its place here until its :outcomes is empty: layouts)
        self._relist()
        self.advertise()

    def promote(self) -> None:
        """Move the served queues' due scheduled jobs to ready (promote.lua pushes their wake
        tokens) and note when the next one is due."""
        next_due: float | None = None
        for queue in self._served.queues:
            for index in range(self._served.shards[queue.name]):
                _, wait = queue.promote_shard(index)
                if wait is not None:
                    next_due = wait if next_due is None else min(next_due, wait)
        self.next_due = None if next_due is None else time.monotonic() + max(next_due, PROMOTE_GAP)

    def _relist(self) -> None:
        """List the served queues again where the registry lost them (`layouts.list_missing`)."""
        served = self._served
        if served.queues:
            for name in layouts.list_missing(served.queues[0].client, served.shards):
                log.warning("queue %s was missing from the registry (Valkey lost data?): "
                            "listed again", name)

    def _serve_new_queues(self) -> None:
        """Serving every known queue: pick up queues created since."""
        if self._config.queues:
            return
        served = self._served
        for name in known_queues(served.queues[0].client if served.queues else None):
            if name not in served.shards:
                served.add(Queue(name))
                log.info("serving new queue %s", name)

    def fire_schedule(self) -> None:
        """Enqueue the schedules' due ticks, and wake again just after the next one: an
        every-second entry must not lose a tick to a maintenance turn that ran late."""
        if self._config.burst:  # a --burst run drains; it does not start work
            self._next_fire = float("inf")
            return
        client = get_client()
        entries = self._stored.entries(client, get_config().schedule)  # (and the database's)
        if not entries:  # (a row added in the admin is seen at the next turn)
            self._next_fire = time.monotonic() + self._config.maintenance_every
            return
        schedule.fire_due(entries, client)
        now = schedule.server_now(client)  # (Valkey's clock, never this worker's)
        ticks = [tick for entry in entries.values() if (tick := entry.next_tick(now)) is not None]
        until = min(((tick - now).total_seconds() + 0.002 for tick in ticks),
                    default=self._config.maintenance_every)
        self._next_fire = time.monotonic() + min(until, self._config.maintenance_every)

    def _settle(self, queue: Queue) -> None:
        """While a resize settles, one worker every few seconds checks whether it is done."""
        layout = queue.layout()
        if not layout.settling or not layouts.one_turn(queue.client, layouts.SETTLE_TURN + queue.name,
                                                        SETTLE_EVERY):
            return
        done = layouts.settle(queue.client, queue.name, queue.configured)
        if done is not None:
            retired = range(done.live, layout.span)
            log.info("queue %s: resize settled at %d shard(s)%s", queue.name, done.live,
                     f"; retired shard(s) {', '.join(map(str, retired))}" if retired else "")

    def advertise(self) -> None:
        """Write this worker's presence entry (what the console's workers page lists)."""
        if not self._served.queues:
            return
        held = [[lease.queue, lease.job_id] for lease in self._held.leases(most=20)]
        now = time.monotonic()
        processed, failed = self._outcomes.processed, self._outcomes.failed
        last_at, last_done = self._advertised
        rate = (processed + failed - last_done) / (now - last_at) if now > last_at else 0.0
        self._advertised = (now, processed + failed)
        presence.advertise(self._served.queues[0].client, self._config.name, {
            "pid": os.getpid(), "host": socket.gethostname(),
            "queues": [q.name for q in self._served.queues],
            "running": len(self._held.jobs), "concurrency": self._config.concurrency,
            "overrunning": self._held.overrunning,
            "processed": processed, "failed": failed, "rate": round(rate, 1), "jobs": held})

    def summary(self) -> None:
        """One line per period: throughput, jobs held, backlog and lag (the oldest wait)."""
        queues = self._served.queues
        if queues:
            presence.forget_silent(queues[0].client)  # workers that died without a word
        processed, failed = self._outcomes.processed, self._outcomes.failed
        rate = (processed + failed - self._summarised) / self._config.summary_every
        self._summarised = processed + failed
        pending, lag = 0, 0.0
        for queue in queues:
            counts, wait = queue.counts(), backlog.oldest_wait(queue)
            backlog.sample(queue, counts["pending"] + counts["scheduled"], wait)
            pending += counts["pending"]
            lag = max(lag, wait or 0.0)
        log.info("summary: %.1f jobs/s, processed=%d failed=%d in_flight=%d pending=%d lag=%.1fs",
                 rate, processed, failed, len(self._held.jobs), pending, lag)

    def nothing_left(self) -> bool:
        """No durable job left to resend, no flow's entry left to relay (relay.py), and no
        pending (unless paused) or active job left in the served queues, nor a scheduled one
        due within BURST_HORIZON: a burst run is done."""
        queues = self._served.queues
        if any(q.options.durable for q in queues):
            try:
                if outbox.resend(queues, grace=0):
                    return False
            except DatabaseError as exc:
                log.warning("resend: %s; retrying", exc)
                close_db()
                return False
        later = 0
        for queue in queues:
            if relay.relay_queue(queue, queue.claim_shards()):  # (entries delivered: look
                return False  # again at the next turn, after what they released or forwarded)
            counts = queue.counts()
            if counts["active"] + (0 if queue.is_paused() else counts["pending"]):
                return False
            if counts["scheduled"] and self._due_soon(queue):
                return False
            later += counts["scheduled"]
        if later:
            log.info("burst done; %d scheduled job(s) due more than %.0fs from now wait for a "
                     "later run", later, BURST_HORIZON)
        return True

    def _due_soon(self, queue: Queue) -> bool:
        """Whether a scheduled job of `queue` is due within BURST_HORIZON (those due already
        are promoted: the next claim takes them)."""
        for index in range(self._served.shards.get(queue.name, 1)):
            moved, wait = queue.promote_shard(index)
            if moved or (wait is not None and wait <= BURST_HORIZON):
                return True
        return False
