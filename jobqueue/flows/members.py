"""A flow once written: its jobs listed, in the flow's order, from every shard of its queue (each
shard's `:flow:<id>` lists its own), what a waiting job still waits for, and a flow cancelled
(the `:forward` entries a cancel left are relayed at once: relay.py).
"""

from __future__ import annotations

from .. import ids
from ..engine.store import Queue
from ..exceptions import InvalidTransition, JobNotFound
from ..records import JobInfo
from . import relay


def _flow_shards(queue: Queue, flow_id: str) -> list[int]:
    """The shards holding some of the flow's jobs (each shard's `:flow:<id>` lists its own)."""
    ids.validate_job_id(flow_id)
    return [index for index in range(queue.all_shards())
            if queue.client.exists(queue.shard(index).key(f"flow:{flow_id}"))]


def members(flow_id: str, queue: str = "default") -> list[JobInfo]:
    """A flow's jobs, in the flow's order, as Valkey holds them now, from every shard they are
    on (rows that expired are left out); the rows are read in one pipeline (the console's flow
    page reads a page at a time: `readmodels.flow_page`)."""
    target = Queue(queue)
    placed = []
    for index in _flow_shards(target, flow_id):
        shard = target.shard(index)
        for job_id, position in target.client.zrange(shard.key(f"flow:{flow_id}"), 0, -1,
                                                     withscores=True):
            placed.append((position, job_id, index))
    placed.sort()
    pipe = target.client.pipeline(transaction=False)
    for _, job_id, index in placed:
        pipe.hgetall(target.shard(index).job(job_id))
    return [JobInfo.from_row(job_id, queue, row, index, target.options.max_attempts)
            for (_, job_id, index), row in zip(placed, pipe.execute(), strict=True) if row]


def waits_for(info: JobInfo) -> list[str]:
    """The jobs a waiting job still waits for."""
    if info.state != "waiting":
        return []
    return sorted(Queue(info.queue).client.smembers(
        Queue(info.queue).shard(info.shard).key(f"deps:{info.id}")))


def cancel(flow_id: str, queue: str = "default") -> int:
    """Cancel every job of a flow that has not started (a running one is flagged: it sees
    `ctx.cancelled`); how many were cancelled or flagged. The last jobs go first, so a job
    waiting for others ends cancelled by the operator, not by a member's failure policy."""
    target, done, found = Queue(queue), 0, members(flow_id, queue)
    for info in reversed(found):
        try:
            target.cancel(info.id)
            done += 1
        except (InvalidTransition, JobNotFound):
            continue  # finished, or cancelled meanwhile by a member's failure policy
    for index in {info.shard for info in found}:  # (what the cancels forwarded: applied now)
        relay.relay_shard(target, index)
    return done
