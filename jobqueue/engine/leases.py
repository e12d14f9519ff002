"""`Leases`: a queue's claimed jobs, the worker's side of it: the claim (with the successes it
carries), ack, nack, extend, checkpoint and release, each one script call through its twin
(`scripts.calls`). One per `Queue` (`Queue.leases`), which keeps what a claim needs between
calls: the shard to start from next, the claim's head, the rate limit's wait, the claims
whose reply was lost (`LostClaims`, claims.py) and the permits of the queue's global cap
(`Permits`, permits.py: a claim asks for at most as many jobs as they allow).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from typing import Any, Protocol

from redis.exceptions import RedisError

from ..conf import get_config
from ..exceptions import VALKEY_DOWN, InvalidOption
from ..keys import ShardKeys
from ..options import MAX_DELAY, QueueOptions, claim_policy, validate_lease
from ..options import seconds as _seconds
from ..records import Lease
from ..spec import dumps
from .claims import LostClaims
from .permits import Permits, mark_shards
from .scripts import calls
from .scripts.answers import Acked, Extended, Nacked

log = logging.getLogger("jobqueue")


class Holder(Protocol):
    """What `Leases` reads of its queue (`store.Queue`)."""

    name: str
    options: QueueOptions

    @property
    def client(self) -> Any: ...

    @property
    def shards(self) -> int: ...

    def shard(self, index: int) -> ShardKeys: ...

    def claim_shards(self) -> int: ...


def retention_ms() -> int:
    """How long a finished job's row stays in Valkey, in ms."""
    return round(get_config().retention * 1000)


def dead_retention_ms() -> int:
    """How long a dead job's row stays in Valkey, in ms."""
    return round(get_config().dead_retention * 1000)


def _most_shard(acks: Sequence[tuple[Lease, str]]) -> int:
    """The shard that most of `acks` are on."""
    if len(acks) == 1:
        return acks[0][0].shard
    return Counter(held.shard for held, _ in acks).most_common(1)[0][0]


