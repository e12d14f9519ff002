"""Flows meeting operator actions and expiry, against a model (hypothesis, stateful), on a real
Valkey and a real cluster: random flows (chain, group, chord, `depends_on`; failure policies,
lanes, expiry) on a queue of several shards, some of their jobs on a second queue (a flow across
queues), claimed, acked and failed through `Queue` as a
worker would (relaying what an outcome forwarded), mixed with an operator's cancel, retry,
reprioritize, `flows.cancel` and resize, with the maintenance that settles a resize, and with
time passing a job's expiry. After every step:

- a job claimed has its members done as its policies say ("fail": every one succeeded;
  "ignore": every one ended; "continue": every one ended, or one failed), their outcomes as its
  first argument (a chain's step: its member's; a chord's callback: the list, in order), and is
  claimed at most once between two operator retries of it;
- a job of a flow an operator cancelled is never claimed after, unless the operator retried
  that job itself since;
- a waiting job waits for something: its set of members holds none that succeeded, and is not
  empty; `counts()["waiting"]` counts the waiting jobs.

At the end, every ready job run: a job still waiting waits for a member that failed (which only
a retry of it can bring back), or for one that waits so, and none is pending where no claim
looks.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from jobqueue import JobRef, Queue, chain, chord, conf, flows, group
from jobqueue.engine import layouts
from jobqueue.exceptions import InvalidFlow, InvalidOption, InvalidTransition
from jobqueue.flows import relay
from jobqueue.records import Lease
from tests.jobapp import jobs
from tests.servers import flush_all

NAME = "flowq"
SHARDS = 2
OTHER = "flowr"
"""A second queue (of one shard): some jobs of a flow go there (a flow across queues)."""
MOST = 12
"""Jobs an example enqueues at most: later steps work, fail and operate on them."""
FAILED = {"dead", "cancelled", "expired"}
LIVE = {"pending", "scheduled", "active", "waiting"}
POLICIES = [None, "fail", "ignore", "continue"]
CODE = {None: "f", "fail": "f", "ignore": "i", "continue": "c"}


@dataclass
class Job:
    """What the model knows of one job: the members it waits for ((id, slot, policy code)),
    what their outcomes become ('' | 'first' | 'list'), its own arguments, its flow, and what
    was seen of it."""

    id: str
    edges: list[tuple[str, int, str]]
    takes: str
    args: list[Any]
    flow: str | None
    expires: bool
    generation: int = 0
    """Operator retries of it so far."""
    claims: dict[int, int] = field(default_factory=dict)
    """Claims per generation."""
    cancelled_with_flow: int | None = None
    """Its generation when an operator cancelled its flow."""
    queue: str = NAME
    shard: int | None = None
    state: str = "pending"
    succeeded: bool = False
    ended: bool = False
    failed: bool = False


@st.composite
def signatures(draw: Any, count: int) -> list[dict[str, Any]]:
    """Options for `count` signatures: a policy of their own, a lane (none: placed by id, or with
    what they wait for), an expiry (which a rule lets pass), a run time limit (its deadline
    written when a started run is renewed)."""
    return [{"on_failure": draw(st.sampled_from(POLICIES)),
             "lane": draw(st.sampled_from([None, None, "a", "b", "c"])),
             "expires": draw(st.sampled_from([None, None, 3600])),
             "timeout": draw(st.sampled_from([None, None, 600])),
             "queue": draw(st.sampled_from([NAME, NAME, OTHER]))} for _ in range(count)]


def machine_for(client: Any) -> type[RuleBasedStateMachine]:
    class FlowMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            flush_all(client)
            layouts.forget(NAME)
            layouts.forget(OTHER)
            self.queue = Queue(NAME)
            self.queues = {NAME: self.queue, OTHER: Queue(OTHER)}
            self.jobs: dict[str, Job] = {}
            self.flows: list[str] = []
            self.leases: list[Lease] = []

        # -- helpers ------------------------------------------------------------------------

        def sig(self, options: dict[str, Any], *args: Any) -> Any:
            opts = {k: v for k, v in options.items() if v is not None}
            return jobs.echo.using(**{"queue": NAME, **opts}).s(*args)

        def add(self, job_id: str, options: dict[str, Any], args: list[Any], flow: str | None,
                edges: list[tuple[str, int, str]] | None = None, takes: str = "") -> None:
            self.jobs[job_id] = Job(job_id, edges or [], takes, args, flow,
                                    options["expires"] is not None,
                                    queue=options.get("queue") or NAME)

        def flow_ids(self, flow_id: str) -> list[str]:
            return [info.id for info in flows.members(flow_id, NAME)]

        def pick(self, n: int, states: set[str] | None = None) -> Job | None:
            found = [job for job in self.jobs.values() if states is None or job.state in states]
            return found[n % len(found)] if found else None

        def after_step(self) -> int:
            """As the workers would: what outcomes forwarded is delivered (relay.py), then the
            model reads every job's state. How many entries were delivered."""
            relayed = sum(relay.relay_queue(queue) for queue in self.queues.values())
            pipe = client.pipeline(transaction=False)
            for job in self.jobs.values():
                if job.shard is None:
                    job.shard = self.queues[job.queue].locate(job.id)
                pipe.hget(self.queues[job.queue].shard(job.shard or 0).job(job.id), "state")
            for job, state in zip(self.jobs.values(), pipe.execute(), strict=True):
                job.state = state
                job.succeeded = job.succeeded or state == "succeeded"
                job.ended = job.ended or state in FAILED or state == "succeeded"
                job.failed = job.failed or state in FAILED
            return relayed

        def outcome_ok(self, member: str, policy: str, value: Any, early: bool) -> bool:
            """Whether a slot's value is what the member handed on (`early`: the job was
            released by a failure under "continue", before every member ended)."""
            job = self.jobs[member]
            if value == member:  # its result (the ack's: its own id)
                return job.succeeded
            if isinstance(value, dict):  # an error object naming it
                return policy != "f" and value.get("job") == member and value.get("state") in FAILED
            return value is None and early

        def check_claim(self, lease: Lease) -> None:
            job = self.jobs[lease.job_id]
            job.claims[job.generation] = job.claims.get(job.generation, 0) + 1
            assert job.claims[job.generation] == 1, f"{job.id} claimed twice in one life"
            if job.cancelled_with_flow is not None:
                assert job.generation > job.cancelled_with_flow, f"{job.id}: its flow was cancelled"
            early = any(policy == "c" and self.jobs[m].failed for m, _, policy in job.edges)
            for member, _, policy in job.edges:
                seen = self.jobs[member]
                done = seen.succeeded if policy == "f" else seen.ended
                assert done or early, f"{job.id} ran before {member} ({policy}): {seen}"
            args = lease.payload.get("args", [])
            if job.takes:
                first, args = args[0], args[1:]
                slots = [first] if job.takes == "first" else first
                assert len(slots) == len(job.edges), (job, first)
                for (member, _, policy), value in zip(job.edges, slots, strict=True):
                    assert self.outcome_ok(member, policy, value, early), (job.id, member, value)
            assert args == job.args, (job.id, lease.payload)

        # -- producers ----------------------------------------------------------------------

        @precondition(lambda self: len(self.jobs) < MOST)
        @rule(options=signatures(3), length=st.integers(2, 3), policy=st.sampled_from(POLICIES))
        def enqueue_chain(self, options: list[dict[str, Any]], length: int,
                          policy: str | None) -> None:
            steps = [self.sig(o, f"s{i}") for i, o in enumerate(options[:length])]
            ref = chain(*steps, on_failure=policy).enqueue()
            ids = self.flow_ids(ref.id)
            for i, (job_id, o) in enumerate(zip(ids, options, strict=False)):
                edges = []
                if i:
                    before = options[i - 1]["on_failure"] or policy
                    edges = [(ids[i - 1], 0, CODE[before])]
                self.add(job_id, o, [f"s{i}"], ref.id, edges, "first" if i else "")
            self.flows.append(ref.id)

        @precondition(lambda self: len(self.jobs) < MOST)
        @rule(options=signatures(4), size=st.integers(1, 3), policy=st.sampled_from(POLICIES))
        def enqueue_chord(self, options: list[dict[str, Any]], size: int,
                          policy: str | None) -> None:
            header = [self.sig(o, f"h{i}") for i, o in enumerate(options[:size])]
            ref = chord(header, self.sig(options[3], "cb"), on_failure=policy).enqueue()
            ids = self.flow_ids(ref.id)
            for i in range(size):
                self.add(ids[i], options[i], [f"h{i}"], ref.id)
            edges = [(ids[i], i, CODE[options[i]["on_failure"] or policy]) for i in range(size)]
            self.add(ref.id, options[3], ["cb"], ref.id, edges, "list")
            self.flows.append(ref.id)

        @precondition(lambda self: len(self.jobs) < MOST)
        @rule(options=signatures(3), size=st.integers(1, 3))
        def enqueue_group(self, options: list[dict[str, Any]], size: int) -> None:
            ref = group([self.sig(o, f"g{i}") for i, o in enumerate(options[:size])]).enqueue()
            for i, member in enumerate(ref.refs):
                self.add(member.id, options[i], [f"g{i}"], ref.id)
            self.flows.append(ref.id)

        @precondition(lambda self: 0 < len(self.jobs) < MOST)
        @rule(options=signatures(1), picks=st.lists(st.integers(0, 1000), min_size=1, max_size=2,
                                                   unique=True))
        def enqueue_depends_on(self, options: list[dict[str, Any]], picks: list[int]) -> None:
            known = list(self.jobs)
            members = list(dict.fromkeys(known[p % len(known)] for p in picks))
            o = options[0]
            refs = [JobRef(m, self.jobs[m].queue) for m in members]  # (of either queue)
            handler = jobs.echo.using(**{"queue": NAME, **{k: v for k, v in o.items()
                                                           if v is not None}}, depends_on=refs)
            try:
                ref = handler.enqueue("d")
            except InvalidFlow:  # (a member's row gone: not in this model's time span)
                return
            self.add(ref.id, o, ["d"], None, [(m, i, CODE[o["on_failure"]])
                                             for i, m in enumerate(members)])

        # -- workers ------------------------------------------------------------------------

        @rule(count=st.integers(1, 3))
        def claim(self, count: int) -> None:
            self.claimed(count)

        def claimed(self, count: int) -> int:
            """Claim up to `count` jobs, checked; how many, and how many entries were relayed
            after (a claim may end jobs itself, expired ones, and release others)."""
            leases = [lease for queue in self.queues.values()
                      for lease in queue.dequeue(count=count, worker="w")]
            relayed = self.after_step()
            for lease in leases:
                self.check_claim(lease)
                self.leases.append(lease)
            return len(leases) + relayed

        @rule(outcomes=st.lists(st.sampled_from(["ack", "fail", "hold"]), min_size=1, max_size=3))
        def work(self, outcomes: list[str]) -> None:
            """A worker's turn: claim, then record each job's outcome, or hold it running."""
            held = len(self.leases)
            self.claimed(len(outcomes))
            for outcome in outcomes[: len(self.leases) - held]:
                if outcome != "hold":
                    self.record(held, ok=outcome == "ack")
                else:
                    held += 1

        def record(self, pick: int, ok: bool) -> None:
            if not self.leases:
                return
            lease = self.leases.pop(pick % len(self.leases))
            queue = self.queues[lease.queue]
            if ok:
                [answer] = queue.ack_encoded([(lease, f'"{lease.job_id}"')])
                assert answer, lease
                if answer.forwarded:
                    relay.relay_shard(queue, lease.shard)
            else:
                assert queue.nack(lease, "it broke", fatal=True) in ("dead", "cancelled")

        @rule(pick=st.integers(0, 1000))
        def ack(self, pick: int) -> None:
            self.record(pick, ok=True)

        @rule(pick=st.integers(0, 1000))
        def renew(self, pick: int) -> None:
            """A heartbeat renews a held run that started (a run with a time limit then gets
            its row's `deadline`: extend.lua), as a worker's does."""
            if self.leases:
                index = pick % len(self.leases)
                self.leases[index] = lease = self.leases[index].started()
                self.queues[lease.queue].leases.extend_many([lease], 30)

        @rule(pick=st.integers(0, 1000))
        def fail(self, pick: int) -> None:
            self.record(pick, ok=False)

        # -- time and maintenance -----------------------------------------------------------

        @rule(pick=st.integers(0, 1000))
        def expiry_passes(self, pick: int) -> None:
            job = self.pick(pick, {"pending", "waiting"})
            if job is not None and job.expires:
                client.hset(self.queues[job.queue].shard(job.shard or 0).job(job.id),
                            "expires_at", 1)

        @rule()
        def maintenance(self) -> None:
            for queue in self.queues.values():
                queue.promote()
            layouts.settle(client, NAME, SHARDS)

        # -- operators ----------------------------------------------------------------------

        @rule(pick=st.integers(0, 1000), live=st.booleans())
        def cancel(self, pick: int, live: bool) -> None:
            # (mostly a job it can cancel, or one a member's failure cancelled; else any job)
            if (job := self.pick(pick, {*LIVE, "cancelled"} if live else None)) is not None:
                try:
                    self.queues[job.queue].cancel(job.id)
                except InvalidTransition:
                    assert job.state not in LIVE, job

        @rule(pick=st.integers(0, 1000), failed=st.booleans())
        def retry(self, pick: int, failed: bool) -> None:
            if (job := self.pick(pick, FAILED if failed else None)) is not None:
                try:
                    self.queues[job.queue].retry(job.id)
                except InvalidTransition:
                    assert job.state not in FAILED, job
                    return
                job.generation += 1

        @rule(pick=st.integers(0, 1000), priority=st.sampled_from([-5, 0, 5]))
        def reprioritize(self, pick: int, priority: int) -> None:
            if (job := self.pick(pick)) is not None:
                try:
                    self.queues[job.queue].reprioritize(job.id, priority)
                except InvalidTransition:
                    assert job.state not in LIVE, job

        @rule(pick=st.integers(0, 1000))
        def cancel_flow(self, pick: int) -> None:
            if not self.flows:
                return
            flow = self.flows[pick % len(self.flows)]
            flows.cancel(flow, self.jobs[flow].queue if flow in self.jobs else NAME)
            for job in self.jobs.values():
                if job.flow == flow:
                    job.cancelled_with_flow = job.generation

        @rule(count=st.integers(1, 3))
        def resize(self, count: int) -> None:
            with contextlib.suppress(InvalidOption):  # (the last resize is still settling)
                self.queue.resize(count)

        # -- invariants ---------------------------------------------------------------------

        def teardown(self) -> None:
            """Every ready job run (and acked): what still waits waits for a failed member."""
            for _ in range(100):
                while self.leases:
                    self.ack(0)
                if not self.claimed(100):
                    break
            for job in self.jobs.values():
                assert job.state not in ("pending", "active"), (job, self.queue.layout(fresh=True))
                assert job.state != "waiting" or self.held_by_a_failure(job), (
                    job, {m: self.jobs[m].state for m in self.deps(job)})

        def held_by_a_failure(self, job: Job) -> bool:
            """Whether a waiting job waits for a member that failed, or for one that waits for
            such a member (only a retry of it brings it back)."""
            return any(self.jobs[m].state in FAILED
                       or (self.jobs[m].state == "waiting" and self.held_by_a_failure(self.jobs[m]))
                       for m in self.deps(job))

        def deps(self, job: Job) -> set[str]:
            return set(client.smembers(self.queues[job.queue].shard(job.shard or 0)
                                       .key(f"deps:{job.id}")))

        @invariant()
        def waiting_jobs_wait_for_something(self) -> None:
            self.after_step()
            waiting = [job for job in self.jobs.values() if job.state == "waiting"]
            for job in waiting:
                deps = self.deps(job)
                assert deps, f"{job.id} waits for nothing"
                assert not any(self.jobs[m].state == "succeeded" for m in deps), (job, deps)
            assert sum(q.counts()["waiting"] for q in self.queues.values()) == len(waiting)

    return FlowMachine


