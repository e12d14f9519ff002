"""Lease renewal: while a handler runs, its lease is renewed at a third of its length, so a
job may run for days on a 30 s lease and a dead worker's jobs still come back within one.

Reads the held jobs (`serving.HeldJobs`) and flags a lease found stale; calls only `extend_many`."""

from __future__ import annotations

import logging
import threading
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

    def run(self) -> None:
        """Renew every third of the shortest lease held; a job that joins with a shorter one
        cuts the wait short (its lease would lapse first), to be planned again from then."""
        while not self.stop.is_set():
            if self.sooner.wait(self.interval()):
                self.sooner.clear()
                continue
            self.renew()

    def interval(self) -> float:
        """A third of the shortest lease held (of the worker's own when none is), noted as what
        the wait is planned for."""
        with self.lock:
            shortest = min((item.lease.lease for item in self.held.values()),
                           default=self.default_lease)
            self._held.planned = shortest
        return max(0.02, min(shortest / 3, 10.0))

    def renew(self) -> None:
        """One renewal pass: one call per queue and lease length; flags leases found stale."""
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