class Leases:
    """The claimed jobs of one queue: claim them, record their outcomes, renew them."""

    def __init__(self, queue: Holder) -> None:
        self.queue = queue
        self.next_shard = 0
        self.claim_head: tuple[Any, tuple[Any, ...], list[Any]] | None = None
        """(config, what it was built from, `calls.claim_head`): see `head`."""
        self.rate_wait: float = 0.0
        """After a claim: seconds until the rate limit (or, when it came back short, a lane's
        rate) admits another job (0: not limited)."""
        self.lost_claims = LostClaims()
        self.permits = Permits(queue.name)

    def head(self, lease: float | None, override: bool, worker: str) -> list[Any]:
        """A claim's arguments after its count (`calls.claim_head`), kept while the config,
        these and the queue's live shard count stay the same: a worker at concurrency 1 claims
        once per job."""
        config, live, mark = get_config(), self.queue.shards, self.permits.mark
        key = (lease, override, worker, live, mark)
        kept = self.claim_head
        if kept is not None and kept[0] is config and kept[1] == key:
            return kept[2]
        head = calls.claim_head(self.lease_ms(lease), override, worker, dead_retention_ms(),
                                retention_ms(),
                                (*claim_policy(self.queue.options, live), mark))
        self.claim_head = (config, key, head)
        return head

    def lease_ms(self, lease: float | None = None) -> int:
        """A claim's default lease in ms: the worker's, else the queue's."""
        return round(validate_lease(lease if lease is not None else self.queue.options.lease) * 1000)

    def ack_and_dequeue(self, acks: Sequence[tuple[Lease, str]], count: int,
                        lease: float | None = None, worker: str = "", *,
                        override_lease: bool = False, shards: int | None = None,
                        only: int | None = None) -> tuple[list[Acked], list[Lease]]:
        """Record successes (results already encoded as JSON) and claim up to `count` jobs:
        the successes on the shard the claim starts from ride in its script call (one round
        trip), the others go in one ack call per shard. The claim asks only shard `only` when
        given (where a wake token came from); else it starts where most successes are, or at
        the next shard in turn, and goes on until it has `count`; a later shard's reply lost
        ends it with what the earlier ones leased (that claim is handed back: claims.py). Under
        a global cap it asks for no more jobs than its permits allow (permits.py).
        Returns (the acks' answers, leases)."""
        if not isinstance(count, int) or count < 1:
            raise InvalidOption(f"count must be a positive integer, got {count!r}")
        return self._dequeue(acks, count, lease, worker, override_lease, shards, only, True)

    def _dequeue(self, acks: Sequence[tuple[Lease, str]], count: int, lease: float | None,
                 worker: str, override_lease: bool, shards: int | None, only: int | None,
                 again: bool) -> tuple[list[Acked], list[Lease]]:
        """`ack_and_dequeue`; `again`: a claim a shard turned away (its global cap's mark
        differs) may claim once more, as the cap says now."""
        permits, client = self.permits, self.queue.client
        given = self.queue.options.global_concurrency or 0
        if acks and permits.running:
            permits.ended(held for held, _ in acks)
        reserved = None
        claim_lease = self.queue.options.lease if lease is None else lease
        if permits.capped(given):
            reserved = permits.reserve(client, count, given, claim_lease)
        mark = permits.mark  # (what the claim passes)
        try:
            answers, out, turned = self._ack_and_claim(
                acks, count if reserved is None else reserved, lease, worker, override_lease,
                shards, only)
        except BaseException:  # (it leased nothing this worker knows of: claims.py)
            if reserved is not None:
                permits.settle(client, given, reserved, (), True, claim_lease)
            raise
        try:  # (what was leased is returned whatever a permits call answers)
            if reserved is not None:
                permits.settle(client, given, reserved, out, len(out) < reserved, claim_lease)
                if len(out) < count and not permits.busy():
                    permits.give_back(client, given)  # (idle: others may use them)
            if turned:
                permits.resync(client, given, claim_lease)
                if permits.mark == mark:  # (the cap's key says what the holder knew: a stale mark)
                    mark_shards(client, self.queue.name, self.queue.claim_shards(), permits.mark)
                if again and len(out) < count:  # (claim again, as the cap says now)
                    out += self._dequeue([], count - len(out), lease, worker, override_lease,
                                         shards, only, False)[1]
        except RedisError as exc:  # (the permits' call left them to be asked for again)
            log.warning("queue=%s: no answer from the global cap's permits (%s); the next "
                        "claim asks again", self.queue.name, exc)
        return answers, out

    def _ack_and_claim(self, acks: Sequence[tuple[Lease, str]], count: int,
                       lease: float | None, worker: str, override_lease: bool,
                       shards: int | None, only: int | None
                       ) -> tuple[list[Acked], list[Lease], bool]:
        """`ack_and_dequeue` once its count is known (0: the global cap leaves no room, the
        successes are only recorded); and whether a shard turned the claim away (its global
        cap's mark differs from the holder's: claim.lua's -1)."""
        queue = self.queue
        if count == 0:
            self.rate_wait = 0.0
            return (self.ack_encoded(acks) if acks else []), [], False
        total = shards or queue.claim_shards()
        if only is not None:
            start = only % total
        elif acks:  # start where most successes are: they ride along
            start = _most_shard(acks) % total
        else:
            start = self.next_shard = (self.next_shard + 1) % total
        riding = [i for i, (held, _) in enumerate(acks) if held.shard == start]
        answers = [Acked.STALE] * len(acks)
        if len(riding) < len(acks):
            others = [i for i, (held, _) in enumerate(acks) if held.shard != start]
            for i, ok in zip(others, self.ack_encoded([acks[i] for i in others]), strict=True):
                answers[i] = ok
        out: list[Lease] = []
        turned = False
        waits, head = [], self.head(lease, override_lease, worker)
        for step in range(1 if only is not None else total):
            if len(out) >= count:
                break
            index = (start + step) % total
            carried = riding if step == 0 else []
            try:
                claimed = self.lost_claims.send(queue.client, queue.shard(index), worker,
                                                count - len(out), head,
                                                [acks[i] for i in carried])
            except VALKEY_DOWN:
                if step == 0:
                    raise
                break  # (what earlier shards leased is this worker's; that claim is recovered)
            for i, ok in zip(carried, claimed.acked, strict=True):
                answers[i] = ok
            if claimed.wait_ms < 0:  # (the global cap changed live: nothing leased here)
                turned = True
                break
            waits.append(claimed.wait_ms)
            out.extend(claimed.leases)
        # Rate-limited when every shard asked said so, or when the claim came back short and a
        # shard's limits hold work back (a lane's rate too): then the soonest refill is the wait.
        limited = [w for w in waits if w] if len(out) < count else waits
        self.rate_wait = min(limited) / 1000 if limited and all(limited) else 0.0
        return answers, out, turned

    def give_back(self) -> None:
        """Give back the global cap's permits no running job holds (a worker stopping): one
        call, only when some are held."""
        if self.permits.held:
            self.permits.give_back(self.queue.client, self.queue.options.global_concurrency or 0)

    def ack_encoded(self, items: Sequence[tuple[Lease, str]]) -> list[Acked]:
        """Record successes, results already encoded as JSON (the worker encodes them once),
        one script call per shard."""
        if self.permits.running:
            self.permits.ended(held for held, _ in items)
        return calls.ack(self.queue.client, self.queue.name, retention_ms(), items)

    def ack_many(self, items: Sequence[tuple[Lease, Any]]) -> list[bool]:
        encoded = [(lease, dumps(result, "result")) for lease, result in items]
        return [ok > 0 for ok in self.ack_encoded(encoded)]

    def nack(self, lease: Lease, error: str = "", retry_in: float | None = None,
             *, fatal: bool = False) -> Nacked:
        """Record a failure: the job's new state (None: the lease was stale), and whether it
        forwarded its outcome to dependents on other shards (the worker relays at once)."""
        queue = self.queue
        if self.permits.running:
            self.permits.ended((lease,))
        retry_ms = -1 if retry_in is None else round(
            _seconds(retry_in, "retry_in", low=0, high=MAX_DELAY) * 1000)
        return calls.nack(queue.client, queue.shard(lease.shard), lease.job_id, lease.token,
                          str(error)[:65_536], retry_ms, fatal, retention_ms(),
                          dead_retention_ms(), queue.options.max_attempts,
                          round(queue.options.backoff * 1000))

    def nack_many(self, items: Sequence[tuple[Lease, str, float | None, bool]]) -> list[Nacked]:
        """Record many failures, (lease, error, retry_in, fatal) each, as `nack` records one,
        with one script call per shard (a batch's: worker/batches.py)."""
        queue = self.queue
        if self.permits.running:
            self.permits.ended(lease for lease, *_ in items)
        jobs = [(lease, str(error)[:65_536], -1 if retry_in is None else round(
            _seconds(retry_in, "retry_in", low=0, high=MAX_DELAY) * 1000), fatal)
            for lease, error, retry_in, fatal in items]
        return calls.nack_many(queue.client, queue.name, retention_ms(), dead_retention_ms(),
                               queue.options.max_attempts, round(queue.options.backoff * 1000),
                               jobs)

    def extend_many(self, leases: Sequence[Lease], seconds: float) -> list[Extended]:
        """Renew many leases for `seconds` from now (server clock), one call per shard; the
        permits their jobs hold under a global cap are renewed with them."""
        codes = calls.extend(self.queue.client, self.queue.name, leases,
                             lease_ms=round(validate_lease(seconds) * 1000))
        if self.permits.held:
            self.permits.renewed(self.queue.client, leases, seconds,
                                 self.queue.options.global_concurrency or 0)
        return codes

    def cancel_requested(self, lease: Lease) -> bool:
        """Whether an operator asked to cancel the attempt `lease` holds (a plain read)."""
        cancel, attempts = self.queue.client.hmget(
            self.queue.shard(lease.shard).job(lease.job_id), "cancel", "attempts")
        return cancel == "1" and attempts == str(lease.token)

    def checkpoint(self, lease: Lease, data: Any, extend: float | None = None) -> bool:
        """Store a running job's progress on its row; a re-run sees it. False when stale."""
        ms = 0 if extend is None else round(validate_lease(extend) * 1000)
        return calls.checkpoint(self.queue.client, self.queue.shard(lease.shard), lease.job_id,
                                lease.token, dumps(data, "checkpoint"), ms)

    def release_many(self, leases: Sequence[Lease]) -> list[bool]:
        """Hand claimed jobs back without charging their retry budget; tokens stay spent."""
        if self.permits.running:
            self.permits.ended(leases)
        return calls.release(self.queue.client, self.queue.name, retention_ms(), leases)
