"""The twins of the job transitions: for each script one function whose parameters are its
ARGV, named and ordered as its header declares them (tests/engine/test_scripts.py holds them to it),
which sends the call (`caller`: the KEYS come from the header) and turns the reply into a value
of `answers`. Nothing else builds a script's arguments or reads its reply.

A twin's parameters: `client`, then where it runs (`shard`, or `queue` for a call per shard of
the jobs it is given), then its ARGV; keyword-only ones say how it is sent. A twin whose
arguments begin with a head kept between calls (a claim's: `claim_head`) takes it as `head`.
This module holds the producer's and the worker's transitions (`operator_calls` the rest): a
claim, an ack and an enqueue are per-job hot, so their twins do per call what was done before
them (no object per job but the lease, an index for an answer).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from ...keys import ShardKeys
from ...options import QueueOptions
from ...records import Lease
from ...spec import Prepared
from . import caller
from .answers import (
    ACKED,
    EXTENDED,
    Acked,
    Claimed,
    Delivered,
    Enqueued,
    Extended,
    Flowed,
    Nacked,
    Permitted,
    Promoted,
    refused,
)

TWINS: dict[str, Callable[..., Any]] = {}
"""Script name -> its twin (tests/engine/test_scripts.py reads it)."""
HEADS: dict[str, Callable[..., Any]] = {}
"""Script name -> the builder of the head its twin takes as `head` (its parameters stand there)."""
_new = tuple.__new__
"""Makes a named tuple from its fields without its `__new__`'s Python frame (a claim's answer)."""
CHUNK = 500
"""Jobs per enqueue call."""
WAIT_MS = 1000
"""How long an enqueue of a `wait_replicas` queue waits for its replicas."""


def twin[F: Callable[..., Any]](script: str, head: Callable[..., Any] | None = None
                                ) -> Callable[[F], F]:
    """Mark a function as `script`'s twin (returned as it is: no wrapper on the hot path)."""
    def mark(function: F) -> F:
        TWINS[script] = function
        if head is not None:
            HEADS[script] = head
        return function
    return mark


# -- producer -------------------------------------------------------------------------------

def encoded(job: Prepared, max_attempts: int, backoff_ms: int) -> tuple[Any, ...]:
    """enqueue.lua's 12 fields of one job, for a queue of `max_attempts` and `backoff_ms`: a
    retry policy equal to the queue's is left out of the row (the queue's settings then apply
    when the job fails)."""
    return (job.job_id, job.payload, job.priority, job.lane,
            "" if job.max_attempts == max_attempts else job.max_attempts,
            "" if job.backoff_ms == backoff_ms else job.backoff_ms,
            lease_field(job), job.delay_ms, job.unique_key,
            "1" if job.minted else f"0:{job.spent}" if job.spent else "0",
            job.debounce_ms, job.expires_ms)


def lease_field(job: Prepared) -> int | str:
    """A row's `lease_ms`: the lease, or '<lease>:<timeout>' for a run time limit (one field,
    so a claim of a job without one reads nothing more: claim.lua)."""
    return f"{job.lease_ms}:{job.timeout_ms}" if job.timeout_ms else job.lease_ms


def enqueue_tail(job: Prepared, options: QueueOptions) -> tuple[Any, ...]:
    """A job's fields after its id and payload (`encoded`): a handler's template works them out
    once for all its calls, which `enqueue_one` sends with an id and a payload each."""
    return encoded(job, options.max_attempts, round(options.backoff * 1000))[2:]


def enqueue_one(client: Any, shard: ShardKeys, job_id: str, payload: str,
                tail: Sequence[Any]) -> tuple[bool, str, str]:
    """`enqueue` of one job in mode '', its fields given encoded (`enqueue_tail`): (listed, its
    id or the live one's, its status: `answers.Placed`)."""
    listed, found, status = caller.run(client, "enqueue", shard, ["", 1, job_id, payload, *tail])
    return listed, found, status


