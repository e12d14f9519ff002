"""A flow once written: its jobs listed, in the flow's order, from every shard of every queue it
spans (each shard's `:flow:<id>` lists its own: a flow's jobs may name several queues), what a
waiting job still waits for, and a flow cancelled (the `:outcomes` entries a cancel left are
relayed at once: relay.py).
"""

from __future__ import annotations

from .. import ids
from ..engine.layouts import known_queues
from ..engine.store import Queue
from ..exceptions import InvalidTransition, JobNotFound
from ..records import JobInfo
from . import relay


def spots(queue: Queue) -> list[tuple[Queue, int]]:
    """Every shard a flow found from `queue` may have jobs on: `queue`'s, then those of every
    other known queue (a flow across queues; `graph.checked` refuses a queue not known)."""
    others = [Queue(name, client=queue.client) for name in known_queues(queue.client)
              if name != queue.name]
    return [(q, index) for q in (queue, *others) for index in range(q.all_shards())]


def _flow_shards(queue: Queue, flow_id: str) -> list[tuple[Queue, int]]:
    """The shards holding some of the flow's jobs (each shard's `:flow:<id>` lists its own)."""
    ids.validate_job_id(flow_id)
    found = spots(queue)
    pipe = queue.client.pipeline(transaction=False)
    for q, index in found:
        pipe.exists(q.shard(index).key(f"flow:{flow_id}"))
    return [spot for spot, there in zip(found, pipe.execute(), strict=True) if there]


def members(flow_id: str, queue: str = "default") -> list[JobInfo]:
    """A flow's jobs, in the flow's order, as Valkey holds them now, from every shard they are
    on, of `queue` or of any other (rows that expired are left out); the rows are read in one
    pipeline (the console's flow page reads a page at a time: `readmodels.flow_page`)."""
    target = Queue(queue)
    placed = []
    for q, index in _flow_shards(target, flow_id):
        for job_id, position in target.client.zrange(q.shard(index).key(f"flow:{flow_id}"), 0,
                                                     -1, withscores=True):
            placed.append((position, job_id, q, index))
    placed.sort(key=lambda item: item[:2])
    pipe = target.client.pipeline(transaction=False)
    for _, job_id, q, index in placed:
        pipe.hgetall(q.shard(index).job(job_id))
    return [JobInfo.from_row(job_id, q.name, row, index, q.options.max_attempts)
            for (_, job_id, q, index), row in zip(placed, pipe.execute(), strict=True) if row]


def waits_for(info: JobInfo) -> list[str]:
    """The jobs a waiting job still waits for."""
    if info.state != "waiting":
        return []
    return sorted(Queue(info.queue).client.smembers(
        Queue(info.queue).shard(info.shard).key(f"deps:{info.id}")))


def cancel(flow_id: str, queue: str = "default") -> int:
    """Cancel every job of a flow that has not started, on every queue it spans (a running one
    is flagged: it sees `ctx.cancelled`); how many were cancelled or flagged. The last jobs go
    first, so a job waiting for others ends cancelled by the operator, not by a member's
    failure policy."""
    done, found = 0, members(flow_id, queue)
    queues = {name: Queue(name) for name in {info.queue for info in found}}
    for info in reversed(found):
        try:
            queues[info.queue].cancel(info.id)
            done += 1
        except (InvalidTransition, JobNotFound):
            continue  # finished, or cancelled meanwhile by a member's failure policy
    for name, index in {(info.queue, info.shard) for info in found}:  # (what the cancels
        relay.relay_shard(queues[name], index)  # forwarded: applied now)
    return done
