"""`Queue`: the job-state transitions on Valkey, one script call (one round trip) each.

The `@job` API, the worker, the mirror, the admin and the `django.tasks` backend change a job's
state only through these methods, and read a job and its counts through them: each calls a
script's twin (`scripts.calls`, `scripts.operator_calls`); the worker's side of a queue, its
claimed jobs, is `self.leases` (leases.py); a handler's enqueue goes through its `Template`.
Other modules touch Valkey keys for what their docstrings say: `layouts` (shard layouts,
resizes, the queue registry), `handoff` (idle workers' offers and hand-off lists), `backlog`
(lane heads, minute samples), `lanes` (lane caps set live, slots in use), `console.readmodels`
(the console's read models), `operations.metrics`, `history.mirror` (the `done` streams),
`operations.autoscale`, `operations.schedule`, `refs` (awaiting results), the `flows` room
(`graph`, `relay`, `members`), `api.handler` (progress), and the worker's waits and presence
(`worker/waiters.py`, `worker/waitline.py`, `worker/presence.py`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from .. import ids, signals
from ..conf import get_client, get_config
from ..keys import ShardKeys, validate_queue
from ..options import validate_priority
from ..records import COUNT_FIELDS, JobInfo, Lease, ms_to_dt
from ..spec import JobSpec, Prepared, prepare, sealed
from . import lanes, layouts, permits, sending
from .claims import LostClaims
from .layouts import known_queues
from .leases import Leases, dead_retention_ms, retention_ms
from .refs import JobRef
from .scripts import calls, operator_calls
from .scripts.answers import Acked, Extended, refused

__all__ = ["JobInfo", "JobRef", "JobSpec", "Lease", "Queue", "known_queues"]

READ_SLACK = 5.0
"""Seconds a wake wait's reply may take beyond the wait itself (the read timeout it gets)."""


def _announced(refs: list[JobRef]) -> list[JobRef]:
    """New jobs, told to the `job_enqueued` receivers (if any)."""
    if signals.job_enqueued.receivers and signals.job_enqueued.has_listeners(Queue):
        for ref in refs:
            if ref.created:
                signals.send(signals.job_enqueued, Queue, ref=ref)
    return refs


