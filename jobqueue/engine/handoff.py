"""The idle-wait protocol: a worker's wait on one shard for a wake token or a job handed to it.

An idle worker offers itself on the shard (`idle`, a hash field expiring on the server clock
when its wait would end) and blocks on its own hand-off list and the shard's `wake` list. An
enqueue that finds nothing else ready there leases the job to it and pushes it onto its list
(see enqueue.lua): the job reaches the worker already leased, with no claim call. An offer
carries an id, which the job handed over keeps as a claimed job keeps its claim's: a wait whose
reply was lost gives that job back uncharged (`recover`). These functions build the wait's
commands and read its replies; the worker's waiters send them on connections of their own.
"""

from __future__ import annotations

from typing import Any

from redis.exceptions import ResponseError

from ..conf import get_config
from ..keys import ShardKeys
from ..records import Lease
from .scripts import calls


def offer(lease_ms: int, override: bool, offer_id: str = "") -> str:
    """An idle worker's offer: the lease a job handed to it gets, whether that lease overrides
    the job's own (`runworker --lease`), and the offer's id (a claim's id: the job handed over
    carries it as `claim`, so that a wait whose reply was lost hands it back as a lost claim's
    jobs go back: `LostClaims`)."""
    return f"{lease_ms}:{int(override)}" + (f":{offer_id}" if offer_id else "")


def wait_commands(shard: ShardKeys, timeout: int, worker: str,
                  offer: str | None = None) -> list[tuple[Any, ...]]:
    """A worker's wait on `shard`, up to `timeout` s (`after_wait` reads its last reply).
    `offer` ('<lease ms>:<1 if it overrides the job's lease>'): the worker first offers itself
    for hand-offs for that long."""
    wait = ("BLPOP", shard.hand(worker), shard.key("wake"), timeout)
    if offer is None:
        return [wait]
    return [("HSETEX", shard.key("idle"), "PX", timeout * 1000, "FIELDS", 1, worker, offer), wait]


def after_wait(shard: ShardKeys, replies: list[Any]) -> list[Lease] | bool:
    """What a wait brought: the lease of a job handed over; True for a wake token (the caller
    claims); False when it timed out or was unblocked."""
    for reply in replies:
        if isinstance(reply, ResponseError):
            raise reply
    reply = replies[-1]
    if reply is None:
        return False
    if "|" not in reply[1]:  # a wake token ('1'); a job handed over: `handed`
        return True
    return [handed(shard, reply[1])]


def handed(shard: ShardKeys, value: str) -> Lease:
    """The lease of a job an enqueue handed over (attempts 1): '<id>|<lease ms>|<payload>', or
    '<id>|<lease ms>:<timeout ms>|<payload>' for a job with a run time limit (enqueue.lua)."""
    job_id, lease_ms, payload = value.split("|", 2)
    return Lease.from_claim(shard.queue, shard.index, job_id, "1", payload, "", lease_ms)


def withdraw(client: Any, shard: ShardKeys, worker: str) -> list[Lease]:
    """A stopping worker's offer withdrawn from `shard`; returns the jobs handed to it that it
    did not take (the caller releases them)."""
    with client.pipeline(transaction=False) as pipe:
        pipe.hdel(shard.key("idle"), worker)
        pipe.lpop(shard.hand(worker), 1000)
        _, taken = pipe.execute()
    return [handed(shard, value) for value in taken or ()]


def recover(client: Any, shard: ShardKeys, worker: str, offer_id: str) -> int:
    """The job handed over during a wait of `worker` whose reply was lost (its offer's id),
    handed back uncharged and taken off the worker's list (release.lua): nobody ran it, and
    it is no job of this worker's. Call it before the worker's next wait on `shard` (which
    would take it from the list); how many it handed back."""
    return calls.release_lost(client, shard, round(get_config().retention * 1000), worker,
                              offer_id)
