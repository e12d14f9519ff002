"""Workflows: `chain`, `group` and `chord` of signatures (`handler.s(...)`) and of each other
(reading or cancelling a flow once written: `jobqueue.flows`).

    chain(fetch.s(url), parse.s(), store.s()).enqueue()   # each step gets the previous result first
    group([resize.s(i) for i in range(100)]).enqueue()    # GroupRef: result() is the list, in order
    chord([count.s(i) for i in range(100)], total.s()).enqueue()  # total(results) once all are done
    chain(a.s(), group([b.s(), c.s()]), d.s())             # b(a), c(a), then d([b, c])

A composite, however nested, compiles (`_Build`) to one list of `graph.Node`s, each waiting only
for nodes before it, placed on its queue's shards as `jobqueue.flows.graph` says (a group's
members spread over them, a chain keeps to one) and written one script call per shard. Each
signature's job goes to its own handler's queue (`chord([work.s(i) ...], report.s())` with
`work` on one queue and `report` on another): a flow may span queues, each job run by its
queue's workers (graph.py; a durable or unknown queue in such a flow is refused). What a
part hands on to the jobs that wait for it: a signature its result; a chain its last step's; a
chord its callback's; a group the list of its members' (a nested group's spliced in, as Celery
unrolls them), so the step after a group gets a list, as Celery's `group | task` chord does.
The flow's id is that of the job whose result the call returns (a chain's last step, a chord's
callback), or an id of its own when the result is a list (a GroupRef).

`on_failure` ("fail", "ignore", "continue": `graph.POLICIES`) on a composite rules the edges it
makes (a chain's from one step to the next, a chord's from its header to its callback) and what
its result jobs hand on to an outer composite that sets none: an edge takes its member's own
policy (its signature's), else that of the nearest composite around the member that sets one,
up to the composite that makes the edge; else "fail". An outer policy does not reach into the
edges an inner composite makes: a chain inside a chord's header stops at its failed step, and
the chord's policy says what that does to the callback.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .. import ids
from ..engine.refs import JobRef
from ..engine.store import Queue
from ..exceptions import InvalidFlow
from ..flows.graph import Node, policy
from .dispatch import submit_flow
from .registry import Signature


def _parts(items: Iterable[Part], what: str) -> list[Part]:
    """The parts of a composite, checked: at least one, each a signature or a composite."""
    try:
        found = list(items)
    except TypeError:
        raise InvalidFlow(f"{what} takes a list of signatures (handler.s(...)) or "
                          f"chain/group/chord, got {items!r}") from None
    if not found:
        raise InvalidFlow(f"{what} needs at least one signature")
    for item in found:
        if not isinstance(item, (Signature, Chain, Group, Chord)):
            raise InvalidFlow(f"{what} takes signatures (handler.s(...)) or chain/group/chord, "
                              f"got {item!r}")
    return found


def _code(on_failure: str | None) -> str:
    """A composite's policy as the script's code, '' when it sets none."""
    return "" if on_failure is None else policy(on_failure)


@dataclass(frozen=True)
class GroupRef:
    """A handle on an enqueued group: the refs of the jobs whose results make its list, in
    order (a member that is a chain: its last step; a chord: its callback; a nested group: its
    own, spliced in)."""

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
class _Out:
    """What a compiled part hands on to the jobs that wait for it: its result jobs, each with
    the policy code of its edges out ('' while neither its signature nor a composite around it
    set one), and whether it is a list (a group's results, a chord's header) or one value."""

    jobs: tuple[tuple[str, str], ...]
    many: bool

    def ruled(self, code: str) -> _Out:
        """The policies left open, set to `code` (an enclosing composite's; '' none)."""
        return _Out(tuple((job, own or code) for job, own in self.jobs), self.many)


class _Build:
    """A flow being compiled: its nodes in order (each waits only for nodes before it) and the
    signatures they come from."""

    def __init__(self) -> None:
        self.nodes: list[Node] = []
        self.signatures: list[Signature] = []
        self.ids: set[str] = set()

    def add(self, part: Part, waits: _Out | None, near: str) -> _Out:
        """`part`'s jobs, the first ones waiting for `waits` (its jobs' policies settled) and
        getting their outcome as first argument: the one value, or the list. `near`: the
        policy of the nearest composite that sets one (for a signature's `depends_on`)."""
        if not isinstance(part, Signature):
            return part.into(self, waits, near)
        members: tuple[tuple[str, int, str], ...] = ()
        if waits is not None:
            members = tuple((job, slot, own) for slot, (job, own) in enumerate(waits.jobs))
        node = part.node(members, "" if waits is None else "list" if waits.many else "first",
                         near or "f")
        job_id = str(node.spec.job_id)
        if job_id in self.ids:  # (a signature reused with its own job_id)
            raise InvalidFlow(f"job id {job_id} appears twice in one flow")
        self.ids.add(job_id)
        self.nodes.append(node)
        self.signatures.append(part)
        return _Out(((job_id, part.handler.options.on_failure or ""),), False)

    def enqueue(self, part: Part) -> JobRef | GroupRef:
        """Compile `part` and write it as one flow: the JobRef of the job whose result is the
        flow's (its id is the flow's), or, when that is a list, a GroupRef (a new flow id)."""
        out = self.add(part, None, "")
        flow = ids.new_id() if out.many else out.jobs[0][0]
        # (the flow's queue: its result job's, a group's first one's; each node names its own)
        first = next(node for node in self.nodes if str(node.spec.job_id) == out.jobs[0][0])
        queue = Queue(first.queue)
        refs = submit_flow(queue, self.nodes, flow,
                           any(sig.handler.options.immediate for sig in self.signatures))
        by_id = {ref.id: ref for ref in refs}
        if not out.many:
            return by_id[flow]
        return GroupRef(flow, queue.name, tuple(by_id[job] for job, _ in out.jobs))


def _settled(out: _Out, code: str) -> _Out:
    """The edges out of a part that a composite makes: each job's own policy, else the one
    set on the way up to the composite, else the composite's, else "fail"."""
    return out.ruled(code).ruled("f")


@dataclass(frozen=True)
class Chain:
    """Steps run one after another, each getting the previous one's result as its first
    argument (a group's: the list of its results)."""

    steps: tuple[Part, ...]
    on_failure: str | None = None

    def enqueue(self) -> JobRef | GroupRef:
        """The JobRef of the last step (its id is the flow's); a GroupRef when the last step
        is a group."""
        return _Build().enqueue(self)

    def into(self, build: _Build, waits: _Out | None, near: str) -> _Out:
        """Its steps in `build`: the first waits for `waits`, each next for the one before."""
        code = _code(self.on_failure)
        out = build.add(self.steps[0], waits, code or near)
        for step in self.steps[1:]:
            out = build.add(step, _settled(out, code), code or near)
        return out.ruled(code)


@dataclass(frozen=True)
class Group:
    """Jobs run side by side; `result()` lists their results in order."""

    members: tuple[Part, ...]
    on_failure: str | None = None

    def enqueue(self) -> GroupRef:
        """A GroupRef: its id is the flow's, its refs those whose results make the list."""
        ref = _Build().enqueue(self)
        assert isinstance(ref, GroupRef)  # (a group's result is a list)
        return ref

    def into(self, build: _Build, waits: _Out | None, near: str) -> _Out:
        """Its members in `build`, each waiting for `waits`; its result is their list."""
        code = _code(self.on_failure)
        outs = [build.add(member, waits, code or near) for member in self.members]
        return _Out(tuple(job for out in outs for job in out.jobs), True).ruled(code)


@dataclass(frozen=True)
class Chord:
    """A group and a callback that gets the list of their results, once all succeeded."""

    header: tuple[Part, ...]
    callback: Part
    on_failure: str | None = None

    def enqueue(self) -> JobRef | GroupRef:
        """The callback's JobRef (its id is the flow's); a GroupRef when the callback is a
        group."""
        return _Build().enqueue(self)

    def into(self, build: _Build, waits: _Out | None, near: str) -> _Out:
        """Its header in `build` (each member waiting for `waits`), then its callback."""
        code = _code(self.on_failure)
        header = Group(self.header).into(build, waits, code or near)
        return build.add(self.callback, _settled(header, code), code or near).ruled(code)


Part = Signature | Chain | Group | Chord
"""What a flow is made of: signatures, and chains, groups and chords of them, nested."""


def chain(*steps: Part, on_failure: str | None = None) -> Chain:
    """Steps that run in turn, each getting the previous result as its first argument."""
    _code(on_failure)
    return Chain(tuple(_parts(steps, "a chain")), on_failure)


def group(members: Iterable[Part], on_failure: str | None = None) -> Group:
    """Members that run side by side (an empty group is refused). `on_failure`: what a failed
    member does to what waits for the group (in a chain, or a chord's header)."""
    _code(on_failure)
    return Group(tuple(_parts(members, "a group")), on_failure)


def chord(header: Iterable[Part], callback: Part, on_failure: str | None = None) -> Chord:
    """`callback(results)` once, when every member of `header` has succeeded."""
    _code(on_failure)
    return Chord(tuple(_parts(header, "a chord's header")),
                 _parts([callback], "a chord's callback")[0], on_failure)
