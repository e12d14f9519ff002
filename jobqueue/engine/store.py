"""`Queue`: the job-state transitions on Valkey, one script call (one round trip) each.

The `@job` API, the worker, the mirror, the admin and the `django.tasks` backend change a job's
state only through these methods, and read a job and its counts through them; `scripts.caller`
sends the scripts. Other modules touch Valkey keys for what their docstrings say: `layouts`
(shard layouts, resizes, the queue registry), `handoff` (idle workers' offers and hand-off
lists), `backlog` (lane heads, minute samples), `lanes` (lane caps set live, slots in use),
`console.readmodels` (the console's read models), `operations.metrics`, `history.mirror` (the
`done` streams), `operations.autoscale`, `operations.schedule`, `refs` (awaiting results), the
`flows` room (`graph`, `relay`, `members`), `api.handler` (progress), and the worker's waits
and presence (`worker/waiters.py`, `worker/waitline.py`,
`worker/presence.py`).
"""

from __future__ import annotations

import secrets
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from .. import ids, signals, spec
from ..conf import get_client, get_config
from ..exceptions import VALKEY_DOWN, InvalidOption, InvalidTransition, JobNotFound
from ..keys import ShardKeys, validate_queue
from ..records import COUNT_FIELDS, COUNTS_REPLY, JobInfo, Lease, ms_to_dt, text
from ..spec import MAX_DELAY, JobSpec, Prepared, dumps, prepare, validate_lease, validate_priority
from ..spec import seconds as _seconds
from . import lanes, layouts, sending
from .claims import LostClaims
from .layouts import known_queues
from .refs import JobRef
from .scripts import caller

__all__ = ["JobInfo", "JobRef", "JobSpec", "Lease", "Queue", "known_queues"]

ACKED = {1: "succeeded", 2: "succeeded", 3: "cancelled", 4: "cancelled"}
"""What an ack's answer recorded (0: nothing, the lease was stale); 2 and 4 also forwarded
outcomes to dependents on other shards (relay.py)."""
FORWARDED = (2, 4)
READ_SLACK = 5.0
"""Seconds a wake wait's reply may take beyond the wait itself (the read timeout it gets)."""
OPERATOR_SENDS = 3
"""How many times an operator's transition is sent when its reply is lost (see `_operator`)."""


def _announced(refs: list[JobRef]) -> list[JobRef]:
    """New jobs, told to the `job_enqueued` receivers (if any)."""
    if signals.job_enqueued.receivers and signals.job_enqueued.has_listeners(Queue):
        for ref in refs:
            if ref.created:
                signals.send(signals.job_enqueued, Queue, ref=ref)
    return refs


def _retention_ms() -> int:
    """How long a finished job's row stays in Valkey, in ms."""
    return round(get_config().retention * 1000)


def _dead_retention_ms() -> int:
    """How long a dead job's row stays in Valkey, in ms."""
    return round(get_config().dead_retention * 1000)


def _read_claim(name: str, index: int, reply: list[Any], carried: list[int],
                answers: list[int]) -> tuple[int, list[Lease]]:
    """A claim's reply on shard `index`: the answers of the acks it carried (set in
    `answers`), then (ms until the rate limit admits another job, 0 when not limited; the
    leases)."""
    n = int(reply[0])
    for i, ok in zip(carried, reply[1 : 1 + n], strict=True):
        answers[i] = int(ok)
    rows = reply[2 + n :]
    return int(reply[1 + n]), [Lease.from_claim(name, index, *rows[r : r + 5])
                               for r in range(0, len(rows), 5)]


def nack_forwarding(queue: Queue, lease: Lease, error: str = "", retry_in: float | None = None,
                    *, fatal: bool = False) -> tuple[str | None, bool]:
    """`Queue.nack`, and whether the failure forwarded its outcome to dependents on other
    shards (the worker relays at once, as after an ack that answered 2: relay.py)."""
    retry_ms = -1 if retry_in is None else round(
        _seconds(retry_in, "retry_in", low=0, high=MAX_DELAY) * 1000)
    reply = caller.run(queue.client, "nack", queue.shard(lease.shard), [
        lease.job_id, lease.token, str(error)[:65_536], retry_ms, "1" if fatal else "0",
        _retention_ms(), _dead_retention_ms(), queue.options.max_attempts,
        round(queue.options.backoff * 1000),
    ])
    state, _, flag = str(reply or "").partition(":")
    return state or None, flag == "forwarded"


