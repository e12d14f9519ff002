"""Jobs that wait for other jobs: a flow's jobs placed on the shards of their queues and written
with one script call per shard (`flow.lua`), each dependent released once its members are done.

Each job of a flow (a chain, a group, a chord, or one job's `depends_on`) is placed as
`placement` says: by its lane, else where most of the jobs it waits for are, else by its own id,
as any job is; so a wide group that waits for nothing (a chord's header, a group on its own)
spreads over the queue's shards, and a chain keeps to one shard. A group that waits for
something (`chain(a, group([...]))`) does not spread: each member waits for `a`, so all go to
`a`'s shard and `a`'s own call releases them (the fast path below).
An edge member -> dependent on one shard is released by the script call that records the
member's outcome, fenced by its token (the fast path: `member_done` in `_flows.lua`). Across
shards, that same call writes a "member done" entry in the member's shard's `:outcomes` stream,
which a relay (relay.py) delivers to the dependent's shard (`deliver.lua`: a set, so a replay
changes nothing) before deleting it; so a replayed ack, a finisher killed at any point, or a
Valkey restart from its AOF cannot release a dependent twice or never.

Writing a flow that spans shards takes one call per shard, dependents' shards first; the edges
of members to dependents on other shards (links) are written by the member's shard's call once
the dependent is written, and a link to a member that has finished already forwards its outcome
at once. So no dependent is released early and no "done" is lost whatever the order; but a
client that dies between the calls leaves the jobs written so far (waiting for jobs never
written, or never linked): a durable queue's rows send the flow again (outbox.py), leaving
the jobs Valkey holds where they are; otherwise `flows.cancel` clears them (a
`depends_on` job has no flow id, and no `:flow:` index: cancel it by its id). Before the first
call, the jobs waited for outside the flow are located (InvalidFlow: none live) and, for a flow
of several calls, its ids checked free on every shard (one pipelined read); each call's script
checks both again, so an id taken or a member gone between the check and a later call is
refused there (InvalidFlow) with the earlier calls' jobs written.

A flow's jobs may name several queues (each node its own, `Node.queue`): each is placed on its
own queue's shards as above (where most of its members are among those of its queue), and an
edge to a dependent on another queue is one to another shard, its "member done" forwarded as
'<queue>#<index>' (`Place.seen_from`), relayed and delivered there the same way; the dependent's
queue's workers claim it once released. Such a flow names only known queues (configured, or in
Valkey's registry: a queue that has held jobs or had workers), none durable (`checked`: the
durable rows of a flow, outbox.py, are one queue's).
`dispatch.submit_flow` decides when a flow is written (now, at the commit, or from a durable queue's
rows: outbox.py); this module writes it.

Touches `:job:<id>`, `:waiting`, `:deps:<id>`, `:results:<id>`, `:flow:<id>` and `:outcomes` only
through the `flow` script; `members.py` reads `:flow:<id>` for a flow's members.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from .. import signals
from ..conf import get_config
from ..engine import layouts
from ..engine.refs import JobRef
from ..engine.scripts import calls
from ..engine.store import Queue
from ..exceptions import InvalidFlow
from ..options import did_you_mean
from ..spec import JobSpec, Prepared, prepare
from . import relay

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
    'list' a list of `slots` outcomes in slot order as its first argument), its position in
    the flow's index (0: its place in the call that writes it), its queue ('' the flow's: the
    one `write` is given) and the queues of the jobs outside the flow it waits for that are on
    another queue than its own, as (id, queue)."""

    spec: JobSpec
    members: tuple[tuple[str, int, str], ...] = ()
    takes: str = ""
    slots: int = 0
    position: int = 0
    queue: str = ""
    away: tuple[tuple[str, str], ...] = ()


class Place(NamedTuple):
    """Where a job is: a shard of a queue."""

    queue: str
    shard: int

    def seen_from(self, other: Place) -> str:
        """How the flow script on shard `other` names this one: '' itself, its index on the
        same queue, '<queue>#<index>' on another (no queue name holds '#')."""
        if self == other:
            return ""
        return str(self.shard) if self.queue == other.queue else f"{self.queue}#{self.shard}"


Outcome = tuple[str, str]
"""A finished member's state and value (its result as JSON when it succeeded, else its last
error), for a member Valkey no longer holds: a durable queue's row says it."""


