"""`Queue`: the job-state transitions on Valkey, one script call (one round trip) each.

Everything above this module (the `@job` API, the worker, the mirror, the admin, the
`django.tasks` backend) goes through these methods; none of it talks to Valkey keys directly.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Sequence
from functools import cache
from typing import Any, NamedTuple

from redis.cluster import RedisCluster
from redis.exceptions import ConnectionError as ValkeyConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as ValkeyTimeoutError

from . import ids, scripts, signals, wire
from . import layout as layouts
from .conf import QueueOptions, get_client, get_config
from .exceptions import InvalidOption, InvalidTransition, JobNotFound, JobQueueError, NotReplicated
from .keys import REGISTRY_KEY, ShardKeys, placement_hash, validate_queue
from .records import COUNT_FIELDS, JobInfo, JobRef, Lease, text
from .spec import MAX_DELAY, JobSpec, Prepared, dumps, prepare, validate_lease, validate_priority
from .spec import rate as spec_rate
from .spec import seconds as _seconds

__all__ = ["JobInfo", "JobRef", "JobSpec", "Lease", "Queue", "known_queues"]

ENQUEUE_CHUNK = 500
WAIT_MS = 1000
"""How long an enqueue of a `wait_replicas` queue waits for its replicas."""
LIVE_STATES = ("pending", "scheduled", "active")
READ_SLACK = 5.0
"""Seconds a wake wait's reply may take beyond the wait itself (the read timeout it gets)."""


def _announced(refs: list[JobRef]) -> list[JobRef]:
    """New jobs, told to the `job_enqueued` receivers (if any)."""
    if signals.job_enqueued.receivers and signals.job_enqueued.has_listeners(Queue):
        for ref in refs:
            if ref.created:
                signals.send(signals.job_enqueued, Queue, ref=ref)
    return refs


class _Bound(NamedTuple):
    """A transition script bound to one shard of a queue, for one client."""

    keys: tuple[str, ...]
    script: Any
    """redis-py's Script (loads the text again after a NOSCRIPT)."""
    client: Any
    head: tuple[Any, ...]
    """The call up to its arguments: EVALSHA, the SHA, the number of keys, the keys."""


@cache
def _claim_policy(options: QueueOptions, shards: int) -> tuple[Any, ...]:
    """The claim script's rate limit (each shard's share of N, the period) and lane weights (how
    many, then lane and weight for each), for a queue's options (a Queue is made per enqueue)."""
    weighted = [(lane, w) for lane, w in options.lane_weights if w > 1]
    limit = spec_rate(options.rate)
    return (*((limit[0] / shards, limit[1]) if limit else (0, 0)),
            len(weighted), *(x for pair in weighted for x in pair))