def _most_shard(acks: Sequence[tuple[Lease, str]]) -> int:
    """The shard that most of `acks` are on."""
    if len(acks) == 1:
        return acks[0][0].shard
    return Counter(held.shard for held, _ in acks).most_common(1)[0][0]


def _claim_head(queue: Queue, lease: float | None, override: bool, worker: str) -> list[Any]:
    """A claim's arguments after its count (claim.lua, ARGV[2] on, up to the successes), kept
    on the queue while the config, these and its live shard count stay the same: a worker at
    concurrency 1 claims once per job."""
    config, live = get_config(), queue.shards
    key = (lease, override, worker, live)
    kept = queue.claim_head
    if kept is not None and kept[0] is config and kept[1] == key:
        return kept[2]
    head = [queue.lease_ms(lease), "1" if override else "0", worker, _dead_retention_ms(),
            _retention_ms(), *spec.claim_policy(queue.options, live)]
    queue.claim_head = (config, key, head)
    return head


class Queue:
    """A named queue over N Valkey shards; one method per job-state transition."""

    def __init__(self, name: str, *, client: Any = None, shards: int | None = None) -> None:
        self.name = validate_queue(name)
        self.options = get_config().queue(name)
        self.configured = shards or self.options.shards
        """The shard count until the queue's first resize (then the live count in Valkey rules)."""
        self._client = client
        self._next_shard = 0
        self.claim_head: tuple[Any, tuple[Any, ...], list[Any]] | None = None  # (_claim_head)
        self.rate_wait: float = 0.0
        """After a claim: seconds until the rate limit (or, when it came back short, a lane's
        rate) admits another job (0: not limited)."""
        self.lost_claims = LostClaims()

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
        return self.enqueue_many([JobSpec(payload, **options)])[0]

    def enqueue_many(self, specs: Iterable[JobSpec]) -> list[JobRef]:
        """Add many jobs: validated first (all or none), then one script call per shard chunk
        (a lone job goes `enqueue_encoded`'s way)."""
        limit = get_config().max_payload
        jobs = [prepare(job, self.options, limit) for job in specs]
        if len(jobs) == 1:
            job = jobs[0]
            return [self.enqueue_encoded(job, job.job_id, job.payload, job.argv(self.options)[2:])]
        return self.enqueue_prepared(jobs)

    def enqueue_encoded(self, template: Prepared, job_id: str, payload: str,
                        tail: Sequence[Any]) -> JobRef:
        """One job, encoded: its id, its payload as JSON, and `tail`, the rest of `template`'s
        script arguments, which a handler works out once for all its calls
        (`JobFunction.enqueue`): a call makes no `Prepared` (see `sending.send_one`)."""
        return _announced([sending.send_one(self.client, self.name, self.options, self.configured,
                                            template, job_id, payload, tail)])[0]

    def enqueue_prepared(self, jobs: list[Prepared], *, fresh: bool = False) -> list[JobRef]:
        """Jobs validated already (`spec.prepare`), in one script call per shard chunk (see
        `sending.send`; `fresh`: ids chosen by the caller that no shard can hold yet)."""
        return _announced(sending.send(self.client, self.name, self.options, self.configured,
                                       jobs, fresh=fresh))

    # -- worker side -----------------------------------------------------------------------

    def dequeue(self, count: int = 1, lease: float | None = None, worker: str = "",
                *, override_lease: bool = False, shards: int | None = None) -> list[Lease]:
        """Claim up to `count` ready jobs, lanes served round-robin, shards in rotation.
        `shards` (the worker passes it) saves looking up how many shards hold work."""
        return self.ack_and_dequeue([], count, lease, worker, override_lease=override_lease,
                                    shards=shards)[1]

    def ack_and_dequeue(self, acks: Sequence[tuple[Lease, str]], count: int,
                        lease: float | None = None, worker: str = "", *,
                        override_lease: bool = False, shards: int | None = None,
                        only: int | None = None) -> tuple[list[int], list[Lease]]:
        """Record successes (results already encoded as JSON) and claim up to `count` jobs:
        the successes on the shard the claim starts from ride in its script call (one round
        trip), the others go in one ack call per shard. The claim asks only shard `only` when
        given (where a wake token came from); else it starts where most successes are, or at
        the next shard in turn, and goes on until it has `count`. Returns (acks' answers as
        `ack_encoded`'s, leases)."""
        if not isinstance(count, int) or count < 1:
            raise InvalidOption(f"count must be a positive integer, got {count!r}")
        total = shards or self.claim_shards()
        if only is not None:
            start = only % total
        elif acks:  # start where most successes are: they ride along
            start = _most_shard(acks) % total
        else:
            start = self._next_shard = (self._next_shard + 1) % total
        riding = [i for i, (held, _) in enumerate(acks) if held.shard == start]
        answers = [0] * len(acks)
        if len(riding) < len(acks):
            others = [i for i, (held, _) in enumerate(acks) if held.shard != start]
            for i, ok in zip(others, self.ack_encoded([acks[i] for i in others]), strict=True):
                answers[i] = ok
        out: list[Lease] = []
        waits, head = [], _claim_head(self, lease, override_lease, worker)
        for step in range(1 if only is not None else total):
            if len(out) >= count:
                break
            index = (start + step) % total
            carried = riding if step == 0 else []
            try:
                reply = self.lost_claims.send(self.client, self.shard(index), worker,  # claims.py
                                              [count - len(out), *head], (acks[i] for i in carried))
            except VALKEY_DOWN:
                if step == 0:
                    raise
                break  # (what earlier shards leased is this worker's; that claim is recovered)
            wait, leases = _read_claim(self.name, index, reply, carried, answers)
            waits.append(wait)
            out.extend(leases)
        # Rate-limited when every shard asked said so, or when the claim came back short and a
        # shard's limits hold work back (a lane's rate too): then the soonest refill is the wait.
        limited = [w for w in waits if w] if len(out) < count else waits
        self.rate_wait = min(limited) / 1000 if limited and all(limited) else 0.0
        return answers, out

    def lease_ms(self, lease: float | None = None) -> int:
        """A claim's default lease in ms: the worker's, else the queue's."""
        return round(validate_lease(lease if lease is not None else self.options.lease) * 1000)

    def ack(self, lease: Lease, result: Any = None) -> bool:
        """Record success; False when the lease is stale (the job was re-claimed)."""
        return self.ack_many([(lease, result)])[0]

    def ack_many(self, items: Sequence[tuple[Lease, Any]]) -> list[bool]:
        """Record many successes with one script call per shard."""
        encoded = [(lease, dumps(result, "result")) for lease, result in items]
        return [ok > 0 for ok in self.ack_encoded(encoded)]

    def ack_encoded(self, items: Sequence[tuple[Lease, str]]) -> list[int]:
        """`ack_many` for results already encoded as JSON (the worker encodes them once): per
        job 0 stale, 1 recorded succeeded, 3 recorded cancelled (an operator flagged the run),
        each plus 1 when outcomes were forwarded to other shards (`ACKED`, relay.py)."""
        return [int(ok) for ok in caller.run_by_shard(
            self.client, "ack", self.name, [_retention_ms()],
            [(lease.shard, [lease.job_id, lease.token, encoded]) for lease, encoded in items])]

    def nack(self, lease: Lease, error: str = "", retry_in: float | None = None,
             *, fatal: bool = False) -> str | None:
        """Record a failure: the job's new state, or None when the lease is stale."""
        return nack_forwarding(self, lease, error, retry_in, fatal=fatal)[0]

    def extend(self, lease: Lease, seconds: float) -> bool:
        """Renew a lease for `seconds` from now (server clock); False when stale."""
        return self.extend_many([lease], seconds)[0] in (1, 2)

    def extend_many(self, leases: Sequence[Lease], seconds: float) -> list[int]:
        """Renew many leases, one call per shard: 1 renewed, 2 renewed but cancel requested, 3 not
        renewed because that attempt has already finished (acked meanwhile), 0 stale."""
        ms = round(validate_lease(seconds) * 1000)
        return [int(code) for code in caller.run_by_shard(
            self.client, "extend", self.name, [],
            [(lease.shard, [lease.job_id, lease.token, ms]) for lease in leases])]

    def cancel_requested(self, lease: Lease) -> bool:
        """Whether an operator asked to cancel the attempt `lease` holds (a plain read)."""
        cancel, attempts = self.client.hmget(self.shard(lease.shard).job(lease.job_id),
                                             "cancel", "attempts")
        return cancel == "1" and attempts == str(lease.token)

    def checkpoint(self, lease: Lease, data: Any, extend: float | None = None) -> bool:
        """Store a running job's progress on its row; a re-run sees it. False when stale."""
        ms = 0 if extend is None else round(validate_lease(extend) * 1000)
        return bool(caller.run(self.client, "checkpoint", self.shard(lease.shard),
                               [lease.job_id, lease.token, dumps(data, "checkpoint"), ms]))

    def release(self, lease: Lease) -> bool:
        """Hand a claimed job back without charging its retry budget; its token stays spent."""
        return self.release_many([lease])[0]

    def release_many(self, leases: Sequence[Lease]) -> list[bool]:
        return [bool(ok) for ok in caller.run_by_shard(
            self.client, "release", self.name, [_retention_ms()],
            [(lease.shard, [lease.job_id, lease.token]) for lease in leases])]

    # -- maintenance -----------------------------------------------------------------------

    def reap(self, limit: int = 1000, shards: int | None = None) -> int:
        """Expired leases go back to waiting (or dead when spent); returns how many."""
        args = [limit, _retention_ms(), _dead_retention_ms(), self.options.max_attempts]
        return sum(int(caller.run(self.client, "reap", self.shard(i), args))
                   for i in range(shards or self.claim_shards()))

    def promote(self, limit: int = 1000, shards: int | None = None) -> int:
        """Due scheduled jobs move to their lanes; returns how many."""
        return sum(self.promote_shard(i, limit)[0] for i in range(shards or self.claim_shards()))

    def promote_shard(self, index: int, limit: int = 1000) -> tuple[int, float | None]:
        """Promote one shard: (moved, seconds until its next scheduled job or None)."""
        moved, wait_ms = caller.run(self.client, "promote", self.shard(index), [limit])
        return int(moved), (None if int(wait_ms) < 0 else int(wait_ms) / 1000)

    # -- operator side ---------------------------------------------------------------------

    def retry(self, job_id: str) -> str:
        """A dead, cancelled or expired job goes back to pending with a fresh retry budget, on its
        own shard (a retired one is claimed from again, once the job is pending there); a
        durable row reopens with it."""
        index = self.locate(job_id)
        if index is None or not self.options.durable:
            answer = self._operator("retry", job_id, [job_id], index)
        else:
            from ..models import reopened

            ended = ms_to_dt(self.client.hget(self.shard(index).job(job_id), "finished_at"))
            with reopened(job_id, after=ended):  # (so `restore` finds it: models.reopened)
                answer = self._operator("retry", job_id, [job_id], index)
        layouts.reopen(self.client, self.name, self.configured, index or 0)  # (None: raised)
        return answer

    def reprioritize(self, job_id: str, priority: int) -> str:
        """Change a job's priority in place: pending (rescored), scheduled, running or waiting
        for its dependencies (for when it is ready)."""
        return self._operator("reprioritize", job_id, [job_id, validate_priority(priority)])

    def cancel(self, job_id: str) -> str:
        """Cancel a waiting job now; flag an active one so its outcome is recorded as cancelled."""
        return self._operator("cancel", job_id, [job_id, _retention_ms()])

    def _operator(self, name: str, job_id: str, args: list[Any], index: int | None = -1) -> str:
        """An operator's transition on the job's shard (`index`, when the caller located it), the
        call's id last, sent again while its reply is lost (`caller.run_answered`)."""
        index, args = self.locate(job_id) if index == -1 else index, [*args, secrets.token_hex(8)]
        answer = "missing" if index is None else text(caller.run_answered(
            self.client, name, self.shard(index), args, OPERATOR_SENDS))[0]
        if answer == "missing":
            raise JobNotFound(f"no live job {job_id} in queue {self.name!r}")
        if answer.startswith("state:"):
            raise InvalidTransition(f"cannot {name} job {job_id}: it is {answer[6:]}")
        if answer.startswith("corrupt:"):
            raise InvalidTransition(f"cannot {name} job {job_id}: its field {answer[8:]} is corrupt")
        return str(answer[3:])

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
        reply = dict(zip(COUNTS_REPLY, caller.run(self.client, "counts", self.shard(index), []),
                         strict=False))
        return {name: int(reply.get(name, 0)) for name in COUNT_FIELDS}

    def get(self, job_id: str) -> JobInfo | None:
        """The live row of a job, or None when Valkey holds none (expired or unknown)."""
        ids.validate_job_id(job_id)
        for index in self._candidates(job_id):
            row = self.client.hgetall(self.shard(index).job(job_id))
            if row:
                return JobInfo.from_row(job_id, self.name, row, index, self.options.max_attempts)
        return None
