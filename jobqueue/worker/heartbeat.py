"""Lease renewal: while a handler runs, its lease is renewed at a third of its length, so a
job may run for days on a 30 s lease and a dead worker's jobs still come back within one. The
renewal of a started run with a time limit carries the time left until its deadline (counted
from the run's start: `HeldJobs.start`), which extend.lua writes as the row's deadline on the
server's clock and renews no further than a second past, so a worker stuck past the limit cannot
keep the run from the reaper. A job not started yet (prefetched) is renewed as any other.

Reads the held jobs (`serving.HeldJobs`) and flags a lease found stale; calls only `extend_many`."""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable

from redis.exceptions import RedisError

from ..engine.store import Queue
from .serving import Held, HeldJobs

log = logging.getLogger("jobqueue.worker")


class Heartbeat:
    """Renews the leases of the jobs in `held` until `stop` is set (and `held.sooner` with it,
    which ends its wait)."""

    def __init__(self, held: HeldJobs, queue: Callable[[str], Queue], stop: threading.Event,
                 default_lease: float) -> None:
        self.held, self.lock, self.queue, self.stop = held.jobs, held.lock, queue, stop
        self.sooner, self._held = held.sooner, held
        self.default_lease = default_lease
        self._due: float | None = None
        """When the next renewal is due (monotonic seconds), once planned."""

    def run(self) -> None:
        """Renew every third of the shortest lease held; a job that joins with a shorter one
        cuts the wait short (its lease would lapse first), to be planned again from then."""
        while not self.stop.is_set():
            now = time.monotonic()
            if self.sooner.wait(max(self.plan(now) - now, 0.0)):
                self.sooner.clear()
                continue
            self.renew()

    def plan(self, now: float) -> float:
        """When the next renewal is due: a third of the shortest lease held (of the worker's own
        when none is) from `now`, but never later than the renewal already planned (a job that
        joins with a shorter lease may bring it forward, never put off the others')."""
        due = now + self.interval()
        if self._due is None or due < self._due:
            self._due = due
        return self._due

    def interval(self) -> float:
        """A third of the shortest lease held (of the worker's own when none is), noted as what
        the wait is planned for."""
        return max(0.02, min(self._held.plan(self.default_lease) / 3, 10.0))

    def renew(self) -> None:
        """One renewal pass: one call per queue and lease length; flags leases found stale.
        The next one is planned afresh."""
        self._due = None
        with self.lock:
            items = list(self.held.values())
        groups: dict[tuple[str, float], list[Held]] = defaultdict(list)
        for item in items:
            groups[(item.lease.queue, item.lease.lease)].append(item)
        for (name, seconds), group in groups.items():
            try:
                codes = self.queue(name).extend_many([item.lease for item in group], seconds)
            except RedisError as exc:
                log.warning("could not renew leases (%s); retrying", exc)
                return
            for item, code in zip(group, codes, strict=True):
                if code == 0 and not item.lost and self._still_held(item):
                    item.lost = True
                    log.warning("queue=%s job=%s lease lost: it may run again elsewhere",
                                name, item.lease.job_id)

    def _still_held(self, item: Held) -> bool:
        """A job recorded (and forgotten) since the snapshot lost nothing: its outcome got there."""
        with self.lock:
            return self.held.get((item.lease.job_id, item.lease.token)) is item