@twin("enqueue")
def enqueue(client: Any, shard: ShardKeys, mode: str, jobs: Sequence[Prepared], *,
            options: QueueOptions, replicas: int = 0) -> tuple[Enqueued, int]:
    """Write `jobs` in calls of `CHUNK` jobs (one round trip), then, for `replicas`, WAIT for
    them: (the replies, `answers.Enqueued`, over all calls; replicas that confirmed, 0 when
    none were asked for)."""
    max_attempts, backoff_ms = options.max_attempts, round(options.backoff * 1000)

    def calls() -> Iterator[list[Any]]:  # built one by one: see caller.run_many
        for start in range(0, len(jobs), CHUNK):
            chunk = jobs[start : start + CHUNK]
            args: list[Any] = [mode, len(chunk)]
            for job in chunk:
                args += encoded(job, max_attempts, backoff_ms)
            yield args

    acked = 0
    if replicas:
        replies, acked = caller.run_replicated(client, "enqueue", shard, list(calls()),
                                               replicas, WAIT_MS)
    else:
        replies = caller.run_many(client, "enqueue", shard, calls())
    if len(replies) == 1:
        return Enqueued(bool(replies[0][0]), replies[0][1:]), acked
    flat: list[str] = []
    for reply in replies:
        flat += reply[1:]
    return Enqueued(all(reply[0] for reply in replies), flat), acked


class FlowJob(NamedTuple):
    """One job of a flow call: the job, what its members' outcomes become (`takes`), its slots,
    its position in the flow's index, and its members (id, slot, policy, shard: '' this one)."""

    job: Prepared
    takes: str
    slots: int
    position: int
    members: Sequence[tuple[str, int, str, int | str]]


@twin("flow")
def flow(client: Any, shard: ShardKeys, flow_id: str, retention: int, mode: str,
         jobs: Sequence[FlowJob], outcomes: Mapping[str, tuple[str, str]],
         links: Sequence[Sequence[Any]], *, options: QueueOptions) -> Flowed:
    """Write a flow's jobs of one shard and the links due there; a job id taken (mode 'new')
    or a member missing raises InvalidFlow (`answers.refused`)."""
    max_attempts, backoff_ms = options.max_attempts, round(options.backoff * 1000)
    args: list[Any] = [flow_id, retention, mode, len(jobs)]
    for item in jobs:
        job = item.job
        args += [job.job_id, job.payload, job.priority, job.lane,
                 "" if job.max_attempts == max_attempts else job.max_attempts,
                 "" if job.backoff_ms == backoff_ms else job.backoff_ms, lease_field(job),
                 job.delay_ms, item.takes, item.slots, item.position, len(item.members)]
        for member in item.members:
            args += member
        args += [job.expires_ms, job.spent]
    args.append(len(outcomes))
    for job_id, (state, value) in outcomes.items():
        args += [job_id, state, value]
    args.append(len(links))
    for link in links:
        args += link
    reply = caller.run(client, "flow", shard, args)
    if reply[1] in ("exists", "missing"):
        raise refused("flow", f"{reply[1]}:{reply[2]}", "", shard.queue)
    if reply[1] == "moved":
        return Flowed(False, True, 0, False)
    return Flowed(bool(reply[0]), False, int(reply[2]), bool(int(reply[3])))


@twin("deliver")
def deliver(client: Any, shard: ShardKeys, retention: int, packs: Sequence[str], *,
            source: ShardKeys, aof_wait_ms: int) -> tuple[Delivered, bool]:
    """Apply the packs of "member done" outcomes from `source`'s stream on `shard`: (the answer,
    whether the writes are safe to delete the entries for: where `shard` lives on another node
    than `source`, that node's AOF must hold them, waited for up to `aof_wait_ms`)."""
    args = [retention, len(packs), *packs]
    if caller.same_server(client, source, shard):
        reply, kept = caller.run(client, "deliver", shard, args), True
    else:
        reply, kept = caller.run_on_disk(client, "deliver", shard, args, aof_wait_ms)
    absent = [[int(at) - 1 for at in a] if isinstance(a, list) else None if int(a) < 0 else []
              for a in reply[2:]]
    return Delivered(bool(int(reply[0])), bool(int(reply[1])), absent), kept