def queues_of(queue: Queue, nodes: Sequence[Node]) -> list[str]:
    """The queues a flow's jobs are on, and those of the jobs outside it they wait for: the
    flow's (`queue`) first."""
    names = dict.fromkeys([queue.name, *(n.queue or queue.name for n in nodes),
                           *(name for n in nodes for _, name in n.away)])
    return list(names)


def checked(queue: Queue, nodes: Sequence[Node]) -> list[Prepared]:
    """The nodes validated: each spec (with its own queue's options), the queues (across
    queues: none durable, none unknown), and the order (a job waits only for jobs before it or
    jobs that exist: anything else would be a cycle)."""
    if not nodes:
        raise InvalidFlow("a flow needs at least one job")
    names = queues_of(queue, nodes)
    if len(names) > 1:
        _check_queues(queue, names)
    config = get_config()
    options = [config.queue(node.queue or queue.name) for node in nodes]
    # (a flow's data stays sealed throughout: one sealed job or queue seals every job of it)
    sealed = any(node.spec.encrypt or o.encrypt for node, o in zip(nodes, options, strict=True))
    prepared = [prepare(node.spec._replace(encrypt=True) if sealed else node.spec, o,
                        config.max_payload) for node, o in zip(nodes, options, strict=True)]
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


def _check_queues(queue: Queue, names: Sequence[str]) -> None:
    """A flow across these queues: InvalidFlow when one is durable (its rows are one queue's:
    outbox.py) or unknown (neither in settings nor in Valkey's registry: a typo's jobs would
    wait for workers that never come)."""
    config = get_config()
    for name in names:
        if config.queue(name).durable:
            raise InvalidFlow(f"a flow across queues ({', '.join(names)}) cannot include the "
                              f"durable queue {name!r}: put every job of a durable flow on that "
                              f"one queue")
    known = {"default", *layouts.known_queues(queue.client)}
    for name in names:
        if name not in known:
            raise InvalidFlow(f"a flow names the unknown queue {name!r} (neither in "
                              f"JOBQUEUE['QUEUES'] nor ever used){did_you_mean([name], known)}")


def outside(nodes: Sequence[Node]) -> set[str]:
    """The jobs the nodes wait for that are not among them."""
    return {m for node in nodes for m, _, _ in node.members} - {str(n.spec.job_id) for n in nodes}


def enqueue(queue: Queue, nodes: Sequence[Node], prepared: list[Prepared],
            flow: str = "") -> list[JobRef]:
    """Write a new flow, one script call per shard it spans (InvalidFlow: an id taken already,
    a job it waits for that no live job is)."""
    write(queue, nodes, prepared, flow)
    return announced(refs(queue, nodes, prepared))


def refs(queue: Queue, nodes: Sequence[Node], prepared: Sequence[Prepared]) -> list[JobRef]:
    """The flow's jobs' refs, each on its own queue."""
    return [JobRef(job.job_id, node.queue or queue.name)
            for node, job in zip(nodes, prepared, strict=True)]


def write(queue: Queue, nodes: Sequence[Node], prepared: list[Prepared], flow: str = "", *,
          outcomes: Mapping[str, Outcome] | None = None, again: bool = False,
          prefer: Mapping[str, int] | None = None) -> tuple[dict[str, Place], int]:
    """The flow script's calls: (each job's place, how many jobs were written). One call per
    shard the jobs are placed on (`placement`), the shards of dependents first; each call
    carries the links (the edges of members of its shard to dependents written already on
    other shards), and the links left over go last, in calls of their own. `queue`: the flow's
    (that of a node naming none); `again`: the jobs of a durable queue's rows, sent again (a
    job Valkey holds is left as it is); `outcomes`: those of the members Valkey may no longer
    hold; `prefer`: the shards their rows name."""
    writing = Writing(queue, list(zip(nodes, prepared, strict=True)), flow, outcomes or {},
                      again)
    if again:
        writing.keep(writing.held())
    for turn in range(1, TURNS + 1):
        lives = {name: q.layout(fresh=turn > 1).live for name, q in writing.queues.items()}
        where = placement(writing.todo, lives, prefer or {}, writing.locate, writing.placed,
                          home=queue.name)
        shards = order(writing.todo, where)
        if turn == 1 and not again and len(shards) > 1 and (taken := writing.held()):
            raise InvalidFlow(f"job id {min(taken)} is taken already")
        if all(writing.call(place, where) for place in shards):
            writing.links_left(where)
            return writing.placed, writing.written
    raise InvalidFlow(f"queue {queue.name!r}: a shard of the flow keeps turning it away (it is "
                      f"being retired by a resize); its jobs written so far wait for the rest")


