"""Sending validated jobs to their shards: one job the short way (`send_one`: one script call,
no per-call object), a batch in one script call per shard chunk (`send`), and jobs sent again
where a shard turned them away.

`Queue` validates the jobs (`spec.prepare`, or a handler's template made once) and announces
them; what happens to each job is the enqueue script's (see enqueue.lua). This module places
and routes them (`layouts.place`, `layouts.destinations`), chunks a batch, waits for replicas
when the queue asks, and reads the replies. It writes no key itself; it reads job rows for one
case: a job whose id the caller chose (a durable row sent again, a restore) on a queue whose
shard count ever changed, which may live on a shard other than the one its id is placed on
now (`held`): the enqueue script, which looks only at its own shard, would write it twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import ids
from ..exceptions import NotReplicated
from ..keys import ShardKeys
from ..options import QueueOptions
from ..spec import Prepared
from . import layouts
from .refs import JobRef
from .scripts import calls
from .scripts.answers import SEND_AGAIN, Placed


def send_one(client: Any, name: str, options: QueueOptions, configured: int, template: Prepared,
             job_id: str, payload: str, tail: Sequence[Any]) -> JobRef:
    """One job, encoded: its id, its payload as JSON, and `tail`, the rest of `template`'s
    script arguments (`calls.enqueue_tail`). A resize in progress,
    `wait_replicas`, a shard that turns the job away or a minted id already taken send it
    `send`'s way."""
    now = layouts.read(client, name, configured)
    if now.prior or options.wait_replicas or (not template.minted and _moved(now)):
        return send(client, name, options, configured,
                    [template._replace(job_id=job_id, payload=payload)])[0]
    index = layouts.place(job_id, template.lane, template.unique_key, now.live)
    listed, found, status = calls.enqueue_one(client, ShardKeys(name, index), job_id, payload, tail)
    if not listed:
        layouts.list_queue(client, name, index, now.live)
    if status in SEND_AGAIN:  # (moved, or collision: 'absent' answers mode 'prior' only)
        return send(client, name, options, configured,
                    [template._replace(job_id=job_id, payload=payload)], refused=True)[0]
    return JobRef(found, name, created=status == Placed.NEW)


def send(client: Any, name: str, options: QueueOptions, configured: int, jobs: list[Prepared],
         *, refused: bool = False, fresh: bool = False) -> list[JobRef]:
    """Send `jobs` of queue `name` (validated already) to their shards, again where a shard
    turned them away (it is draining: the layout is read again), a lane or key was absent from
    its prior shard, or a minted id was taken. `refused`: a shard turned the lone job away
    already; `fresh`: ids the caller chose that no shard can hold yet (a durable row's first
    push), else `held` looks for them first. Returns their refs in order; NotReplicated when
    replicas did not confirm."""
    refs: list[JobRef | None] = [None] * len(jobs)
    todo, live_only, turned_away = list(range(len(jobs))), set[int](), 0
    replicated = wanted = options.wait_replicas
    now = layouts.read(client, name, configured)
    if not fresh and _moved(now):  # (a job a shard holds is left where it is: see above)
        chosen = [i for i, job in enumerate(jobs) if not job.minted]
        found = held(client, name, now.widest, [jobs[i].job_id for i in chosen]) if chosen else {}
        for i in chosen:
            if jobs[i].job_id in found:
                refs[i] = JobRef(jobs[i].job_id, name, created=False)
        todo = [i for i in todo if refs[i] is None]
    while todo:
        if refused:
            turned_away += 1
            now = layouts.read_again(client, name, configured, turned_away)
        again: list[int] = []
        refused = False
        for (index, mode), positions in layouts.destinations(now, jobs, todo, live_only).items():
            sent, acked = _send(client, ShardKeys(name, index), options, mode, jobs, positions,
                                refs, now.live)
            replicated = min(replicated, acked)
            if mode == "prior":
                live_only.update(sent)  # absent there: to the live shard, next turn
            else:
                refused = refused or bool(sent)  # turned away, or an id collision (rare)
            again.extend(sent)
        todo = again
    out = [ref for ref in refs if ref is not None]
    if replicated < wanted:
        raise NotReplicated(
            f"queue {name!r}: {len(out)} job(s) written on the primary, but only "
            f"{replicated} of {wanted} replica(s) confirmed them within {calls.WAIT_MS} ms", out)
    return out


def _moved(layout: layouts.Layout) -> bool:
    """Whether a queue's jobs may live on shards other than those their ids are placed on now:
    its shard count changed once (a resize, a raised or lowered setting)."""
    return bool(layout.raw) or layout.widest > layout.live


def held(client: Any, name: str, widest: int, job_ids: Sequence[str]) -> dict[str, int]:
    """Which of `job_ids` a shard of queue `name` holds (any of the `widest` it ever had), and
    where: one pipelined read."""
    pipe = client.pipeline(transaction=False)
    for job_id in job_ids:
        for index in range(widest):
            pipe.exists(ShardKeys(name, index).job(job_id))
    found = iter(pipe.execute())
    where: dict[str, int] = {}
    for job_id in job_ids:
        for index in range(widest):
            if next(found) and job_id not in where:
                where[job_id] = index
    return where


def _send(client: Any, shard: ShardKeys, options: QueueOptions, mode: str, jobs: list[Prepared],
          positions: list[int], refs: list[JobRef | None], live: int) -> tuple[list[int], int]:
    """Send a shard's jobs (`calls.enqueue`: in chunks), filling `refs`. Returns the positions
    to send again (an id collision, a draining shard, a lane or key absent from its prior
    shard) and, for a `wait_replicas` queue, how many replicas confirmed the writes."""
    reply, acked = calls.enqueue(client, shard, mode, [jobs[i] for i in positions],
                                 options=options, replicas=options.wait_replicas)
    if not reply.listed:
        layouts.list_queue(client, shard.queue, shard.index, live)
    retry: list[int] = []
    flat = reply.flat
    for n, i in enumerate(positions):
        job_id, status = flat[2 * n], flat[2 * n + 1]
        if status == Placed.COLLISION:  # another process minted the same id: mint anew
            jobs[i] = jobs[i].minted_again(ids.new_id())
        if status in SEND_AGAIN:
            retry.append(i)
        else:
            refs[i] = JobRef(job_id, shard.queue, created=status == Placed.NEW)
    return retry, acked