# -- worker ---------------------------------------------------------------------------------

def claim_head(lease_ms: int, override: bool, worker: str, dead_retention: int,
               retention: int, policy: Sequence[Any]) -> list[Any]:
    """A claim's arguments after its count, up to its id: kept by the caller while they stay
    the same (a worker at concurrency 1 claims once per job)."""
    return [lease_ms, "1" if override else "0", worker, dead_retention, retention, *policy]


@twin("claim", head=claim_head)
def claim(client: Any, shard: ShardKeys, count: int, head: Sequence[Any], claim_id: str,
          successes: Iterable[tuple[Lease, str]]) -> Claimed:
    """Record `successes` (results encoded as JSON), then lease up to `count` jobs; sent once,
    never again (`caller.run_once`: a lost reply raises, see claims.py)."""
    args = [count, *head, claim_id, 0]
    for held, result in successes:
        args += (held.job_id, held.token, result)
    args[len(head) + 2] = (len(args) - len(head) - 3) // 3
    reply = caller.run_once(client, "claim", shard, args)
    n = int(reply[0])
    rows = reply[2 + n :]
    return _new(Claimed, ([ACKED[ok] for ok in reply[1 : 1 + n]], int(reply[1 + n]),
                          [Lease.from_claim(shard.queue, shard.index, *rows[r : r + 5])
                           for r in range(0, len(rows), 5)]))


@twin("ack")
def ack(client: Any, queue: str, retention: int, jobs: Sequence[tuple[Lease, str]]) -> list[Acked]:
    """Record successes (results encoded as JSON), one call per shard."""
    return [ACKED[ok] for ok in caller.run_by_shard(
        client, "ack", queue, [retention],
        [(lease.shard, [lease.job_id, lease.token, encoded]) for lease, encoded in jobs])]


@twin("nack")
def nack(client: Any, shard: ShardKeys, job_id: str, token: int, error: str, retry_ms: int,
         fatal: bool, retention: int, dead_retention: int, max_attempts: int,
         backoff_ms: int) -> Nacked:
    reply = caller.run(client, "nack", shard, [
        job_id, token, error, retry_ms, "1" if fatal else "0", retention, dead_retention,
        max_attempts, backoff_ms])
    return _nacked(reply)


@twin("nack_many")
def nack_many(client: Any, queue: str, retention: int, dead_retention: int, max_attempts: int,
              backoff_ms: int, jobs: Sequence[tuple[Lease, str, int, bool]]) -> list[Nacked]:
    """Record failures (per job its error, retry_ms and fatal, as `nack` takes them), one call
    per shard: per job its `Nacked`."""
    return [_nacked(reply) for reply in caller.run_by_shard(
        client, "nack_many", queue, [retention, dead_retention, max_attempts, backoff_ms],
        [(lease.shard, [lease.job_id, lease.token, error, retry_ms, "1" if fatal else "0"])
         for lease, error, retry_ms, fatal in jobs])]


def _nacked(reply: Any) -> Nacked:
    state, _, flag = str(reply or "").partition(":")
    return Nacked(state or None, flag == "forwarded")


@twin("permits")
def permits(client: Any, shard: ShardKeys, holder: str, want: int, floor: int, lease_ms: int,
            given: int) -> Permitted:
    """Hold `want` permits of the queue's global cap from now on (`shard`: the cap's keys,
    `keys.cap_keys`), keeping at least `floor`. `want` is what the holder holds from now on, not
    how many more, so a call sent again holds what it would have held (only its deadline moves):
    after a timeout or a broken connection it is sent again (`PERMITS_SENDS` in all) so that the
    holder learns what it holds; when no reply comes at all, the holder counts on none it does
    not use (`Permits._sync`)."""
    held, _, live, over = caller.run_answered(client, "permits", shard,
                                                [holder, want, floor, lease_ms, given],
                                                PERMITS_SENDS)
    return Permitted(int(held), live, over == 1)