class Queue:
    """A named queue over N Valkey shards; one method per job-state transition."""

    def __init__(self, name: str, *, client: Any = None, shards: int | None = None) -> None:
        self.name = validate_queue(name)
        self.options = get_config().queue(name)
        self.configured = shards or self.options.shards
        """The shard count until the queue's first resize (then the live count in Valkey rules)."""
        self._client = client
        self.leases = Leases(self)
        """The worker's side: claims, outcomes and renewals of claimed jobs (leases.py)."""

    def __repr__(self) -> str:
        return f"Queue({self.name!r}, shards={self.shards})"

    @property
    def client(self) -> Any:
        return self._client if self._client is not None else get_client()

    def shard(self, index: int) -> ShardKeys:
        return ShardKeys(self.name, index)

    # -- placement -------------------------------------------------------------------------

    def layout(self, *, fresh: bool = False) -> layouts.Layout:
        """The live shard layout (read at most once a second; `fresh` reads it now)."""
        return layouts.read(self.client, self.name, self.configured, fresh=fresh)

    @property
    def shards(self) -> int:
        """Shards that take new jobs now."""
        return self.layout().live

    def claim_shards(self) -> int:
        """How many shards workers claim from: the live ones and those still draining."""
        return self.layout().span

    def all_shards(self) -> int:
        """How many shards the queue ever had: where its jobs' rows (dead ones included) and
        counters may be, for lookups, counts and the console."""
        return self.layout().widest

    def _candidates(self, job_id: str) -> Iterator[int]:
        """Shards that may hold a job: its id's shard, then (if asked) all others, retired too."""
        return layouts.candidates(self.client, self.name, self.configured, job_id)

    def locate(self, job_id: str) -> int | None:
        """The shard holding a live row for `job_id`, or None."""
        ids.validate_job_id(job_id)
        for index in self._candidates(job_id):
            if self.client.exists(self.shard(index).job(job_id)):
                return index
        return None

    # -- producer side ---------------------------------------------------------------------

    def enqueue(self, payload: Any, **options: Any) -> JobRef:
        """Add one job (see JobSpec for the options); a live unique_key returns that job."""
        return self.enqueue_prepared([prepare(JobSpec(payload, **options), self.options,
                                              get_config().max_payload)])[0]

    def enqueue_many(self, specs: Iterable[JobSpec]) -> list[JobRef]:
        """Add many jobs: validated first (all or none), then one script call per shard chunk."""
        limit = get_config().max_payload
        return self.enqueue_prepared([prepare(job, self.options, limit) for job in specs])

    def enqueue_prepared(self, jobs: list[Prepared], *, fresh: bool = False) -> list[JobRef]:
        """Jobs validated already (`spec.prepare`): a lone one the short way (`Template`'s),
        else in one script call per shard chunk (see `sending.send`; `fresh`: ids chosen by the
        caller that no shard can hold yet)."""
        if len(jobs) == 1 and not fresh:
            job = jobs[0]
            tail = calls.encoded(job, self.options.max_attempts,
                                 round(self.options.backoff * 1000))[2:]  # (enqueue_tail's)
            return _announced([sending.send_one(self.client, self.name, self.options,
                                                self.configured, job, job.job_id, job.payload,
                                                tail)])
        return _announced(sending.send(self.client, self.name, self.options, self.configured,
                                       jobs, fresh=fresh))

    # -- worker side: `self.leases` (leases.py) ----------------------------------------------

    @property
    def rate_wait(self) -> float:
        """After a claim: seconds until the rate limit admits another job (0: not limited)."""
        return self.leases.rate_wait

    @property
    def lost_claims(self) -> LostClaims:
        return self.leases.lost_claims

    def dequeue(self, count: int = 1, lease: float | None = None, worker: str = "",
                *, override_lease: bool = False, shards: int | None = None) -> list[Lease]:
        """Claim up to `count` ready jobs, lanes served round-robin, shards in rotation.
        `shards` (the worker passes it) saves looking up how many shards hold work."""
        return self.leases.ack_and_dequeue([], count, lease, worker, override_lease=override_lease,
                                           shards=shards)[1]

    def ack_and_dequeue(self, acks: Sequence[tuple[Lease, str]], count: int,
                        lease: float | None = None, worker: str = "", *,
                        override_lease: bool = False, shards: int | None = None,
                        only: int | None = None) -> tuple[list[Acked], list[Lease]]:
        """Record successes and claim up to `count` jobs (`Leases.ack_and_dequeue`)."""
        return self.leases.ack_and_dequeue(acks, count, lease, worker, override_lease=override_lease,
                                           shards=shards, only=only)

    def ack(self, lease: Lease, result: Any = None) -> bool:
        """Record success; False when the lease is stale (the job was re-claimed)."""
        return self.leases.ack_many([(lease, result)])[0]

    def ack_many(self, items: Sequence[tuple[Lease, Any]]) -> list[bool]:
        """Record many successes with one script call per shard."""
        return self.leases.ack_many(items)

    def ack_encoded(self, items: Sequence[tuple[Lease, str]]) -> list[Acked]:
        """`ack_many` for results already encoded as JSON: per job its `Acked`."""
        return self.leases.ack_encoded(items)

    def nack(self, lease: Lease, error: str = "", retry_in: float | None = None,
             *, fatal: bool = False) -> str | None:
        """Record a failure: the job's new state, or None when the lease is stale."""
        return self.leases.nack(lease, error, retry_in, fatal=fatal).state

    def extend(self, lease: Lease, seconds: float) -> bool:
        """Renew a lease for `seconds` from now (server clock); False when stale."""
        return self.leases.extend_many([lease], seconds)[0] in (
            Extended.RENEWED, Extended.CANCEL_REQUESTED)

    def extend_many(self, leases: Sequence[Lease], seconds: float) -> list[Extended]:
        """Renew many leases, one call per shard (`answers.Extended` for each)."""
        return self.leases.extend_many(leases, seconds)

    def cancel_requested(self, lease: Lease) -> bool:
        return self.leases.cancel_requested(lease)

    def checkpoint(self, lease: Lease, data: Any, extend: float | None = None) -> bool:
        """Store a running job's progress on its row; a re-run sees it. False when stale."""
        return self.leases.checkpoint(lease, data, extend)

    def release(self, lease: Lease) -> bool:
        """Hand a claimed job back without charging its retry budget; its token stays spent."""
        return self.leases.release_many([lease])[0]

    def release_many(self, leases: Sequence[Lease]) -> list[bool]:
        return self.leases.release_many(leases)

    def lease_ms(self, lease: float | None = None) -> int:
        return self.leases.lease_ms(lease)

    # -- maintenance -----------------------------------------------------------------------

    def reap(self, limit: int = 1000, shards: int | None = None) -> int:
        """Expired leases go back to waiting (or dead when spent); returns how many."""
        return sum(calls.reap(self.client, self.shard(i), limit, retention_ms(),
                              dead_retention_ms(), self.options.max_attempts,
                              round(self.options.backoff * 1000))
                   for i in range(shards or self.claim_shards()))

    def promote(self, limit: int = 1000, shards: int | None = None) -> int:
        """Due scheduled jobs move to their lanes; returns how many."""
        return sum(self.promote_shard(i, limit)[0] for i in range(shards or self.claim_shards()))

    def promote_shard(self, index: int, limit: int = 1000) -> tuple[int, float | None]:
        """Promote one shard: (moved, seconds until its next scheduled job or None)."""
        return calls.promote(self.client, self.shard(index), limit)

    # -- operator side ---------------------------------------------------------------------

    def retry(self, job_id: str, call_id: str = "") -> str:
        """A dead, cancelled or expired job goes back to pending with a fresh retry budget, on its
        own shard (a retired one is claimed from again, once the job is pending there); a
        durable row reopens with it. `call_id`: the call's own id (a bulk operation's: the
        same call made again within a minute answers as the first did), else a fresh one."""
        index = self._located("retry", job_id)
        call_id = call_id or operator_calls.call_id()
        if not self.options.durable:
            answer = operator_calls.retry(self.client, self.shard(index), job_id, call_id)
        else:
            from ..models import reopened

            ended = ms_to_dt(self.client.hget(self.shard(index).job(job_id), "finished_at"))
            with reopened(job_id, after=ended):  # (so `restore` finds it: models.reopened)
                answer = operator_calls.retry(self.client, self.shard(index), job_id, call_id)
        layouts.reopen(self.client, self.name, self.configured, index)
        return answer

    def reprioritize(self, job_id: str, priority: int) -> str:
        """Change a job's priority in place: pending (rescored), scheduled, running or waiting
        for its dependencies (for when it is ready)."""
        priority = validate_priority(priority)
        return operator_calls.reprioritize(self.client, self.shard(self._located(
            "reprioritize", job_id)), job_id, priority, operator_calls.call_id())

    def cancel(self, job_id: str, call_id: str = "") -> str:
        """Cancel a waiting job now; flag an active one so its outcome is recorded as cancelled
        (`call_id` as `retry` takes it)."""
        return operator_calls.cancel(self.client, self.shard(self._located("cancel", job_id)),
                                     job_id, retention_ms(), call_id or operator_calls.call_id())

    def retry_many(self, index: int, calls: Sequence[tuple[str, str]]) -> list[Any]:
        """`retry` of many jobs of shard `index` in one round trip, (job id, call id) each: each
        one's state after, or its refusal (not raised). Not for a durable queue's jobs, whose
        rows reopen with each retry (`retry`)."""
        answers = operator_calls.retry_many(self.client, self.shard(index), calls)
        layouts.reopen(self.client, self.name, self.configured, index)
        return answers

    def cancel_many(self, index: int, calls: Sequence[tuple[str, str]]) -> list[Any]:
        """`cancel` of many jobs of shard `index` in one round trip (as `retry_many`)."""
        return operator_calls.cancel_many(self.client, self.shard(index), calls, retention_ms())

    def _located(self, action: str, job_id: str) -> int:
        """The shard of a job an operator acts on; JobNotFound when none holds it."""
        index = self.locate(job_id)
        if index is None:
            raise refused(action, "missing", job_id, self.name)
        return index

    def pause(self) -> None:
        """Stop workers claiming from this queue (enqueue still works)."""
        for i in range(self.all_shards()):
            self.client.hset(self.shard(i).key("meta"), "paused", "1")

    def resume(self) -> None:
        """Let workers claim from this queue again; a wake token per shard tells the idle ones
        (an idle worker's main loop sleeps until a token or its next maintenance turn)."""
        with self.client.pipeline(transaction=False) as pipe:
            for i in range(self.all_shards()):
                pipe.hdel(self.shard(i).key("meta"), "paused")
                pipe.rpush(self.shard(i).key("wake"), "1")
                pipe.ltrim(self.shard(i).key("wake"), -16, -1)  # (capped as enqueues cap it)
            pipe.execute()

    def set_lane_concurrency(self, lane: str, cap: int | None) -> None:
        """Set one lane's cap live, kept in Valkey ("*": every named lane's; None: back to the
        settings' cap): `lanes.set_cap`, on every shard the queue has now (read afresh: a
        count cached a second ago may miss shards just added)."""
        lanes.set_cap(self.client, self.name, self.layout(fresh=True).widest, lane, cap)

    def set_global_concurrency(self, cap: int | None) -> None:
        """Set the queue's global cap live, kept in Valkey (None lifts it, whatever the
        settings say): `permits.set_cap`, marked on every shard the queue has now."""
        permits.set_cap(self.client, self.name, self.layout(fresh=True).widest, cap)

    def reset_global_concurrency(self) -> None:
        """Drop the global cap set live: the settings' `global_concurrency` holds again
        (`permits.clear_cap`)."""
        permits.clear_cap(self.client, self.name, self.layout(fresh=True).widest)

    def resize(self, count: int, by: str = "") -> layouts.Layout:
        """Set the live shard count (see `layouts.resize`); `by` says who, in its history."""
        return layouts.resize(self.client, self.name, self.configured, count, by)

    # -- reads -----------------------------------------------------------------------------

    def is_paused(self) -> bool:
        return self.client.hget(self.shard(0).key("meta"), "paused") == "1"

    def counts(self) -> dict[str, int]:
        """Jobs by state over all shards (succeeded/cancelled: totals since the queue began)."""
        shards = [self.shard_counts(i) for i in range(self.all_shards())]
        return {name: sum(counts.get(name, 0) for counts in shards) for name in COUNT_FIELDS}

    def shard_counts(self, index: int) -> dict[str, int]:
        reply = operator_calls.counts(self.client, self.shard(index))
        return {name: reply[name] for name in COUNT_FIELDS}

    def get(self, job_id: str) -> JobInfo | None:
        """The live row of a job, or None when Valkey holds none (expired or unknown)."""
        ids.validate_job_id(job_id)
        for index in self._candidates(job_id):
            row = self.client.hgetall(self.shard(index).job(job_id))
            if row:
                return JobInfo.from_row(job_id, self.name, row, index, self.options.max_attempts)
        return None


class Template:
    """A handler's jobs as the enqueue script takes them, worked out once per configuration
    (`api.registry`): its options validated (`job`, whose id and payload each call gives) and
    their script fields after those two (`tail`: `calls.enqueue_tail`). A call then makes no
    `Prepared`: an id, a JSON payload, one script call (`sending.send_one`)."""

    __slots__ = ("job", "queue", "sealed", "tail")

    def __init__(self, queue: Queue, job: Prepared, *, sealed: bool = False) -> None:
        self.queue, self.job, self.tail = queue, job, calls.enqueue_tail(job, queue.options)
        self.sealed = sealed
        """Its jobs' args are sealed (sealing.py): `enqueue_sealed` takes them."""

    def enqueue_sealed(self, payload: dict[str, Any], max_payload: int) -> JobRef:
        """A job whose payload (a dict) is sealed for the id it is minted here."""
        job_id = ids.new_id()
        return self.enqueue(job_id, sealed(JobSpec(payload), job_id, max_payload))

    def enqueue(self, job_id: str, payload: str) -> JobRef:
        queue = self.queue
        return _announced([sending.send_one(queue.client, queue.name, queue.options,
                                            queue.configured, self.job, job_id, payload,
                                            self.tail)])[0]
