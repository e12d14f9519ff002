"""Workflows: `chain`, `group` and `chord` of signatures (`handler.s(...)`), and reading or
cancelling a flow.

    chain(fetch.s(url), parse.s(), store.s()).enqueue()   # each step gets the previous result first
    group([resize.s(i) for i in range(100)]).enqueue()    # GroupRef: result() is the list, in order
    chord([count.s(i) for i in range(100)], total.s()).enqueue()  # total(results) once all are done

A flow's jobs share one queue and are placed on its shards as dag.py says (a group's members
spread over them, a chain keeps to one), one script call per shard; the flow's id is the id of
its last job (a chain's last step, a chord's callback) or, for a group, an id
of its own. `on_failure` ("fail", "ignore", "continue": `dag.POLICIES`) is the flow's policy for
members whose own signature sets none.

Reads `:flow:<id>` (its jobs, in order) on every shard of the flow's queue, and has the
`:forward` entries a cancel left relayed at once (relay.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from . import ids, relay
from .api import Signature, submit_flow
from .dag import Node, policy
from .exceptions import InvalidFlow, InvalidTransition, JobNotFound
from .records import JobInfo
from .refs import JobRef
from .store import Queue


def _queue(steps: Sequence[Signature]) -> Queue:
    names = {sig.handler.options.queue for sig in steps}
    if len(names) != 1:
        raise InvalidFlow(f"a flow's jobs must share one queue; these name {sorted(names)}")
    return Queue(names.pop())


def _signatures(items: Iterable[Signature], what: str) -> list[Signature]:
    found = list(items)
    if not found:
        raise InvalidFlow(f"{what} needs at least one signature")
    for item in found:
        if not isinstance(item, Signature):
            raise InvalidFlow(f"{what} takes signatures (handler.s(...)), got {item!r}")
    return found


def _immediate(steps: Sequence[Signature]) -> bool:
    return any(sig.handler.options.immediate for sig in steps)


@dataclass(frozen=True)
class GroupRef:
    """A handle on an enqueued group: its members' refs, in order."""

    id: str
    queue: str
    refs: tuple[JobRef, ...]

    def result(self, timeout: float | None = None) -> list[Any]:
        """Every member's result, in order, once all have succeeded (JobFailed for the first
        that did not, TimeoutError when `timeout` seconds pass first)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        return [ref.result(None if deadline is None else max(deadline - time.monotonic(), 0))
                for ref in self.refs]

    async def aresult(self, timeout: float | None = None) -> list[Any]:
        """`result`, awaited: the members are awaited together."""
        return list(await asyncio.wait_for(
            asyncio.gather(*(ref.aresult() for ref in self.refs)), timeout))


@dataclass(frozen=True)
class Chain:
    """Steps run one after another, each getting the previous one's result as its first
    argument."""

    steps: tuple[Signature, ...]
    on_failure: str | None = None

    def enqueue(self) -> JobRef:
        """The JobRef of the last step (its id is the flow's)."""
        flow = policy(self.on_failure or "fail")
        nodes = [self.steps[0].node(policy=flow)]
        for sig in self.steps[1:]:
            edge = (str(nodes[-1].spec.job_id), 0, _policy(self.steps, nodes, flow))
            nodes.append(sig.node((edge,), "first", flow))
        return submit_flow(_queue(self.steps), nodes, str(nodes[-1].spec.job_id),
                      _immediate(self.steps))[-1]


def _policy(steps: Sequence[Signature], nodes: Sequence[Node], flow: str) -> str:
    """The policy of the edge out of the latest node: its own signature's, else the flow's."""
    own = steps[len(nodes) - 1].handler.options.on_failure
    return own or flow


@dataclass(frozen=True)
class Group:
    """Jobs run side by side; `result()` lists their results in order."""

    members: tuple[Signature, ...]

    def enqueue(self) -> GroupRef:
        nodes = [sig.node() for sig in self.members]
        flow = ids.new_id()
        refs = submit_flow(_queue(self.members), nodes, flow, _immediate(self.members))
        return GroupRef(flow, refs[0].queue, tuple(refs))


@dataclass(frozen=True)
class Chord:
    """A group and a callback that gets the list of their results, once all succeeded."""

    header: tuple[Signature, ...]
    callback: Signature
    on_failure: str | None = None

    def enqueue(self) -> JobRef:
        """The callback's JobRef (its id is the flow's)."""
        flow = policy(self.on_failure or "fail")
        nodes = [sig.node() for sig in self.header]
        edges = tuple((str(node.spec.job_id), slot, sig.handler.options.on_failure or flow)
                      for slot, (node, sig) in enumerate(zip(nodes, self.header, strict=True)))
        last = self.callback.node(edges, "list", flow)
        steps = (*self.header, self.callback)
        return submit_flow(_queue(steps), [*nodes, last], str(last.spec.job_id), _immediate(steps))[-1]


def chain(*steps: Signature, on_failure: str | None = None) -> Chain:
    """Steps that run in turn, each getting the previous result as its first argument."""
    return Chain(tuple(_signatures(steps, "a chain")), on_failure)


def group(members: Iterable[Signature]) -> Group:
    """Members that run side by side (an empty group is refused)."""
    return Group(tuple(_signatures(members, "a group")))


def chord(header: Iterable[Signature], callback: Signature,
          on_failure: str | None = None) -> Chord:
    """`callback(results)` once, when every member of `header` has succeeded."""
    return Chord(tuple(_signatures(header, "a chord's header")),
                 _signatures([callback], "a chord's callback")[0], on_failure)


def _flow_shards(queue: Queue, flow_id: str) -> list[int]:
    """The shards holding some of the flow's jobs (each shard's `:flow:<id>` lists its own)."""
    ids.validate_job_id(flow_id)
    return [index for index in range(queue.all_shards())
            if queue.client.exists(queue.shard(index).key(f"flow:{flow_id}"))]


def members(flow_id: str, queue: str = "default") -> list[JobInfo]:
    """A flow's jobs, in the flow's order, as Valkey holds them now, from every shard they are
    on (rows that expired are left out)."""
    target = Queue(queue)
    placed = []
    for index in _flow_shards(target, flow_id):
        shard = target.shard(index)
        for job_id, position in target.client.zrange(shard.key(f"flow:{flow_id}"), 0, -1,
                                                     withscores=True):
            placed.append((position, job_id, index))
    found = []
    for _, job_id, index in sorted(placed):
        row = target.client.hgetall(target.shard(index).job(job_id))
        if row:
            found.append(JobInfo.from_row(job_id, queue, row, index, target.options.max_attempts))
    return found


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