class Queue:
    """A named queue over N Valkey shards; one method per job-state transition."""

    def __init__(self, name: str, *, client: Any = None, shards: int | None = None) -> None:
        self.name = validate_queue(name)
        self.options = get_config().queue(name)
        self.configured = shards or self.options.shards
        """The shard count until the queue's first resize (then the live count in Valkey rules)."""
        self._client = client
        self._next_shard = 0
        self.rate_wait: float = 0.0
        """After a claim: seconds until the rate limit admits another job (0: not limited)."""
        self._scripts: dict[tuple[str, int], _Bound] = {}
        """(transition, shard) -> its call there (see `_script`)."""

    def __repr__(self) -> str:
        return f"Queue({self.name!r}, shards={self.shards})"

    @property
    def client(self) -> Any:
        return self._client if self._client is not None else get_client()

    def shard(self, index: int) -> ShardKeys:
        return ShardKeys(self.name, index)

    def _run(self, name: str, shard: ShardKeys, args: Sequence[Any]) -> Any:
        """One script call, loading the script on NOSCRIPT (a standalone client's goes the
        short way: see wire.py)."""
        client = self.client
        bound = self._script(client, name, shard)
        command = (*bound.head, *args)
        try:
            if isinstance(client, RedisCluster):
                return client.execute_command(*command)
            return wire.call(client, command)
        except NoScriptError:
            return bound.script(keys=bound.keys, args=list(args))

    def _script(self, client: Any, name: str, shard: ShardKeys) -> _Bound:
        """A transition's call on a shard, worked out once per Queue (a queue kept for many
        calls, as a handler's or a worker's, then builds and hashes nothing)."""
        bound = self._scripts.get((name, shard.index))
        if bound is None or bound.client is not client:
            keys, script = scripts.keys_for(name, shard), scripts.script(client, name)
            bound = _Bound(keys, script, client, ("EVALSHA", script.sha, len(keys), *keys))
            self._scripts[name, shard.index] = bound
        return bound

    def _run_many(self, name: str, shard: ShardKeys, calls: Iterable[list[Any]]) -> list[Any]:
        """Several calls of one script on one shard in a single round trip (a pipeline). Each
        call is sent as soon as `calls` yields it, so the server runs one while the next is
        built. The cluster client refuses scripts in pipelines, so there they go one by one."""
        if isinstance(self.client, RedisCluster):
            return [self._run(name, shard, args) for args in calls]
        bound = self._script(self.client, name, shard)
        keys, script = bound.keys, bound.script
        calls, built = iter(calls), []  # built: the calls sent (or being sent) so far

        def commands() -> Iterator[tuple[Any, ...]]:
            for args in calls:
                built.append(args)
                yield (*bound.head, *args)

        replies = wire.call_many(self.client, commands())
        if replies is None:  # every borrowed connection busy, or this one broke: a pipeline
            built.extend(calls)  # and the rest (one sent twice is harmless: its ids are there)
            pipe = self.client.pipeline(transaction=False)
            for args in built:
                script(keys=keys, args=args, client=pipe)
            return list(pipe.execute())
        for i, reply in enumerate(replies):
            if isinstance(reply, NoScriptError):  # loads the script, then calls it again
                replies[i] = self._run(name, shard, built[i])
            elif isinstance(reply, ResponseError):
                raise reply
        return replies

    def _run_replicated(self, shard: ShardKeys, calls: list[list[Any]]) -> tuple[list[Any], int]:
        """Enqueue calls then `WAIT` on the same connection (WAIT counts the replicas holding
        this connection's writes): (the calls' replies, replicas that confirmed). On a cluster
        the pipeline goes to the node that owns the shard's slot; if that node moved or died
        (a failover), the slot map is read again and the calls sent once more (an enqueue
        sent twice with the same ids adds nothing)."""
        bound = self._script(self.client, "enqueue", shard)
        keys, script = bound.keys, bound.script
        cluster = isinstance(self.client, RedisCluster)
        for attempt in (1, 2):
            target = self.client
            if cluster:
                target = target.get_redis_connection(target.get_node_from_key(keys[0]))
            pipe = target.pipeline(transaction=False)
            for args in calls:
                script(keys=keys, args=args, client=pipe)
            pipe.execute_command("WAIT", self.options.wait_replicas, WAIT_MS)
            try:
                *replies, acked = pipe.execute()
            except (ValkeyConnectionError, ValkeyTimeoutError, ResponseError) as exc:
                if not cluster or attempt == 2 or (isinstance(exc, ResponseError)
                                                   and not str(exc).startswith(("MOVED", "ASK"))):
                    raise
                self.client.nodes_manager.initialize()
                continue
            return replies, int(acked)
        raise AssertionError("unreachable")

    # -- placement -------------------------------------------------------------------------

    def layout(self, *, fresh: bool = False) -> layouts.Layout:
        """The live shard layout (read at most once a second; `fresh` reads it now)."""
        return layouts.read(self.client, self.name, self.configured, fresh=fresh)

    @property
    def shards(self) -> int:
        """Shards that take new jobs now."""
        return self.layout().live

    def place(self, job_id: str, lane: str, unique_key: str, shards: int | None = None) -> int:
        """The shard a job belongs to among `shards` (the live count), computed from its
        identity (never looked up)."""
        shards = shards or self.shards
        if shards == 1:
            return 0
        if lane:
            return placement_hash(lane) % shards
        if unique_key:
            return placement_hash(unique_key) % shards
        return ids.hash32(ids.decode(job_id)[1]) % shards

    def claim_shards(self) -> int:
        """How many shards workers claim from: the live ones and those still draining."""
        return self.layout().span

    def all_shards(self) -> int:
        """How many shards the queue ever had: where its jobs' rows (dead ones included) and
        counters may be, for lookups, counts and the console."""
        return self.layout().widest

    def _list(self, index: int, live: int) -> None:
        """Record the queue (and its widest shard count) in the registry the console lists, then
        mark shard `index` 'listed'. Its enqueue script answers whether the mark is there, so a
        queue is listed again after Valkey lost its data, at no cost to an enqueue otherwise."""
        seen = self.client.hget(REGISTRY_KEY, self.name)
        if seen is None or int(seen) < live:
            self.client.hset(REGISTRY_KEY, self.name, live)
        self.client.hset(self.shard(index).key("meta"), "listed", "1")

    def _candidates(self, job_id: str) -> Iterator[int]:
        """Shards that may hold a job, likeliest first: its id's shard, then (only if the caller
        asks for more) every other shard, draining and retired ones included."""
        first = ids.hash32(ids.decode(job_id)[1]) % self.shards  # the caller validated job_id
        yield first
        yield from (i for i in range(self.all_shards()) if i != first)

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
        """Add many jobs: validated first (all or none), then one script call per shard chunk."""
        limit = get_config().max_payload
        return self.enqueue_prepared([prepare(spec, self.options, limit) for spec in specs])

    def enqueue_prepared(self, prepared: list[Prepared]) -> list[JobRef]:
        """`enqueue_many` for jobs validated already (`spec.prepare`): one job goes the short
        way (`enqueue_made`), more in one script call per shard chunk (`_enqueue_all`)."""
        if len(prepared) == 1:
            job = prepared[0]
            return [self.enqueue_made(job, job.job_id, job.payload, job.argv(self.options)[2:])]
        return self._enqueue_all(prepared)

    def _enqueue_all(self, prepared: list[Prepared], moved: bool = False) -> list[JobRef]:
        """`moved`: a shard turned the job away already (its layout is read again first)."""
        refs: list[JobRef | None] = [None] * len(prepared)
        todo, not_prior, turned_away = list(range(len(prepared))), set(), 0
        replicated = wanted = self.options.wait_replicas
        now = self.layout()
        while todo:
            if moved:
                turned_away += 1
                # A shard that turned jobs away ('moved') is draining: read the layout again. A
                # resize marks its shards before it writes the layout, so retry a few times.
                if turned_away > 50:
                    raise JobQueueError(
                        f"queue {self.name!r}: its shards keep turning jobs away (a resize that "
                        f"did not finish?); nothing was enqueued twice")
                if turned_away > 2:
                    time.sleep(0.01 * turned_away)
                now = self.layout(fresh=True)
            by_shard: dict[tuple[int, str], list[int]] = defaultdict(list)
            for i in todo:
                job = prepared[i]
                home = self.place(job.job_id, job.lane, job.unique_key, now.live)
                if now.prior and (job.lane or job.unique_key) and i not in not_prior:
                    before = self.place(job.job_id, job.lane, job.unique_key, now.prior)
                    if before != home:
                        by_shard[before, "prior"].append(i)
                        continue
                by_shard[home, ""].append(i)
            todo, moved = [], False
            for (index, mode), positions in by_shard.items():
                again, acked = self._enqueue_on_shard(index, mode, prepared, positions, refs,
                                                      now.live)
                replicated = min(replicated, acked)
                if mode == "prior":
                    not_prior.update(again)  # absent there: to the live shard, next turn
                else:
                    moved = moved or bool(again)  # turned away, or an id collision (rare)
                todo.extend(again)
        out = [ref for ref in refs if ref is not None]
        if replicated < wanted:
            raise NotReplicated(
                f"queue {self.name!r}: {len(out)} job(s) written on the primary, but only "
                f"{replicated} of {wanted} replica(s) confirmed them within {WAIT_MS} ms", out)
        return _announced(out)

    def enqueue_made(self, template: Prepared, job_id: str, payload: str,
                     tail: Sequence[Any]) -> JobRef:
        """One job: its id, its payload as JSON, and the rest of its script arguments
        (`Prepared.argv` after the id and payload; a handler works them out once for all its
        calls, see `JobFunction.enqueue`, and `template` is the job they come from). It goes to
        its shard without a `Prepared` of its own; a resize in progress,
        `wait_replicas`, a shard that turns it away or a minted id already taken send it the
        batches' way (`_enqueue_all`), which handles each."""
        now, refused = self.layout(), False
        if not (now.prior or self.options.wait_replicas):
            index = self.place(job_id, template.lane, template.unique_key, now.live)
            ref = self._enqueue_one(index, [job_id, payload, *tail], now.live)
            if ref is not None:
                return _announced([ref])[0]
            refused = True
        return self._enqueue_all([template._replace(job_id=job_id, payload=payload)],
                                 moved=refused)[0]

    def _enqueue_one(self, index: int, argv: list[Any], live: int) -> JobRef | None:
        """One job sent to its shard without `enqueue_many`'s batching: its ref, or None when
        the loop must take it (a draining shard turned it away, or its minted id was taken)."""
        listed, job_id, status = self._run("enqueue", self.shard(index), ["", 1, *argv])
        if not listed:
            self._list(index, live)
        if status in ("moved", "collision"):
            return None
        return JobRef(job_id, self.name, created=status == "new")

    def _enqueue_on_shard(self, index: int, mode: str, prepared: list[Prepared],
                          positions: list[int], refs: list[JobRef | None],
                          live: int) -> tuple[list[int], int]:
        """Send a shard's jobs in chunks. Returns the positions to send again (an id collision,
        a draining shard, a lane or key absent from its prior shard) and, for a
        `wait_replicas` queue, how many replicas confirmed the writes."""
        chunks = [positions[s : s + ENQUEUE_CHUNK] for s in range(0, len(positions), ENQUEUE_CHUNK)]

        def calls() -> Iterator[list[Any]]:  # built one by one: see _run_many
            for chunk in chunks:
                args: list[Any] = [mode, len(chunk)]
                for i in chunk:
                    args.extend(prepared[i].argv(self.options))
                yield args

        retry: list[int] = []
        acked = self.options.wait_replicas
        if acked:
            replies, acked = self._run_replicated(self.shard(index), list(calls()))
        else:
            replies = self._run_many("enqueue", self.shard(index), calls())
        if not all(reply[0] for reply in replies):
            self._list(index, live)
        for chunk, reply in zip(chunks, replies, strict=True):
            for n, i in enumerate(chunk):
                job_id, status = reply[1 + 2 * n], reply[2 + 2 * n]
                if status == "collision":  # another process minted the same id: mint anew
                    prepared[i] = prepared[i]._replace(job_id=ids.new_id())
                    retry.append(i)
                elif status in ("moved", "absent"):
                    retry.append(i)
                else:
                    refs[i] = JobRef(job_id, self.name, created=status == "new")
        return retry, acked

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
                        only: int | None = None) -> tuple[list[bool], list[Lease]]:
        """Record successes (results already encoded as JSON) and claim up to `count` jobs:
        the successes on the shard the claim starts from ride in its script call (one round
        trip), the others go in one ack call per shard. The claim asks only shard `only` when
        given (where a wake token came from); else it starts where most successes are, or at
        the next shard in turn, and goes on until it has `count`. Returns (acks' answers,
        leases)."""
        if not isinstance(count, int) or count < 1:
            raise InvalidOption(f"count must be a positive integer, got {count!r}")
        lease_ms = self._lease_ms(lease)
        total = shards or self.claim_shards()
        if only is not None:
            start = only % total
        elif acks:  # start where most successes are: they ride along
            start = Counter(held.shard for held, _ in acks).most_common(1)[0][0] % total
        else:
            start = self._next_shard = (self._next_shard + 1) % total
        riding = [i for i, (held, _) in enumerate(acks) if held.shard == start]
        others = [i for i, (held, _) in enumerate(acks) if held.shard != start]
        answers = [False] * len(acks)
        for i, ok in zip(others, self.ack_encoded([acks[i] for i in others]), strict=True):
            answers[i] = ok
        out: list[Lease] = []
        waits = []
        policy = _claim_policy(self.options, self.shards)
        for step in range(1 if only is not None else total):
            if len(out) >= count:
                break
            index = (start + step) % total
            carried = riding if step == 0 else []
            args = self._claim_args(count - len(out), lease_ms, override_lease, worker, policy,
                                    [acks[i] for i in carried])
            reply = self._run("claim", self.shard(index), args)
            n = int(reply[0])
            for i, ok in zip(carried, reply[1 : 1 + n], strict=True):
                answers[i] = bool(ok)
            waits.append(int(reply[1 + n]))
            out.extend(self._leases(index, reply[2 + n :]))
        # Rate-limited when every shard asked said so: then the soonest refill is the wait.
        self.rate_wait = min(waits) / 1000 if waits and all(waits) else 0.0
        return answers, out

    def _lease_ms(self, lease: float | None) -> int:
        """A claim's default lease in ms: the worker's, else the queue's."""
        return round(validate_lease(lease if lease is not None else self.options.lease) * 1000)

    def _claim_args(self, count: int, lease_ms: int, override_lease: bool, worker: str,
                    policy: tuple[Any, ...], acks: Sequence[tuple[Lease, str]]) -> list[Any]:
        args: list[Any] = [count, lease_ms, "1" if override_lease else "0", worker,
                           self._dead_retention_ms(), self._retention_ms(), *policy, len(acks)]
        for held, result in acks:
            args += [held.job_id, held.token, result]
        return args

    def wait_commands(self, index: int, timeout: int, worker: str, *, idle: bool = False,
                      lease: float | None = None,
                      override_lease: bool = False) -> list[tuple[Any, ...]]:
        """A worker's wait on shard `index`, up to `timeout` s, for a wake token or a job handed
        to it (`after_wait` reads the last reply). `idle`: the worker first offers itself for
        hand-offs for that long (on the server clock), so that an enqueue that finds nothing
        else ready here leases the job to it and pushes it onto its list (see enqueue.lua):
        the job reaches the worker already leased, with no claim call."""
        shard = self.shard(index)
        wait = ("BLPOP", shard.hand(worker), shard.key("wake"), timeout)
        if not idle:
            return [wait]
        offer = f"{self._lease_ms(lease)}:{int(override_lease)}"
        return [("HSETEX", shard.key("idle"), "PX", timeout * 1000, "FIELDS", 1, worker, offer),
                wait]

    def after_wait(self, index: int, replies: list[Any]) -> list[Lease] | bool:
        """What a wait brought: the lease of a job handed over; True for a wake token (the
        caller claims); False when it timed out or was unblocked."""
        for reply in replies:
            if isinstance(reply, ResponseError):
                raise reply
        reply = replies[-1]
        if reply is None:
            return False
        if "|" not in reply[1]:  # a wake token ('1'); a job handed over is '<id>|<lease>|<payload>'
            return True
        return [self._handed(index, reply[1])]

    def _handed(self, index: int, value: str) -> Lease:
        job_id, lease_ms, payload = value.split("|", 2)
        return Lease.from_claim(self.name, index, job_id, "1", payload, "", lease_ms)

    def withdraw(self, index: int, worker: str) -> list[Lease]:
        """A stopping worker's offer withdrawn from shard `index`; returns the jobs handed to
        it that it did not take (the caller releases them)."""
        shard = self.shard(index)
        with self.client.pipeline(transaction=False) as pipe:
            pipe.hdel(shard.key("idle"), worker)
            pipe.lpop(shard.hand(worker), 1000)
            _, handed = pipe.execute()
        return [self._handed(index, value) for value in handed or ()]

    def _leases(self, index: int, reply: list[Any]) -> list[Lease]:
        return [Lease.from_claim(self.name, index, *reply[n : n + 5]) for n in range(0, len(reply), 5)]

    def ack(self, lease: Lease, result: Any = None) -> bool:
        """Record success; False when the lease is stale (the job was re-claimed)."""
        return self.ack_many([(lease, result)])[0]

    def ack_many(self, items: Sequence[tuple[Lease, Any]]) -> list[bool]:
        """Record many successes with one script call per shard."""
        return self.ack_encoded([(lease, dumps(result, "result")) for lease, result in items])

    def ack_encoded(self, items: Sequence[tuple[Lease, str]]) -> list[bool]:
        """`ack_many` for results already encoded as JSON (the worker encodes them once)."""
        if not items:
            return []
        replies = self._per_shard("ack", [self._retention_ms()], [lease for lease, _ in items],
                                  [[encoded] for _, encoded in items])
        return [bool(ok) for ok in replies]

    def _per_shard(self, script: str, head: list[Any], leases: Sequence[Lease],
                   extras: Sequence[list[Any]] | None = None) -> list[Any]:
        """Run a batch script once per shard: ARGV = head, n, then id, token and the lease's
        extras for each lease. Replies come back in the leases' order."""
        groups: dict[int, list[tuple[int, Lease, list[Any]]]] = defaultdict(list)
        for pos, lease in enumerate(leases):
            groups[lease.shard].append((pos, lease, extras[pos] if extras else []))
        answers: dict[int, Any] = {}
        for index, group in groups.items():  # one round trip per shard
            args: list[Any] = [*head, len(group)]
            for _, lease, extra in group:
                args.extend([lease.job_id, lease.token, *extra])
            reply = self._run(script, self.shard(index), args)
            answers.update(zip((pos for pos, _, _ in group), reply, strict=True))
        return [answers[i] for i in range(len(leases))]

    def nack(self, lease: Lease, error: str = "", retry_in: float | None = None,
             *, fatal: bool = False) -> str | None:
        """Record a failure: the job's new state, or None when the lease is stale."""
        retry_ms = -1 if retry_in is None else round(
            _seconds(retry_in, "retry_in", low=0, high=MAX_DELAY) * 1000)
        state = self._run("nack", self.shard(lease.shard), [
            lease.job_id, lease.token, str(error)[:65_536], retry_ms, "1" if fatal else "0",
            self._retention_ms(), self._dead_retention_ms(), self.options.max_attempts,
            round(self.options.backoff * 1000),
        ])
        return state or None

    def extend(self, lease: Lease, seconds: float) -> bool:
        """Renew a lease for `seconds` from now (server clock); False when stale."""
        return self.extend_many([lease], seconds)[0] in (1, 2)

    def extend_many(self, leases: Sequence[Lease], seconds: float) -> list[int]:
        """Renew many leases, one call per shard: 1 renewed, 2 renewed but cancel requested, 3 not
        renewed because that attempt has already finished (acked meanwhile), 0 stale."""
        ms = round(validate_lease(seconds) * 1000)
        return [int(code) for code in self._per_shard("extend", [], leases, [[ms]] * len(leases))]

    def cancel_requested(self, lease: Lease) -> bool:
        """Whether an operator asked to cancel the attempt `lease` holds (a plain read)."""
        cancel, attempts = self.client.hmget(self.shard(lease.shard).job(lease.job_id),
                                             "cancel", "attempts")
        return cancel == "1" and attempts == str(lease.token)

    def checkpoint(self, lease: Lease, data: Any, extend: float | None = None) -> bool:
        """Store a running job's progress on its row; a re-run sees it. False when stale."""
        ms = 0 if extend is None else round(validate_lease(extend) * 1000)
        return bool(self._run("checkpoint", self.shard(lease.shard),
                              [lease.job_id, lease.token, dumps(data, "checkpoint"), ms]))

    def release(self, lease: Lease) -> bool:
        """Hand a claimed job back without charging its retry budget; its token stays spent."""
        return self.release_many([lease])[0]

    def release_many(self, leases: Sequence[Lease]) -> list[bool]:
        return [bool(ok) for ok in self._per_shard("release", [self._retention_ms()], leases)]

    # -- maintenance -----------------------------------------------------------------------

    def reap(self, limit: int = 1000, shards: int | None = None) -> int:
        """Expired leases go back to waiting (or dead when spent); returns how many."""
        return sum(
            int(self._run("reap", self.shard(i),
                          [limit, self._retention_ms(), self._dead_retention_ms(),
                           self.options.max_attempts]))
            for i in range(shards or self.claim_shards())
        )

    def promote(self, limit: int = 1000, shards: int | None = None) -> int:
        """Due scheduled jobs move to their lanes; returns how many."""
        return sum(self.promote_shard(i, limit)[0] for i in range(shards or self.claim_shards()))

    def promote_shard(self, index: int, limit: int = 1000) -> tuple[int, float | None]:
        """Promote one shard: (moved, seconds until its next scheduled job or None)."""
        moved, wait_ms = self._run("promote", self.shard(index), [limit])
        return int(moved), (None if int(wait_ms) < 0 else int(wait_ms) / 1000)

    # -- operator side ---------------------------------------------------------------------

    def retry(self, job_id: str) -> str:
        """A dead or cancelled job goes back to pending with a fresh retry budget (on its own
        shard: one that a shrink retired is claimed from again until it has drained anew)."""
        index = self.locate(job_id)
        if index is not None:
            self._reopen(index)
        return self._operator("retry", job_id, [job_id])

    def reprioritize(self, job_id: str, priority: int) -> str:
        """Change a waiting (or running) job's priority in place."""
        return self._operator("reprioritize", job_id, [job_id, validate_priority(priority)])

    def cancel(self, job_id: str) -> str:
        """Cancel a waiting job now; flag an active one so its outcome is recorded as cancelled."""
        return self._operator("cancel", job_id, [job_id, self._retention_ms()])

    def _operator(self, name: str, job_id: str, args: list[Any]) -> str:
        index = self.locate(job_id)
        answer = "missing" if index is None else text(self._run(name, self.shard(index), args))[0]
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
        for i in range(self.all_shards()):
            self.client.hdel(self.shard(i).key("meta"), "paused")

    # -- live resize ---------------------------------------------------------------------------

    def resize(self, count: int, by: str = "") -> layouts.Layout:
        """Set the queue's live shard count (see `layout`): growing spreads new jobs over
        `count` shards at once; shrinking stops new jobs landing on shards ≥ `count`, which
        workers drain and then retire. While the last resize settles, only undoing it is allowed
        unless it has been worked off (checked here, as workers do). `by` says who, in the resize
        history. Returns the new layout."""
        before = self.layout(fresh=True)
        if before.prior and count not in (before.live, before.prior) and self.settle():
            before = self.layout(fresh=True)  # the last resize was worked off (no worker said so)
        after = layouts.plan(before, count)
        if after == before:
            return before
        self._index_unique_keys(before.widest)
        self._mark(after)  # first, so that no producer strands a job on a shard being retired
        if not layouts.write(self.client, self.name, before, after):
            self._mark(self.layout(fresh=True))
            raise JobQueueError(f"queue {self.name!r} was resized by someone else meanwhile; "
                                f"look at its layout and try again")
        layouts.record(self.client, self.name, before.live, after.live, by)
        return after

    def _mark(self, layout: layouts.Layout) -> None:
        """Flag the shards beyond the live count as draining (their enqueue turns jobs away)
        and clear the flag on live ones; a paused queue's new shards start paused."""
        paused = self.is_paused()
        for i in range(layout.widest):
            meta = self.shard(i).key("meta")
            if i < layout.live:
                self.client.hdel(meta, "draining")
            else:
                self.client.hset(meta, "draining", "1")
            if paused:
                self.client.hset(meta, "paused", "1")

    def _index_unique_keys(self, shards: int) -> None:
        """Once per queue, before its first resize: add to each shard's `uniqs` set the live
        unique jobs written before the scripts kept it (one SCAN of the keyspace for all the
        queue's shards). From then on the scripts keep the sets, and a settling resize reads
        them, not the keyspace."""
        marker = self.shard(0).key("meta")
        if self.client.hget(marker, "uniqs_indexed") == "1":
            return
        bases = {self.shard(i).base: self.shard(i) for i in range(shards)}
        # Queue names hold no glob characters; `emq:{name*` also matches other queues whose
        # names start with this one: their keys' bases are not among ours and are skipped.
        for key in self.client.scan_iter(match=f"emq:{{{self.name}*:uniq:*", count=1000):
            base, _, unique = key.partition(":uniq:")
            shard = bases.get(base)
            job_id = self.client.get(key) if shard else None
            if shard and job_id and self.client.hget(shard.job(job_id), "state") in LIVE_STATES:
                self.client.sadd(shard.key("uniqs"), unique)
        self.client.hset(marker, "uniqs_indexed", "1")

    def _reopen(self, index: int) -> None:
        """Claim from shard `index` again (a retry put work on a retired shard)."""
        while (now := self.layout(fresh=True)).span <= index:
            grown = layouts.Layout(now.live, now.prior, index + 1, max(now.widest, index + 1))
            if layouts.write(self.client, self.name, now, grown):
                return

    def settle(self) -> layouts.Layout | None:
        """Finish a resize once it has been worked off: no draining shard holds waiting or
        running jobs, and no lane with ready jobs or live unique key sits on a shard other than
        its live one. Returns the settled layout, or None (not yet, or nothing to settle)."""
        now = self.layout(fresh=True)
        if not now.settling:
            return None
        done = layouts.settled(now, lambda index: self._settled_shard(index, now))
        if done is not None and layouts.write(self.client, self.name, now, done):
            return done
        return None

    def _settled_shard(self, index: int, now: layouts.Layout) -> bool:
        if index >= now.live:
            counts = self.shard_counts(index)
            return not any(counts[state] for state in LIVE_STATES)
        if not now.prior:
            return True
        shard = self.shard(index)
        if any(lane and placement_hash(lane) % now.live != index
               for lane in self.client.lrange(shard.key("ring"), 0, -1)):
            return False
        for unique in self.client.sscan_iter(shard.key("uniqs"), count=1000):
            job_id = self.client.get(shard.key(f"uniq:{unique}"))
            state, lane = self.client.hmget(shard.job(job_id), "state", "lane") if job_id else (None, None)
            if state in LIVE_STATES and self.place(job_id, lane or "", unique, now.live) != index:
                return False  # a live job whose lane or key now belongs on another shard
        return True

    def is_paused(self) -> bool:
        return self.client.hget(self.shard(0).key("meta"), "paused") == "1"

    def counts(self) -> dict[str, int]:
        """Jobs by state over all shards (succeeded/cancelled: totals since the queue began)."""
        totals = dict.fromkeys(COUNT_FIELDS, 0)
        for i in range(self.all_shards()):
            for name, value in self.shard_counts(i).items():
                totals[name] += value
        return totals

    def heads(self, index: int, lanes: int = 1000, bands: int = 10) -> list[tuple[str, str, int]]:
        """(lane, job id, ms it became ready) of the first job of each priority band of the
        shard's lanes (the first `lanes` of its ring): where its longest waits are."""
        reply = self._run("heads", self.shard(index), [lanes, bands])
        return [(reply[n], reply[n + 1], int(reply[n + 2]) or ids.minted_ms(reply[n + 1]) or 0)
                for n in range(0, len(reply), 3)]

    def oldest_wait(self, now: int | None = None, lanes: int = 1000) -> float | None:
        """Seconds the longest-waiting ready job has waited (server clock, `now` in ms if the
        caller has it), among the first `lanes` lanes of each shard; None when none waits."""
        if now is None:
            seconds, micros = self.client.time()
            now = int(seconds) * 1000 + int(micros) // 1000
        oldest = min((ready for i in range(self.claim_shards()) for _, _, ready in self.heads(i, lanes)),
                     default=None)
        return None if oldest is None else max(now - oldest, 0) / 1000

    def sample_backlog(self, waiting: int, oldest_wait: float | None) -> None:
        """Note this minute's backlog and oldest wait for the dashboard's charts (workers call it
        at each summary; the last sample of a minute stands)."""
        seconds, _ = self.client.time()
        key = self.shard(0).key(f"m:{int(seconds) // 60}")
        self.client.hset(key, mapping={"backlog": waiting,
                                       "oldest_ms": round((oldest_wait or 0.0) * 1000)})
        self.client.expire(key, 7200)

    def shard_counts(self, index: int) -> dict[str, int]:
        reply = self._run("counts", self.shard(index), [])
        return {name: int(value) for name, value in zip(COUNT_FIELDS, reply, strict=False)}

    def get(self, job_id: str) -> JobInfo | None:
        """The live row of a job, or None when Valkey holds none (expired or unknown)."""
        ids.validate_job_id(job_id)
        for index in self._candidates(job_id):
            row = self.client.hgetall(self.shard(index).job(job_id))
            if row:
                return JobInfo.from_row(job_id, self.name, row, index, self.options.max_attempts)
        return None

    def _retention_ms(self) -> int:
        return round(get_config().retention * 1000)

    def _dead_retention_ms(self) -> int:
        return round(get_config().dead_retention * 1000)


def known_queues(client: Any = None) -> list[str]:
    """Every queue named in settings or that ever held a job (the registry in Valkey)."""
    client = client if client is not None else get_client()
    names = set(get_config().queues) | set(client.hkeys(REGISTRY_KEY))
    return sorted(names)
