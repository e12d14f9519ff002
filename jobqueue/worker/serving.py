"""What every room of the worker reads: how it runs (`WorkerConfig`), the queues it serves
(`Served`, found at start by `find_queues`), the jobs it holds (`HeldJobs`) and the queues it
does not ask for now (`Drained`).

No thread of its own, and no call to Valkey but reading which queues there are and their shard
counts. `Served` changes on the main loop only (its start and maintenance turns); `HeldJobs`
changes under its lock, from any thread that claims, takes a hand-off, records or releases.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import ssl
import threading
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from redis.exceptions import AuthenticationError

from ..engine.store import Queue, known_queues
from ..exceptions import VALKEY_DOWN, ConfigurationError
from ..options import seconds, validate_lease, whole_number
from ..records import Lease
from .recycling import MEMORY_FLOOR_MB

log = logging.getLogger("jobqueue.worker")


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
    max_jobs: int | None = None
    """Jobs one worker process runs before a fresh one takes its place (`recycling.py`)."""
    max_memory: int | None = None
    """Resident MB past which a worker process (and a pool process) makes way for a fresh one."""

    def __post_init__(self) -> None:
        whole_number(self.concurrency, "concurrency", 1)
        if self.max_jobs is not None:
            whole_number(self.max_jobs, "max_jobs", 1)
        if self.max_memory is not None:
            whole_number(self.max_memory, "max_memory (MB)", MEMORY_FLOOR_MB)
        if self.prefetch is not None:
            whole_number(self.prefetch, "prefetch", 0)
        if self.lease is not None:
            validate_lease(self.lease)
        seconds(self.grace, "grace", low=0, high=86_400)

    @property
    def capacity(self) -> int:
        """How many claimed jobs the worker holds at most (running plus prefetched)."""
        return self.concurrency + (self.concurrency if self.prefetch is None else self.prefetch)

    @property
    def recycles(self) -> bool:
        """Whether a limit makes its process make way for a fresh one (`recycling.py`)."""
        return self.max_jobs is not None or self.max_memory is not None

    @property
    def batch(self) -> int:
        """Room a claim waits for (one claim serves many jobs), and successes that make an ack
        call of their own."""
        return max(1, self.capacity // 4)


class Served:
    """The queues a worker claims from, in the order it serves them, and how many shards of
    each it claims from (a resize changes that: each maintenance turn reads it again)."""

    def __init__(self) -> None:
        self.queues: list[Queue] = []
        self.shards: dict[str, int] = {}
        self._by_name: dict[str, Queue] = {}

    def add(self, queue: Queue, shards: int | None = None) -> None:
        """Serve `queue` too (`shards`: its claimable shard count, read from Valkey if None)."""
        self.shards[queue.name] = queue.claim_shards() if shards is None else shards
        self._by_name[queue.name] = queue
        self.queues.append(queue)

    def queue(self, name: str) -> Queue:
        return self._by_name[name]


def find_queues(config: WorkerConfig, stop: threading.Event) -> list[tuple[Queue, int]] | None:
    """The configured (or every known) queues and their claimable shard counts. A worker may
    start before Valkey does: wait for it, as after a restart (None: stopped meanwhile)."""
    delay = 0.1
    while True:
        try:
            names = config.queues or tuple(known_queues())
            return [(queue, queue.claim_shards()) for queue in map(Queue, names)]
        except AuthenticationError as exc:  # waiting would not help: say so and stop
            raise ConfigurationError(f"Valkey refused the credentials in the URL: {exc}") from None
        except VALKEY_DOWN as exc:
            if isinstance(exc.__context__, ssl.SSLCertVerificationError):
                raise ConfigurationError(
                    f"Valkey's TLS certificate is not trusted (name the CA file in the URL: "
                    f"?ssl_ca_certs=/path/ca.pem): {exc}") from None
            log.warning("Valkey unreachable at start (%s); retrying", exc)
            if stop.wait(delay):
                return None
            delay = min(delay * 2, 5.0)


@dataclass
class Held:
    """A claimed job a worker holds: prefetched (not started) or running."""

    lease: Lease
    lost: bool = False
    """Its lease was found stale: the job may run again elsewhere."""


class HeldJobs:
    """The jobs a worker holds, from their claim (or hand-off) until their outcome is recorded
    or they are released: what its capacity and each queue's `concurrency` count, what the
    heartbeat renews and what presence lists. Each run is held by its job id and token: a run
    whose lease lapsed while it ran and the run of the same job this worker claimed again are
    two runs, each renewed, recorded and forgotten by its own token."""

    def __init__(self, capacity: int, concurrency: int) -> None:
        self.capacity, self.concurrency = capacity, concurrency
        self.jobs: dict[tuple[str, int], Held] = {}
        """By (job id, token); read freely, changed under `lock`."""
        self.per_queue: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.room = threading.Event()
        """Set while the worker may hold more (the waiters wait for it); set at start."""
        self.planned = math.inf
        """The lease (seconds) the heartbeat's current wait was planned for (a third of it)."""
        self.sooner = threading.Event()
        """Set when a job joins whose lease is shorter than `planned` (the heartbeat must plan
        its wait again, or that lease lapses first), and when the worker stops."""
        self.overrunning = 0
        """Runs past their timeout whose thread still runs (`deadlines.py`): their outcome is
        recorded and they are held no more, but each keeps its runner thread until it returns,
        so the worker never runs more threads than its concurrency."""

    @property
    def free(self) -> int:
        """How many more jobs the worker may hold: its capacity, less each overrunning thread's
        runner and its share of prefetch (a job claimed for a thread that cannot start it would
        only wait), less the jobs held. A queue's `concurrency` counts held jobs only: an
        overrunning run of the queue no longer counts there."""
        running = self.concurrency - self.overrunning
        return self.capacity * max(running, 0) // self.concurrency - len(self.jobs)

    @property
    def idle(self) -> bool:
        """Whether the worker holds no job and has a thread free to start one (an idle worker
        offers itself for hand-offs: `waiters.py`)."""
        return not self.jobs and self.overrunning < self.concurrency

    def start(self, lease: Lease) -> Lease:
        """A held job's run starts now: its lease with its deadline counted from now
        (`Lease.started`), held so (the heartbeat tells the server the time left)."""
        run = lease.started()
        if run is not lease:
            with self.lock:
                held = self.jobs.get((lease.job_id, lease.token))
                if held is not None:
                    held.lease = run
        return run

    def overrun(self) -> None:
        """A run passed its timeout on a thread that cannot be stopped: its thread stays taken
        (changed under `lock`) until `overrun_returned`."""
        with self.lock:
            self.overrunning += 1
            if self.free <= 0:
                self.room.clear()

    def overrun_returned(self) -> None:
        """An overrunning run's thread returned: it may start jobs again."""
        with self.lock:
            self.overrunning -= 1
            if self.free > 0:
                self.room.set()

    def add(self, leases: list[Lease]) -> bool:
        """Hold claimed jobs; whether the worker held none before (it is busy now)."""
        with self.lock:
            fell_busy = bool(leases) and not self.jobs
            for lease in leases:
                key = (lease.job_id, lease.token)
                if key not in self.jobs:
                    self.jobs[key] = Held(lease)
                    self.per_queue[lease.queue] += 1
                    if lease.lease < self.planned:
                        self.planned = lease.lease
                        self.sooner.set()
            if self.free <= 0:
                self.room.clear()
        return fell_busy

    def plan(self, default: float) -> float:
        """The shortest lease held (`default` when none is), noted as what the heartbeat's
        wait is planned for from now (a job that joins with a shorter one sets `sooner`)."""
        with self.lock:
            shortest = min((held.lease.lease for held in self.jobs.values()), default=default)
            self.planned = shortest
        return shortest

    def forget(self, leases: Iterable[Lease]) -> None:
        """Drop jobs the worker no longer holds (recorded or released); their slots are free."""
        with self.lock:
            for lease in leases:
                if self.jobs.pop((lease.job_id, lease.token), None) is not None:
                    self.per_queue[lease.queue] -= 1
            if not self.room.is_set() and self.free > 0:  # (set() takes its lock and
                self.room.set()  # notifies even when set)

    def wake(self) -> None:
        """The worker stops: end the waits on these jobs' room (waiters) and leases (heartbeat)."""
        self.room.set()
        self.sooner.set()

    def leases(self, most: int | None = None) -> list[Lease]:
        """The leases held (the first `most` of them)."""
        with self.lock:
            return [held.lease for held in list(self.jobs.values())[:most]]


DRAINED = 0.05
"""Seconds a queue whose claim came back short is not asked again by the main loop, unless a
wake token for it arrives or a hand-off brings one of its jobs first."""


class Drained:
    """Queues the main loop does not ask for now: those whose last claim came back short, for
    DRAINED (a busy worker serving many queues then does not make a round trip per empty queue
    per claim; an enqueue wakes a worker at once through its shard's wake list: `waiters.py`),
    and those their rate limit holds back, until its next token. A claim after a wake token asks
    its shard whatever this says (the token is news of work)."""

    def __init__(self) -> None:
        self._until: dict[str, float] = {}

    def skip(self, name: str, now: float) -> bool:
        return now < self._until.get(name, 0.0)

    def mark(self, name: str, until: float) -> None:
        self._until[name] = until

    def clear(self, name: str) -> None:
        self._until.pop(name, None)

    def refill(self, queues: Iterable[Queue], now: float) -> float | None:
        """When the first queue held back by its rate limit may be asked again (None: none)."""
        return min((until for q in queues if q.rate_wait
                    and (until := self._until.get(q.name, 0.0)) > now), default=None)
