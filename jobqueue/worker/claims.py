"""The worker's claiming side: what it claims, from which queues and shards, and how claimed jobs
reach its runners.

`Claims` decides how much room there is (the worker's capacity, each queue's `concurrency`,
a batch's worth), which queues to ask and in what order (a rotation, skipping the drained ones
and those a rate limit holds back: `serving.Drained`), and makes each call that acks the
successes the main loop carried (`outcomes.py`) and claims the next batch. Claims come from
the main loop, from a waiter after a wake token (its shard only), and at concurrency 1 from the
runner that just finished a job (its success rides that claim). One lock makes these never
count the same room twice. Jobs a hand-off brought are taken here too (or given back when the
worker stops), and the jobs of a claim whose reply was lost are recovered here.

Owns the claim lock and the drained marks; writes the held jobs (`HeldJobs.add`/`forget`),
hands the jobs to the runners and calls the outcomes' carry/ack methods; calls Valkey through
`Queue.ack_and_dequeue`, `release_many` and `lost_claims`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable

from redis.exceptions import RedisError

from .. import tracing
from ..engine.store import Queue
from ..exceptions import VALKEY_DOWN
from ..records import Lease
from .executor import Outcome
from .outcomes import Carried, Finished, Outcomes
from .recycling import Recycler
from .runners import Runners
from .serving import DRAINED, Drained, HeldJobs, Served, WorkerConfig

log = logging.getLogger("jobqueue.worker")


class Claims:
    """What one worker claims and hands to its runners (see the module's docstring)."""

    def __init__(self, config: WorkerConfig, served: Served, held: HeldJobs, outcomes: Outcomes,
                 *, stop_claiming: threading.Event, threads_stop: threading.Event,
                 wake: threading.Event) -> None:
        """`stop_claiming` (a graceful stop) and `threads_stop` end claiming; `wake` wakes the
        main loop (at concurrency 1, for what a runner's claim leaves to it)."""
        self._config, self._served, self._held, self._outcomes = config, served, held, outcomes
        self._stop_claiming, self._threads_stop, self._wake = stop_claiming, threads_stop, wake
        self._lock = threading.Lock()
        self._drained = Drained()
        self._rotation = 0
        self.runners: Runners | None = None
        """Where claimed jobs go, once the worker started them (`Worker.start_runners`)."""
        self.recycler: Recycler | None = None
        """Bounds each claim by what `--max-jobs` leaves and trips a due recycle (`Worker`
        sets it when a limit is set; None, and so no cost, without one)."""
        self.spent: Callable[[], object] = lambda: None
        """Called once `--max-jobs` is spent (the waiters' `unblock`: their waits end)."""
        self.fell_busy: Callable[[], object] = lambda: None
        """Called when jobs reach a worker that held none (its idle offers go: the waiters'
        `withdraw_offers`), once the jobs are on the runners (they start without waiting for
        that round trip), unless they have all ended by then (the offers are right again)."""

    def claim(self, successes: list[Finished] | None = None,
              woken: tuple[Queue, int] | None = None) -> int:
        """Record `successes` and claim what there is room for; how many jobs it claimed. A
        waiter passes the queue and shard its token came from: the claim asks only there. A
        call that fails gives back the successes it carried (a later claim acks them)."""
        with self._lock:
            carried = self._outcomes.carry(successes or [])
            try:
                return self._claim_locked(carried, woken)
            except BaseException:  # (Valkey down or refusing: acked by a later turn)
                self._outcomes.give_back(carried.left())
                raise

    def resize(self, config: WorkerConfig) -> None:
        """Claim as `config` says from now on (a worker that serves batch handlers grew:
        batches.py)."""
        with self._lock:
            self._config = config

    def claim_woken(self, queue: Queue, index: int) -> None:
        """A waiter got a token: claim from its shard on its thread rather than wake the main
        loop to do it, so an enqueue reaches a worker's runner in one hop."""
        self._drained.clear(queue.name)
        self.claim(woken=(queue, index))

    def finished_one(self, lease: Lease, outcome: Outcome) -> None:
        """At concurrency 1, on the job's thread: a success is acked by the claim of the next job,
        made here (no batch of acks can form: a hop to the main loop would only add one);
        failures, and successes while stopping, go to the main loop."""
        if not outcome.ok or self._stop_claiming.is_set():
            self._outcomes.finished(lease, outcome)
            return
        self._held.forget((lease,))
        try:
            self.claim([(lease, outcome)])
        except VALKEY_DOWN:  # (given back: the main loop records it once Valkey is back)
            pass
        except RedisError:
            log.exception("Valkey refused a command")
        if self._outcomes.unrecorded() or not self._held.jobs:  # (the main loop's now; idle:
            self._wake.set()  # it ends the waiters' plain waits, to wait with an offer again)

    def take(self, queue: Queue, leases: list[Lease]) -> None:
        """Run the jobs a hand-off brought, or hand them back when the worker stops (as it
        does those a stopping waiter found handed to it)."""
        with self._lock:
            if not (self._stop_claiming.is_set() or self._threads_stop.is_set()) and (
                    self.recycler is None or self.recycler.admits(len(leases))):
                self._drained.clear(queue.name)
                self._submit(leases)
                return
        self.release(leases)

    def release(self, leases: list[Lease]) -> None:
        """Give claimed jobs back without charging their budget, and forget them here."""
        release(self._served, leases)
        self._held.forget(leases)

    def recover_lost(self) -> None:
        """The jobs of a claim whose reply was lost go back to their queues."""
        for queue in self._served.queues:
            queue.lost_claims.recover(queue.client, queue.name)

    def next_refill(self, now: float) -> float | None:
        """When the first queue held back by its rate limit may be asked again (None: none)."""
        return self._drained.refill(self._served.queues, now)

    def _claim_locked(self, carried: Carried, woken: tuple[Queue, int] | None) -> int:
        room, queues = self._held.free, self._served.queues
        batch = self._config.batch
        if self.recycler is not None and not self._stop_claiming.is_set():
            capped = self.recycler.room(room, len(self._held.jobs))
            batch = min(batch, capped) if capped < room else batch  # (the budget's last jobs)
            room = capped
        stopping = self._stop_claiming.is_set()
        if (stopping or not queues or room <= 0
                or (self._held.jobs and room < batch)):
            # Nothing to claim (a batch's worth must be free: one claim serves many jobs).
            self._outcomes.hold_or_ack(carried, stopping=stopping)
            return 0
        if woken is None:
            self._rotation = (self._rotation + 1) % len(queues)  # no queue always goes first
            order = queues[self._rotation:] + queues[: self._rotation]
        else:  # (the main loop serves the others: a token must not cost a round trip per queue)
            order = [woken[0]]
        claimed, now = 0, time.monotonic()
        for queue in order:
            claimed += self._claim_from(queue, carried, room - claimed, now,
                                        woken[1] if woken else None)
        self._outcomes.ack_left(carried)  # (of queues no longer served, or not asked now)
        return claimed

    def _claim_from(self, queue: Queue, carried: Carried, room: int, now: float,
                    only: int | None) -> int:
        """One call to a queue: ack its successes, claim up to `room` (from shard `only`)."""
        items = carried.of(queue.name)
        # A queue's `concurrency` caps the jobs of that queue this worker holds at once, so a
        # busy queue cannot take every slot from the others (Pacer's isolation).
        limit = queue.options.concurrency or self._config.capacity
        take = min(room, limit - self._held.per_queue[queue.name])
        if only is None and self._drained.skip(queue.name, now):
            # Skipped a moment, but successes go there anyway: their call claims too, from
            # their shard only (what their acks released, a flow's next job, starts at once).
            # Not under a global cap: its permits would cost calls of their own.
            if not items or queue.options.global_concurrency:
                return 0  # (its successes are acked with the rest)
            only = riding_shard(items)
        if take <= 0:
            return 0
        answers, leases = queue.ack_and_dequeue(
            [(lease, outcome.result) for lease, outcome in items],
            count=take, lease=self._config.lease, worker=self._config.name,
            override_lease=self._config.lease is not None,
            shards=self._served.shards[queue.name], only=only,
        )
        carried.by_queue.pop(queue.name, None)
        self._outcomes.acked(items, answers)
        if queue.rate_wait:  # its rate limit holds the rest back: serve the others meanwhile
            self._drained.mark(queue.name, now + queue.rate_wait)
        elif len(leases) < take:  # drained: skip the queue a moment (see `Drained`; after a
            # waiter's claim of one shard too: work on the others wakes their own waiters)
            self._drained.mark(queue.name, now + DRAINED)
        self._submit(leases)
        return len(leases)

    def _submit(self, leases: list[Lease]) -> None:
        assert self.runners is not None
        fell_busy = self._held.add(leases)
        spent = self.recycler is not None and self.recycler.took(len(leases))
        self.runners.submit(leases)  # (first: the jobs start without waiting for Valkey)
        if spent:  # (its waits for tokens it could not use end: the tokens stay for others)
            self.spent()
        if fell_busy and self._held.jobs:  # busy still: its idle offers on other shards go
            self.fell_busy()


def riding_shard(items: list[Finished]) -> int:
    """The shard most of `items` were claimed from (their acks ride its claim)."""
    return Counter(lease.shard for lease, _ in items).most_common(1)[0][0]


def release(served: Served, leases: list[Lease]) -> None:
    """Give claimed jobs back to their queues without charging their budget, one call per
    queue, logging each."""
    by_queue: dict[str, list[Lease]] = defaultdict(list)
    for lease in leases:
        by_queue[lease.queue].append(lease)
    for name, group in by_queue.items():
        released = served.queue(name).release_many(group)
        for lease, ok in zip(group, released, strict=True):
            log.info("queue=%s job=%s attempt=%d outcome=%s", name, lease.job_id, lease.token,
                     "released" if ok else "stale")
            tracing.released(lease, ok)
