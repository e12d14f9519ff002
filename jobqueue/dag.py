"""Jobs that wait for other jobs: a flow's jobs placed on one shard and written in one script
call (`flow.lua`), each dependent released by the script that finishes its last member.

A flow (a chain, a group, a chord, or one job's `depends_on`) is pinned to one shard of its
queue, as a lane is: the shard of the jobs it depends on that exist already, else of its lanes,
else of its last job's id. So "member done" and "dependent released" are one script call, fenced
by the member's token, and a replayed ack or a finisher killed at any point cannot release a
dependent twice or never (see `member_done` in `_common.lua`). A flow whose jobs would need
several shards or queues is refused (InvalidFlow). `api.submit_flow` decides when a flow is
written (now, at the commit, or from a durable queue's rows: outbox.py); this module writes it.

Touches `:job:<id>`, `:waiting`, `:deps:<id>`, `:results:<id>` and `:flow:<id>` only through
the `flow` script; `flows.py` reads `:flow:<id>` for a flow's members.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, NamedTuple

from . import layouts, signals
from .conf import get_config
from .exceptions import InvalidFlow
from .refs import JobRef
from .scripts import caller
from .spec import JobSpec, Prepared, prepare
from .store import Queue

POLICIES = {"fail": "f", "ignore": "i", "continue": "c"}
"""What a failed member (dead or cancelled) does to a job waiting for it: "fail" cancels the job
(and what waits for it), naming the member; "ignore" runs it once the others are done, with an
error object in the member's slot; "continue" runs it at once."""
TURNS = 5
"""Times a flow is sent again after its shard turned it away (a resize retired the shard)."""


def policy(value: str) -> str:
    """The script's code for a failure policy; InvalidFlow names the allowed ones."""
    if value in POLICIES.values():
        return value
    try:
        return POLICIES[value]
    except (KeyError, TypeError):
        raise InvalidFlow(f"on_failure must be one of {sorted(POLICIES)}, got {value!r}") from None


class Node(NamedTuple):
    """One job of a flow: its spec (with its id), the jobs it waits for as (id, slot, policy
    code), what their outcomes become ('' nothing, 'first' its first argument (one slot),
    'list' a list of `slots` outcomes in slot order as its first argument), and its position in
    the flow's index (0: its place in the call that writes it)."""

    spec: JobSpec
    members: tuple[tuple[str, int, str], ...] = ()
    takes: str = ""
    slots: int = 0
    position: int = 0


Outcome = tuple[str, str]
"""A finished member's state and value (its result as JSON when it succeeded, else its last
error), for a member Valkey no longer holds: a durable queue's row says it."""


def checked(queue: Queue, nodes: Sequence[Node]) -> list[Prepared]:
    """The nodes validated: each spec, and the order (a job waits only for jobs before it or
    jobs that exist: anything else would be a cycle)."""
    if not nodes:
        raise InvalidFlow("a flow needs at least one job")
    prepared = [prepare(node.spec, queue.options, get_config().max_payload) for node in nodes]
    later = {job.job_id for job in prepared}
    for node, job in zip(nodes, prepared, strict=True):
        if job.unique_key:
            raise InvalidFlow(f"job {job.job_id}: unique_key is not supported in flows")
        if node.members and job.delay_ms:
            raise InvalidFlow(f"job {job.job_id}: a job with dependencies starts when they are "
                              f"done; delay and run_after are not supported")
        later.discard(job.job_id)
        for member, _, _ in node.members:
            if member == job.job_id or member in later:
                raise InvalidFlow(f"job {job.job_id} would wait for {member}, which waits for "
                                  f"it: a cycle")
    return prepared


def outside(nodes: Sequence[Node]) -> set[str]:
    """The jobs the nodes wait for that are not among them."""
    return {m for node in nodes for m, _, _ in node.members} - {str(n.spec.job_id) for n in nodes}


def enqueue(queue: Queue, nodes: Sequence[Node], prepared: list[Prepared],
            flow: str = "") -> list[JobRef]:
    """Write a new flow in one script call on its shard (InvalidFlow: an id taken already, a
    job it waits for that no live job is)."""
    write(queue, nodes, prepared, flow)
    return announced([JobRef(job.job_id, queue.name) for job in prepared])


def write(queue: Queue, nodes: Sequence[Node], prepared: list[Prepared], flow: str = "", *,
          outcomes: Mapping[str, Outcome] | None = None, again: bool = False,
          prefer: int | None = None) -> tuple[int, int]:
    """The flow script's call: (the shard written to, how many jobs were written). `again`: the
    jobs of a durable queue's rows, sent again (a job Valkey holds is left as it is);
    `outcomes`: those of the members Valkey may no longer hold; `prefer`: the shard its rows
    name, taken when nothing else pins the flow."""
    outcomes = outcomes or {}
    args: list[Any] = [flow, round(get_config().retention * 1000), "again" if again else "new",
                       len(nodes)]
    for position, (node, job) in enumerate(zip(nodes, prepared, strict=True), 1):
        args += [*job.argv(queue.options)[:8], node.takes, node.slots, node.position or position,
                 len(node.members)]
        for member in node.members:
            args += member
    args.append(len(outcomes))
    for job_id, (state, value) in outcomes.items():
        args += [job_id, state, value]
    away = outside(nodes)
    for turn in range(1, TURNS + 1):
        live = queue.layout(fresh=turn > 1).live
        index = shard_for(queue, prepared, away, live, queue.locate, prefer, outcomes)
        reply = caller.run(queue.client, "flow", queue.shard(index), args)
        if reply[1] == "ok":
            if not reply[0]:
                layouts.list_queue(queue.client, queue.name, index, live)
            return index, int(reply[2])
        if reply[1] == "exists":
            raise InvalidFlow(f"job id {reply[2]} is taken already")
        if reply[1] == "missing":
            raise InvalidFlow(f"no live job {reply[2]} in queue {queue.name!r} to depend on")
    raise InvalidFlow(f"queue {queue.name!r}: the flow's shard keeps turning it away (it is "
                      f"being retired by a resize); nothing was enqueued")


def shard_for(queue: Queue, prepared: list[Prepared], away: set[str], live: int,
              locate: Callable[[str], int | None], prefer: int | None = None,
              known: Collection[str] = ()) -> int:
    """The one shard of the flow: that of the jobs it waits for that exist (`locate`; one
    with a known outcome may be gone), else of its lanes, else `prefer`, else its last job's
    id's."""
    wanted: set[int] = set()
    for member in sorted(away):
        index = locate(member)
        if index is None and member not in known:
            raise InvalidFlow(f"no live job {member} in queue {queue.name!r} to depend on")
        if index is not None:
            wanted.add(index)
    wanted.update(layouts.place(job.job_id, job.lane, "", live) for job in prepared if job.lane)
    if len(wanted) > 1:
        raise InvalidFlow(f"a flow's jobs must share one shard of queue {queue.name!r}; these "
                          f"(their lanes, the jobs they wait for) are on shards {sorted(wanted)}")
    if wanted:
        return wanted.pop()
    if prefer is not None and prefer < live:
        return prefer
    return layouts.place(prepared[-1].job_id, "", "", live)


def announced(refs: list[JobRef]) -> list[JobRef]:
    """New jobs, told to the `job_enqueued` receivers (if any)."""
    if signals.job_enqueued.receivers and signals.job_enqueued.has_listeners(Queue):
        for ref in refs:
            signals.send(signals.job_enqueued, Queue, ref=ref)
    return refs
