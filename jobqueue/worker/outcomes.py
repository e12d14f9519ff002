"""What finished, on its way to Valkey: the hand-off from the runners, successes riding the next
claim, and the transitions that record them.

Owns the one hand-off (`Outcomes.finished` puts, `finished_many` a batch's outcomes together:
batches.py; only the main loop's `record` takes out),
the successes that wait for a claim to carry them (ACK_WAIT at most), and the counts of what was
recorded. A call that fails (Valkey down, or refusing: full, read-only after a failover, busy)
puts what it did not record back on the hand-off, whichever thread made it, so an outcome is
never dropped nor held in two places; a refused outcome goes back behind the others, so one that
keeps being refused holds up no other. It touches the held jobs (forgetting what was recorded),
the queues' ack and nack, the `job_finished` signal, and relays what a recorded outcome forwarded
to another shard (through the relay thread: relaying.py); it claims nothing.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import defaultdict
from queue import Empty, SimpleQueue

from redis.exceptions import RedisError

from .. import signals
from ..engine.scripts.answers import Acked
from ..engine.store import Queue
from ..exceptions import VALKEY_DOWN
from ..records import Lease
from ..states import State
from .executor import Outcome
from .relaying import Relayer
from .serving import HeldJobs, Served

log = logging.getLogger("jobqueue.worker")
ACK_WAIT = 0.005
"""Seconds finished jobs may wait for the next claim to carry their acks: a busy worker whose
jobs finish one by one then records them in batches, not a script call each."""
Finished = tuple[Lease, Outcome]


class Carried:
    """The successes one claim carries, by queue, and since when the oldest has waited; a queue's
    are dropped from it once recorded (what is left when a call fails goes back)."""

    __slots__ = ("by_queue", "items", "since")

    def __init__(self, items: list[Finished], since: float) -> None:
        self.items, self.since = items, since
        self.by_queue = by_queue(items)

    def of(self, name: str) -> list[Finished]:
        return self.by_queue.get(name, [])

    def left(self) -> list[Finished]:
        """What no call recorded yet."""
        return [item for items in self.by_queue.values() for item in items]


class Outcomes:
    """Outcomes from the runners to Valkey (see the module's docstring)."""

    def __init__(self, held: HeldJobs, served: Served, batch: int, wake: threading.Event,
                 relayer: Relayer) -> None:
        """`relayer` relays what the recorded outcomes forwarded (relaying.py)."""
        self.processed = 0
        self.failed = 0
        self._held, self._served, self._batch, self._wake = held, served, batch, wake
        self._relayer = relayer
        self._finished: SimpleQueue[Finished] = SimpleQueue()
        self._lock = threading.Lock()
        """Guards the successes waiting for a claim and the counts."""
        self._waiting: list[Finished] = []
        self._since = 0.0
        self._handing = threading.Lock()
        """Held while a batch's outcomes are put, and while `record` takes what was put: a
        batch's failures are recorded together."""

    # -- from the runners ------------------------------------------------------------------

    def finished(self, lease: Lease, outcome: Outcome) -> None:
        """Called by a runner thread: queue the outcome for the main loop to record. The loop
        is woken for a failure, for the first success (its ACK_WAIT starts) and for a batch's
        worth, not for every job: between those it would only wait again."""
        self._finished.put((lease, outcome))
        waiting = self._finished.qsize() + len(self._waiting)
        if (not outcome.ok or waiting <= 1 or waiting >= self._batch) and not self._wake.is_set():
            self._wake.set()  # (set already: the loop has yet to clear it, and will look then)

    def finished_many(self, items: list[Finished]) -> None:
        """Called by a runner thread with a batch's outcomes (batches.py): queued together,
        the main loop woken once, so its successes ride one claim."""
        with self._handing:  # (`record` takes them all or none)
            for item in items:
                self._finished.put(item)
        if not self._wake.is_set():
            self._wake.set()

    def resize(self, batch: int) -> None:
        """The successes that make an ack call of their own, once the worker grew
        (`WorkerConfig.batch`)."""
        self._batch = batch

    def empty(self) -> bool:
        """Whether nothing waits to be taken by `record`."""
        return self._finished.empty()

    def unrecorded(self) -> bool:
        """Whether any outcome waits to be recorded (queued or held for a claim)."""
        return bool(self._waiting) or not self._finished.empty()

    def ack_due(self) -> float | None:
        """When the successes held for a claim must be acked without one (monotonic clock)."""
        return self._since + ACK_WAIT if self._waiting else None

    # -- on the main loop --------------------------------------------------------------------

    def record(self, defer_acks: bool = False) -> list[Finished]:
        """Turn finished runs into transitions: failures in one nack call per queue, successes
        in one ack call per queue, or, with `defer_acks`, handed back for the next claim to
        carry. The jobs are forgotten either way: their slots are free for that claim. Only the
        main loop calls it.
        A call that fails gives back what it did not record (see the module's docstring) and
        raises; successes to be carried are then acked at once, unless Valkey is down: a
        failure refused again and again must not keep them from their claim."""
        pending: list[Finished] = []
        with self._handing:
            while True:
                try:
                    pending.append(self._finished.get_nowait())
                except Empty:
                    break
        if not pending:
            return []
        successes = [(lease, out) for lease, out in pending if out.ok]
        failures = list(by_queue([item for item in pending if not item[1].ok]).values())
        acks = list(by_queue(successes).values())
        if not defer_acks:
            self._record(failures + acks)
            return []
        try:
            self._record(failures)
        except BaseException as exc:
            if refused(exc):
                self._record(acks)
            else:
                self.give_back(successes)
            raise
        self._held.forget(lease for lease, _ in successes)
        return successes

    def _record(self, units: list[list[Finished]]) -> None:
        """Record each unit (one queue's failures, or its successes) with one call. A refused
        call gives its unit back and the next one is tried (a full or read-only Valkey refuses
        each at once), its failures one by one (so one that keeps being refused holds up no
        other); Valkey down (or anything else) gives back every unit left and stops. The first
        error is raised once every unit had its turn."""
        first: BaseException | None = None
        index = 0
        while index < len(units):
            unit = units[index]
            try:
                if unit[0][1].ok:
                    self.ack(self._served.queue(unit[0][0].queue), unit)
                else:
                    self._nack(unit)
            except BaseException as exc:
                if not refused(exc):
                    self.give_back([item for left in units[index:] for item in left])
                    raise
                if len(unit) > 1 and not unit[0][1].ok:  # (each on its own, right away)
                    units[index + 1 : index + 1] = [[item] for item in unit]
                else:
                    self.give_back(unit)  # (behind what finished meanwhile: tried after it)
                    first = first or exc
            index += 1
        if first is not None:
            raise first

    def _nack(self, items: list[Finished]) -> None:
        """Record one queue's failures: one alone as ever (nack.lua), several (a batch's) in
        one call (nack_many.lua)."""
        leases = self._served.queue(items[0][0].queue).leases
        if len(items) == 1:
            lease, out = items[0]
            answers = [leases.nack(lease, out.error, out.retry_in, fatal=out.fatal)]
        else:
            answers = leases.nack_many([(lease, out.error, out.retry_in, out.fatal)
                                        for lease, out in items])
        for (lease, out), answer in zip(items, answers, strict=True):
            _log(lease, out, answer.state or "stale")
        forwarded = [lease for (lease, _), answer in zip(items, answers, strict=True)
                     if answer.forwarded]
        if forwarded:  # (a member's failure went to dependents on other shards)
            self._relay(forwarded)
        self._held.forget(lease for lease, _ in items)
        with self._lock:
            self.failed += len(items)

    # -- on a claim --------------------------------------------------------------------------

    def carry(self, successes: list[Finished]) -> Carried:
        """What a claim carries: the successes held for it, and `successes`."""
        with self._lock:
            since = self._since if self._waiting else time.monotonic()
            items = self._waiting + successes if self._waiting else successes
            self._waiting = []
        return Carried(items, since)

    def hold_or_ack(self, carried: Carried, stopping: bool) -> None:
        """No claim goes out: the successes wait a moment for the next one (ACK_WAIT), unless
        they make a batch of their own or the worker stops; else they are acked now."""
        items = carried.items
        if (items and len(items) < self._batch and not stopping
                and time.monotonic() - carried.since < ACK_WAIT):
            with self._lock:  # (claims take turns: none held others meanwhile, but be sure)
                self._since = min(self._since, carried.since) if self._waiting else carried.since
                self._waiting = items + self._waiting
            carried.by_queue.clear()
            return
        self.ack_left(carried)

    def ack_left(self, carried: Carried) -> None:
        """Ack what `carried` still holds (of queues no claim was sent to), one call per queue."""
        for name in list(carried.by_queue):
            self.ack(self._served.queue(name), carried.by_queue[name])
            del carried.by_queue[name]

    def give_back(self, items: list[Finished]) -> None:
        """Outcomes a failed call did not record, queued again for the main loop."""
        for item in items:
            self._finished.put(item)

    # -- recording successes -----------------------------------------------------------------

    def ack(self, queue: Queue, items: list[Finished]) -> None:
        self.acked(items, queue.ack_encoded([(lease, out.result) for lease, out in items]))

    def acked(self, items: list[Finished], answers: list[Acked]) -> None:
        """Log recorded successes (or runs an operator cancelled: `Acked.state`) and forget their
        jobs; relay the outcomes their acks forwarded to dependents on other shards (relay.py)."""
        for (lease, out), answer in zip(items, answers, strict=True):
            _log(lease, out, answer.state)
        if any(answer.forwarded for answer in answers):
            pairs = zip(items, answers, strict=True)
            self._relay([lease for (lease, _), answer in pairs if answer.forwarded])
        # (most were forgotten already: their slots went to the claim)
        self._held.forget(lease for lease, _ in items)
        if items:
            with self._lock:
                self.processed += len(items)


    def _relay(self, leases: list[Lease]) -> None:
        """Relay what the outcomes of `leases` forwarded: at once, here, when the worker holds
        no other job (the jobs a claim brought are not held yet: relaying.py), else on the
        relay thread."""
        ours = {(lease.job_id, lease.token) for lease in leases}
        alone = all(held in ours for held in list(self._held.jobs))
        self._relayer.after(leases, now=alone)


def refused(exc: BaseException) -> bool:
    """Whether Valkey answered a call with an error (out of memory, read-only, busy, a script's
    error) rather than not at all: the next call may still go through."""
    return isinstance(exc, RedisError) and not isinstance(exc, VALKEY_DOWN)


def by_queue(items: list[Finished]) -> dict[str, list[Finished]]:
    grouped: dict[str, list[Finished]] = defaultdict(list)
    for item in items:
        grouped[item[0].queue].append(item)
    return grouped


def _log(lease: Lease, outcome: Outcome, state: str) -> None:
    """Log and signal a recorded outcome."""
    signals.send_from_worker(signals.job_finished, Queue, lease=lease, state=str(state),
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