class Writing:
    """A flow being written: its queues, the jobs still to write, those written (by place),
    the members found outside it, and the links sent (see `write`)."""

    def __init__(self, queue: Queue, todo: list[tuple[Node, Prepared]], flow: str,
                 outcomes: Mapping[str, Outcome], again: bool) -> None:
        self.todo, self.flow, self.outcomes, self.again = todo, flow, outcomes, again
        self.queues = {name: queue if name == queue.name else Queue(name, client=queue.client)
                       for name in queues_of(queue, [node for node, _ in todo])}
        self.home = {str(job.job_id): node.queue or queue.name for node, job in todo}
        """Each job's queue; and, below, the queue of each job outside the flow it waits for:
        the one its dependent names (`Node.away`), else its dependent's."""
        for node, job in todo:
            for member, _, _ in node.members:
                self.home.setdefault(member, dict(node.away).get(member, self.home[job.job_id]))
        self.edges = [(m, slot, pol, str(job.job_id)) for node, job in todo
                      for m, slot, pol in node.members]
        self.positions = {str(job.job_id): n for n, (_, job) in enumerate(todo, 1)}
        """Each job's place in the flow's index when its node names none (1 = the first)."""
        self.placed: dict[str, Place] = {}
        self.located: dict[str, Place | None] = {}
        self.linked: set[tuple[str, str]] = set()
        self.written = 0

    def held(self) -> dict[str, Place]:
        """The jobs still to write that a shard of their queue holds already, and where (one
        pipelined read of every shard each queue ever had: one EXISTS per shard of all the
        ids that may be there, and only when one is, one per id and shard)."""
        ids = [str(job.job_id) for _, job in self.todo]
        spots = {name: [Place(name, i) for i in range(q.all_shards())]
                 for name, q in self.queues.items()}
        client = next(iter(self.queues.values())).client
        pipe = client.pipeline(transaction=False)
        for name, places in spots.items():
            mine = [job_id for job_id in ids if self.home[job_id] == name]
            for place in places if mine else ():
                shard = self.queues[name].shard(place.shard)
                pipe.exists(*(shard.job(job_id) for job_id in mine))
        if not any(pipe.execute()):
            return {}
        pipe = client.pipeline(transaction=False)
        for job_id in ids:
            for place in spots[self.home[job_id]]:
                pipe.exists(self.queues[place.queue].shard(place.shard).job(job_id))
        found = iter(pipe.execute())
        held: dict[str, Place] = {}
        for job_id in ids:
            for place in spots[self.home[job_id]]:
                if next(found) and job_id not in held:
                    held[job_id] = place
        return held

    def keep(self, held: Mapping[str, Place]) -> None:
        """Leave the jobs Valkey holds already where they are (mode 'again': placed under
        today's layout, a job could be written a second time on another shard); the edges
        between two of them were written with the later one."""
        self.placed.update(held)
        self.todo = [item for item in self.todo if item[1].job_id not in held]
        self.linked.update((m, dep) for m, _, _, dep in self.edges if m in held and dep in held)

    def locate(self, member: str) -> Place | None:
        """Where a job outside the flow is (looked up once, on its queue), None when Valkey
        lacks it and its outcome is given; InvalidFlow when neither."""
        if member not in self.located:
            name = self.home[member]
            index = self.queues[name].locate(member)
            self.located[member] = None if index is None else Place(name, index)
            if index is None and member not in self.outcomes:
                raise InvalidFlow(f"no live job {member} in queue {name!r} to depend on")
        return self.located[member]

    def call(self, place: Place, where: Mapping[str, Place | None]) -> bool:
        """Write the jobs placed on shard `place` and the links due there; False when the shard
        turned them away (it is draining: placed again at the next turn)."""
        queue = self.queues[place.queue]
        batch = [(node, job) for node, job in self.todo if where[job.job_id] == place]
        links = self.links_due(place, where)
        jobs = [calls.FlowJob(job, node.takes, node.slots, node.position
                              or self.positions[job.job_id],
                              [(member, slot, pol, "" if (away := where.get(member)) is None
                                else away.seen_from(place)) for member, slot, pol in node.members])
                for node, job in batch]
        reply = calls.flow(queue.client, queue.shard(place.shard), self.flow,
                           round(get_config().retention * 1000), "again" if self.again else "new",
                           jobs, self.outcomes, links, options=queue.options)
        if reply.moved:
            return False
        if not reply.listed:
            layouts.list_queue(queue.client, queue.name, place.shard, queue.layout().live)
        self.written += reply.written
        self.placed.update((str(job.job_id), place) for _, job in batch)
        self.todo = [item for item in self.todo if where[item[1].job_id] != place]
        self.linked.update((link[0], link[1]) for link in links)
        self.linked.update((member, str(job.job_id)) for node, job in batch  # (written here)
                           for member, _, _ in node.members if where.get(member) in (None, place))
        if reply.forwarded:  # (a link to a member that had finished: its outcome, delivered now)
            relay.relay_shard(queue, place.shard)
        return True

    def links_due(self, place: Place, where: Mapping[str, Place | None]) -> list[list[Any]]:
        """The edges member -> dependent to write on shard `place`, the member's: those not
        written yet whose member is there and whose dependent is written already, on another
        shard or by an earlier call on this one (the member placed here after its call was
        turned away: a resize), '' as the shard then."""
        due = []
        for member, slot, pol, dep in self.edges:
            away, home = where.get(member), self.placed.get(dep)
            if away == place and home is not None and (member, dep) not in self.linked:
                due.append([member, dep, slot, pol, home.seen_from(place)])
        return due

    def links_left(self, where: Mapping[str, Place | None]) -> None:
        """Send the links no call of the jobs carried (members outside the flow, or written
        before their dependents, or kept: see `keep`)."""
        self.todo = []
        where = {**where, **{m: self.locate(m) for m, _, _, _ in self.edges if m not in where}}
        for place in sorted({away for m, _, _, _ in self.edges
                             if (away := where.get(m)) is not None}):
            if self.links_due(place, where):
                self.call(place, where)