PERMITS_SENDS = 2
"""How many times a permits call is sent before its error is raised."""


@twin("extend")
def extend(client: Any, queue: str, jobs: Sequence[Lease], *, lease_ms: int) -> list[Extended]:
    """Renew leases for `lease_ms` from now (each job's), one call per shard. A started run
    with a time limit also says the ms left until its deadline (extend.lua writes the row's)."""
    now = time.monotonic()
    return [EXTENDED[code] for code in caller.run_by_shard(
        client, "extend", queue, [], [(lease.shard, [lease.job_id, lease.token,
                                                     _renewal(lease, lease_ms, now)])
                                      for lease in jobs])]


def _renewal(lease: Lease, lease_ms: int, now: float) -> int | str:
    """extend.lua's lease field of one job: `lease_ms`, or '<lease_ms>:<ms left>' for a started
    run with a time limit (the ms until its deadline, 0 past it)."""
    if not lease.deadline:
        return lease_ms
    return f"{lease_ms}:{max(round((lease.deadline - now) * 1000), 0)}"


@twin("checkpoint")
def checkpoint(client: Any, shard: ShardKeys, job_id: str, token: int, data: str,
               lease_ms: int) -> bool:
    return bool(caller.run(client, "checkpoint", shard, [job_id, token, data, lease_ms]))


@twin("release")
def release(client: Any, queue: str, retention: int, jobs: Sequence[Lease]) -> list[bool]:
    """Hand claimed jobs back uncharged, one call per shard: per job whether it was."""
    return [bool(ok) for ok in caller.run_by_shard(
        client, "release", queue, [retention],
        [(lease.shard, [lease.job_id, lease.token]) for lease in jobs])]


def release_lost(client: Any, shard: ShardKeys, retention: int, worker: str,
                 claim_id: str) -> int:
    """`release`'s other form (n = 0): the jobs a claim whose reply was lost leased to
    `worker`; how many it handed back."""
    return int(caller.run(client, "release", shard, [retention, 0, worker, claim_id]))


@twin("progress")
def progress(client: Any, queue: str, jobs: Sequence[tuple[Lease, str]]) -> list[bool]:
    """Store running jobs' progress (JSON), one call per shard: per job whether it was."""
    return [bool(ok) for ok in caller.run_by_shard(
        client, "progress", queue, [],
        [(lease.shard, [lease.job_id, lease.token, value]) for lease, value in jobs])]


@twin("batch")
def batch(client: Any, queue: str, mark: str, jobs: Sequence[Lease]) -> list[str | None]:
    """Note on running jobs' rows the batch they run in (`mark`), one call per shard: per job
    its lane ('' the default one), or None when its attempt is over."""
    return [None if lane == 0 else lane for lane in caller.run_by_shard(
        client, "batch", queue, [mark], [(lease.shard, [lease.job_id, lease.token])
                                         for lease in jobs])]


# -- sweeps ---------------------------------------------------------------------------------

@twin("reap")
def reap(client: Any, shard: ShardKeys, limit: int, retention: int, dead_retention: int,
         max_attempts: int, backoff_ms: int) -> int:
    return int(caller.run(client, "reap", shard, [limit, retention, dead_retention, max_attempts,
                                                  backoff_ms]))


@twin("promote")
def promote(client: Any, shard: ShardKeys, limit: int) -> Promoted:
    moved, wait_ms = caller.run(client, "promote", shard, [limit])
    return Promoted(int(moved), None if int(wait_ms) < 0 else int(wait_ms) / 1000)