@pytest.fixture
def flow_queue(valkey_url: str, settings: Any) -> Any:
    """The client of the `valkey_url` fixture's server, with a queue of SHARDS shards."""
    settings.JOBQUEUE = {**settings.JOBQUEUE,
                         "QUEUES": {**settings.JOBQUEUE["QUEUES"], NAME: {"shards": SHARDS},
                                    OTHER: {}}}
    conf.reset()
    return conf.get_client()


@pytest.mark.slow
def test_flows_keep_their_promises_whatever_operators_do(flow_queue: Any) -> None:
    run_state_machine_as_test(machine_for(flow_queue), settings=settings(
        max_examples=60, stateful_step_count=50, deadline=None, derandomize=True,
        suppress_health_check=list(HealthCheck)))


def test_the_model_reads_the_queue_it_drives(flow_queue: Any) -> None:
    """(The machine's own parts, on one known flow: a chord whose callback ran once with its
    members' results, its flow cancelled after; nothing runs then.)"""
    machine = machine_for(flow_queue)()
    machine.enqueue_chord([{"on_failure": None, "lane": None, "expires": None, "queue": OTHER}]
                          * 3 + [{"on_failure": None, "lane": None, "expires": None}], 2, None)
    for _ in range(3):
        machine.claim(3)
        machine.ack(0)
        machine.ack(0)
        machine.after_step()
    callback = machine.jobs[machine.flows[0]]
    assert callback.state == "succeeded" and callback.claims == {0: 1}
    machine.cancel_flow(0)
    machine.teardown()