def placement(todo: Sequence[tuple[Node, Prepared]], lives: Mapping[str, int],
              prefer: Mapping[str, int], locate: Callable[[str], Place | None],
              placed: Mapping[str, Place] | None = None, *, home: str) -> dict[str, Place | None]:
    """Where each job goes (on its queue, `home` when its node names none; `lives`: each
    queue's live shards), and where the members outside the flow are (None: a member Valkey
    lacks whose outcome is given, applied on its dependent's shard). A job with a lane goes to
    its lane's shard; else to the shard its row names (`prefer`); else one that waits for
    others goes where most of those of its queue are (a chain stays on one shard, and a
    dependent of one job is released in that job's own call); else by its id, as any job is
    (a group's members spread over the queue's shards)."""
    where: dict[str, Place | None] = dict(placed or {})
    for node, job in todo:
        name = node.queue or home
        live, wanted = lives[name], prefer.get(job.job_id)
        if job.lane:
            where[job.job_id] = Place(name, layouts.place(job.job_id, job.lane, "", live))
        elif wanted is not None and wanted < live:
            where[job.job_id] = Place(name, wanted)
        elif node.members:
            shards: Counter[int] = Counter()
            for member, _, _ in node.members:
                found = where[member] if member in where else locate(member)
                where[member] = found
                if found is not None and found.queue == name and found.shard < live:
                    shards[found.shard] += 1  # (not one draining: it takes no job)
            where[job.job_id] = Place(name, shards.most_common(1)[0][0] if shards
                                      else layouts.place(job.job_id, "", "", live))
        else:
            where[job.job_id] = Place(name, layouts.place(job.job_id, "", "", live))
    for member in {m for node, _ in todo for m, _, _ in node.members} - where.keys():
        where[member] = locate(member)
    return where


def order(todo: Sequence[tuple[Node, Prepared]], where: Mapping[str, Place | None]
          ) -> list[Place]:
    """The shards to write, those of the latest jobs (the dependents) first: a member written
    after its dependent carries its link in its own call."""
    last: dict[Place, int] = {}
    for position, (_, job) in enumerate(todo):
        place = where[job.job_id]
        if place is not None:
            last[place] = position
    return sorted(last, key=lambda place: -last[place])


def announced(refs: list[JobRef]) -> list[JobRef]:
    """New jobs, told to the `job_enqueued` receivers (if any)."""
    if signals.job_enqueued.receivers and signals.job_enqueued.has_listeners(Queue):
        for ref in refs:
            signals.send(signals.job_enqueued, Queue, ref=ref)
    return refs
