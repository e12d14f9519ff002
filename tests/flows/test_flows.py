"""Flows: chain, group, chord and depends_on, on the engine (claim, ack, nack through `Queue`,
handlers run in this process) on standalone Valkey and a cluster; failure policies, retries,
cancels, bad input; exactly once under a replayed ack and a lost lease."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobqueue import JobRef, Queue, chain, chord, flows, group
from jobqueue.api.composition import GroupRef
from jobqueue.api.handler import write_progress
from jobqueue.api.registry import JobFunction, JobOptions
from jobqueue.exceptions import InvalidFlow, InvalidJobId, JobFailed, UnknownHandler
from jobqueue.flows import graph, relay
from jobqueue.records import Lease
from jobqueue.spec import JobSpec
from jobqueue.worker.executor import execute
from tests.jobapp import jobs
from tests.workers import wait_for


def run_all(queue: Queue, *, shuffle: Any = None, relays: str = "now") -> list[Lease]:
    """Claim and run every job that becomes ready, one at a time, recording each outcome as a
    worker would; the leases in the order they ran. What an outcome forwarded to another shard
    is relayed at once ("now", as the worker that recorded it does), only once nothing is
    ready ("idle", as a maintenance turn would), or not ("never")."""
    ran: list[Lease] = []
    while True:
        leases = queue.dequeue(count=100)
        if not leases and relays == "idle" and relay.relay_queue(queue):
            continue
        if not leases:
            return ran
        if shuffle is not None:
            shuffle(leases)
        for lease in leases:
            ran.append(lease)
            outcome = execute(lease)
            if outcome.ok:
                forwarded = queue.ack_encoded([(lease, outcome.result)]) == [2]
            else:
                forwarded = queue.nack(lease, outcome.error, outcome.retry_in,
                                       fatal=outcome.fatal) in ("dead", "cancelled")
            if forwarded and relays == "now":
                relay.relay_shard(queue, lease.shard)


def test_a_chain_passes_each_result_to_the_next_step(valkey_url: str) -> None:
    queue = Queue("default")
    ref = chain(jobs.add.s(2, 3), jobs.mul.s(4), jobs.mul.s(10)).enqueue()
    assert queue.counts()["waiting"] == 2 and queue.counts()["pending"] == 1
    assert queue.get(ref.id).state == "waiting"  # type: ignore[union-attr]
    run_all(queue)
    assert ref.result(timeout=5) == 200
    assert queue.counts()["waiting"] == 0


def test_the_previous_result_goes_into_the_top_level_args_only(valkey_url: str) -> None:
    """A step's kwargs may hold a key named "args" at any depth: the previous result is
    spliced into the payload's own args, which a step of kwargs only does not have."""
    queue = Queue("default")
    nested = {"args": [1, 2], "deeper": [{"args": []}], "text": '"args":['}
    only_kwargs = chain(jobs.add.s(40, 2), jobs.echo.s(config=nested)).enqueue()
    both = chain(jobs.add.s(1, 1), jobs.echo.s("own", config=nested)).enqueue()
    callback = chord([jobs.add.s(1, 2)], jobs.echo.s(config=nested)).enqueue()
    run_all(queue)
    assert only_kwargs.result(timeout=5) == {"args": [42], "kwargs": {"config": nested}}
    assert both.result(timeout=5) == {"args": [2, "own"], "kwargs": {"config": nested}}
    assert callback.result(timeout=5) == {"args": [[3]], "kwargs": {"config": nested}}
    # Keys in another order (a payload read back from a PostgreSQL jsonb column sorts them),
    # and escapes in strings before the args:
    first = jobs.add.enqueue(2, 3)
    payload = {"kwargs": {"config": nested}, "args": ['\\"args":[', "x"],
               "handler": jobs.echo.name}
    node = graph.Node(JobSpec(payload), ((first.id, 0, "f"),), "first", 1)
    [late] = graph.enqueue(queue, [node], graph.checked(queue, [node]))
    run_all(queue)
    assert late.result(timeout=5) == {"args": [5, '\\"args":[', "x"],
                                      "kwargs": {"config": nested}}


def server_ms(queue: Queue) -> int:
    seconds, micros = queue.client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def test_flow_jobs_expire_as_any_job_does(valkey_url: str) -> None:
    """`expires` on a flow's job (a group's member, a step, a `depends_on` job) holds as on any
    job: not started by then, it ends `expired`, and what waits for it follows its policy."""
    queue = Queue("default")
    a = jobs.add.enqueue(1, 1)
    grouped = group([jobs.add.using(expires=0.05).s(1, 2), jobs.add.s(2, 2)]).enqueue()
    chained = chain(jobs.add.using(expires=0.05).s(1, 2), jobs.mul.s(2)).enqueue()
    d = jobs.add.using(depends_on=[a], expires=0.05).enqueue(5, 5)
    late = [grouped.refs[0].id, flows.members(chained.id)[0].id, d.id]
    ends = [queue.get(job_id).expires_at for job_id in late]  # type: ignore[union-attr]
    assert None not in ends
    wait_for(lambda: server_ms(queue) > max(end.timestamp() * 1000 for end in ends))  # type: ignore[union-attr]
    run_all(queue)
    assert [queue.get(job_id).state for job_id in late] == ["expired"] * 3  # type: ignore[union-attr]
    assert grouped.refs[1].result(timeout=5) == 4 and a.result(timeout=5) == 2
    with pytest.raises(JobFailed) as failed:
        chained.result(timeout=5)
    assert failed.value.state == "cancelled" and "expired" in failed.value.error


def test_a_group_answers_its_results_in_order(valkey_url: str) -> None:
    queue = Queue("wide")
    ref = group([jobs.add.using(queue="wide").s(i, 1) for i in range(20)]).enqueue()
    assert len({queue.locate(r.id) for r in ref.refs}) == 3  # spread over the queue's shards
    run_all(queue, shuffle=lambda leases: leases.reverse())
    assert ref.result(timeout=5) == list(range(1, 21))
    assert [info.id for info in flows.members(ref.id, "wide")] == [r.id for r in ref.refs]


def test_a_chord_calls_back_once_with_every_result_in_order(valkey_url: str) -> None:
    queue = Queue("default")
    ref = chord([jobs.square_slowly.s(i, 0) for i in range(50)], jobs.total.s()).enqueue()
    ran = run_all(queue, shuffle=lambda leases: leases.reverse())
    assert [lease.job_id for lease in ran].count(ref.id) == 1 and ran[-1].job_id == ref.id
    assert ref.result(timeout=5) == sum(i * i for i in range(50))
    assert ran[-1].payload["args"][0] == [i * i for i in range(50)]


def test_depends_on_waits_for_refs_or_ids(valkey_url: str) -> None:
    queue = Queue("default")
    a, b = jobs.add.enqueue(1, 2), jobs.add.enqueue(3, 4)
    d = jobs.add.using(depends_on=[a, b.id]).enqueue(5, 5)
    assert queue.get(d.id).state == "waiting"  # type: ignore[union-attr]
    assert flows.waits_for(queue.get(d.id)) == sorted([a.id, b.id])  # type: ignore[arg-type]
    [first, second] = queue.dequeue(count=2)
    queue.ack(first, 3)
    assert queue.get(d.id).state == "waiting"  # type: ignore[union-attr]
    queue.ack(second, 7)
    assert queue.get(d.id).state == "pending"  # type: ignore[union-attr]
    run_all(queue)
    assert d.result(timeout=5) == 10
    late = jobs.add.using(depends_on=[a]).enqueue(1, 1)  # a finished already: released at once
    assert queue.get(late.id).state == "pending"  # type: ignore[union-attr]
    c = jobs.add.enqueue(1, 1)
    many = jobs.add.using(depends_on=[c]).enqueue_many([(1, 2), (3, 4)])
    assert {queue.get(ref.id).state for ref in many} == {"waiting"}  # type: ignore[union-attr]
    run_all(queue)
    assert [ref.result(timeout=5) for ref in many] == [3, 7]


def test_a_failed_member_cancels_the_rest_of_the_flow_naming_it(valkey_url: str) -> None:
    queue = Queue("default")
    ref = chain(jobs.fails_with.s("boom"), jobs.mul.s(2), jobs.mul.s(3)).enqueue()
    [first] = queue.dequeue(count=1)
    queue.nack(first, "boom", fatal=True)
    with pytest.raises(JobFailed) as failed:
        ref.result(timeout=5)
    assert failed.value.state == "cancelled"
    [step1, step2, step3] = flows.members(ref.id)
    assert step1.state == "dead" and step2.state == step3.state == "cancelled"
    assert first.job_id in step2.last_error and step2.id in step3.last_error
    assert queue.dequeue(count=5) == []


def test_ignore_and_continue_let_the_dependent_run(valkey_url: str) -> None:
    queue = Queue("default")
    ignored = chord([jobs.add.s(1, 1), jobs.fails_with.s("boom").using(on_failure="ignore")],
                    jobs.total.s()).enqueue()
    run_all(queue)
    two, error = ignored.result(timeout=5)
    assert two == 2 and error["state"] == "dead" and "boom" in error["error"]
    slow = jobs.add.enqueue(1, 1)
    broken = jobs.fails_with.enqueue("x")
    at_once = jobs.total.using(depends_on=[slow, broken], on_failure="continue").enqueue()
    [lease] = [lease for lease in queue.dequeue(count=2) if lease.job_id == broken.id] or [None]
    assert lease is not None
    queue.nack(lease, "x", fatal=True)
    assert queue.get(at_once.id).state == "pending"  # type: ignore[union-attr]  # not waiting for slow
    with pytest.raises(InvalidFlow, match="on_failure"):
        jobs.add.using(on_failure="retry")


def test_an_operator_retry_of_a_dead_member_lets_the_flow_go_on(valkey_url: str) -> None:
    queue = Queue("default")
    ref = chain(jobs.fails_with.s("once"), jobs.total.s(), jobs.mul.s(10)).enqueue()
    [first] = queue.dequeue(count=1)
    queue.nack(first, "broken", fatal=True)
    assert [info.state for info in flows.members(ref.id)] == ["dead", "cancelled", "cancelled"]
    assert queue.retry(first.job_id) == "pending"
    [again] = queue.dequeue(count=1)
    queue.ack(again, [1, 2])  # this time it worked
    run_all(queue)
    assert ref.result(timeout=5) == 30
    assert [info.state for info in flows.members(ref.id)] == ["succeeded"] * 3


def test_cancelling_a_flow_cancels_what_has_not_started(valkey_url: str) -> None:
    queue = Queue("default")
    ref = chord([jobs.add.s(i, i) for i in range(5)], jobs.total.s()).enqueue()
    [running] = queue.dequeue(count=1)
    assert flows.cancel(ref.id) == 6
    states = {info.id: info for info in flows.members(ref.id)}
    assert states[running.job_id].state == "active" and states[running.job_id].cancel_requested
    assert all(info.state == "cancelled" for i, info in states.items() if i != running.job_id)
    assert queue.ack(running, 0)
    assert queue.get(running.job_id).state == "cancelled"  # type: ignore[union-attr]
    assert queue.counts()["waiting"] == 0 and queue.dequeue(count=5) == []


def test_a_replayed_ack_releases_nothing_twice(valkey_url: str) -> None:
    queue = Queue("default")
    ref = chord([jobs.add.s(1, 1), jobs.add.s(2, 2)], jobs.total.s()).enqueue()
    [a, b] = queue.dequeue(count=2)
    assert queue.ack(a, 2) and queue.ack(b, 4)
    assert queue.ack(b, 4) and queue.ack_many([(a, 2), (b, 4)]) == [True, True]  # lost replies
    [callback] = queue.dequeue(count=5)
    assert callback.job_id == ref.id and callback.payload["args"] == [[2, 4]]
    assert queue.ack(callback, 6) and queue.dequeue(count=5) == []


def test_a_lost_lease_and_its_late_ack_release_nothing_twice(valkey_url: str) -> None:
    queue = Queue("default")
    ref = chain(jobs.add.s(1, 1), jobs.total.s()).enqueue()
    [old] = queue.dequeue(count=1, lease=0.05)
    wait_for(lambda: queue.reap() == 1)
    [new] = queue.dequeue(count=1)
    assert queue.ack(new, [2]) and not queue.ack(old, [2])
    [step] = queue.dequeue(count=5)
    assert step.job_id == ref.id and queue.dequeue(count=5) == []


def test_bad_flows_are_refused_with_one_clear_error(valkey_url: str) -> None:
    queue = Queue("default")
    with pytest.raises(InvalidFlow, match="at least one"):
        group([]).enqueue()
    with pytest.raises(InvalidFlow, match="no live job"):
        jobs.add.using(depends_on=["JOB0000000000a"]).enqueue(1, 2)
    with pytest.raises(InvalidJobId):
        jobs.add.using(depends_on=["not-an-id"])
    own = "JOB0SWpB9z1fMX"
    with pytest.raises(InvalidFlow, match="cycle"):
        jobs.add.using(job_id=own, depends_on=[own]).enqueue(1, 2)
    stranger = JobFunction(lambda x: x, "tests.nowhere", JobOptions())
    with pytest.raises(UnknownHandler):
        chain(jobs.add.s(1, 2), stranger.s()).enqueue()
    with pytest.raises(InvalidFlow, match="cannot take the previous result"):
        chain(jobs.add.s(1, 2), jobs.add.s(1, 2)).enqueue()
    with pytest.raises(InvalidFlow, match="unknown queue 'wdie'"):  # (across queues: known ones)
        chain(jobs.add.s(1, 2), jobs.mul.using(queue="wdie").s(2)).enqueue()
    with pytest.raises(InvalidFlow, match="signatures"):
        chord([jobs.add], jobs.total.s())  # type: ignore[list-item]
    assert queue.counts()["pending"] == 0 and queue.counts()["waiting"] == 0  # nothing written


def states(ref_id: str, queue: str = "default") -> list[str]:
    return [info.state for info in flows.members(ref_id, queue)]


def test_a_group_inside_a_chain_gives_each_member_the_result_and_the_next_step_the_list(
        valkey_url: str) -> None:
    queue = Queue("default")
    ref = chain(jobs.add.s(1, 2), group([jobs.mul.s(2), jobs.mul.s(10)]), jobs.total.s()).enqueue()
    assert isinstance(ref, JobRef)
    ran = run_all(queue)
    assert ref.result(timeout=5) == 36
    assert [lease.payload["args"][0] for lease in ran[1:]] == [3, 3, [6, 30]]
    assert [lease.job_id for lease in ran] == [info.id for info in flows.members(ref.id)]
    ending = chain(jobs.add.s(1, 2), group([jobs.mul.s(2), jobs.mul.s(3)])).enqueue()
    assert isinstance(ending, GroupRef)  # a chain that ends in a group: its list
    run_all(queue)
    assert ending.result(timeout=5) == [6, 9] and len(flows.members(ending.id)) == 3
    alone = chain(jobs.add.s(1, 2), group([jobs.mul.s(2)]), jobs.total.s()).enqueue()
    ran = run_all(queue)
    assert alone.result(timeout=5) == 6 and ran[-1].payload["args"][0] == [6]  # a group of one: a list


def test_a_group_of_chains_answers_each_chains_last_result_in_order(valkey_url: str) -> None:
    queue = Queue("wide")
    add, mul = jobs.add.using(queue="wide"), jobs.mul.using(queue="wide")
    ref = group([chain(add.s(1, 1), mul.s(3)), chain(add.s(2, 2), mul.s(5)),
                 group([add.s(0, 7), add.s(0, 8)])]).enqueue()  # a nested group is spliced in
    assert len(ref.refs) == 4
    run_all(queue, shuffle=lambda leases: leases.reverse())
    assert ref.result(timeout=5) == [6, 20, 7, 8]
    order = [info.id for info in flows.members(ref.id, "wide")]
    assert [order[1], order[3], order[4], order[5]] == [r.id for r in ref.refs]
    assert states(ref.id, "wide") == ["succeeded"] * 6


def test_chains_inside_a_chord_header_hand_their_last_result_to_the_callback(
        valkey_url: str) -> None:
    queue = Queue("default")
    ref = chord([chain(jobs.add.s(1, 1), jobs.mul.s(10)), jobs.add.s(3, 4),
                 chord([jobs.add.s(1, 0), jobs.add.s(2, 0)], jobs.total.s())], jobs.total.s()).enqueue()
    ran = run_all(queue, shuffle=lambda leases: leases.reverse())
    assert ref.result(timeout=5) == 20 + 7 + 3 and ran[-1].job_id == ref.id
    assert ran[-1].payload["args"][0] == [20, 7, 3]
    assert [lease.job_id for lease in ran].count(ref.id) == 1 and len(flows.members(ref.id)) == 7


def test_a_chord_inside_a_chain_and_a_chain_inside_a_chain(valkey_url: str) -> None:
    queue = Queue("default")
    ref = chain(jobs.add.s(1, 1), chord([jobs.mul.s(2), jobs.mul.s(3)], jobs.total.s()),
                jobs.mul.s(10)).enqueue()
    run_all(queue)
    assert ref.result(timeout=5) == (2 * 2 + 2 * 3) * 10
    flat = chain(jobs.add.s(1, 1), chain(jobs.mul.s(2), chain(jobs.mul.s(3))), jobs.mul.s(10)).enqueue()
    assert len(flows.members(flat.id)) == 4 and states(flat.id).count("waiting") == 3
    run_all(queue)
    assert flat.result(timeout=5) == 120
    gone = group([chain(jobs.add.s(1, 1), jobs.mul.s(2)), jobs.add.s(2, 2)]).enqueue()
    assert flows.cancel(gone.id) == 3 and states(gone.id) == ["cancelled"] * 3


def test_a_failure_inside_a_nested_member_under_each_policy(valkey_url: str) -> None:
    """The chain inside the header stops at its failed step (its own default); the chord's
    policy says what the chain's failure does to the callback."""
    queue = Queue("default")

    def flow(on_failure: str | None) -> Any:
        return chord([chain(jobs.fails_with.s("boom"), jobs.mul.s(2)), jobs.add.s(1, 1)],
                     jobs.total.s(), on_failure=on_failure).enqueue()

    failed = flow(None)
    run_all(queue)
    with pytest.raises(JobFailed):
        failed.result(timeout=5)
    [boom, step, two, callback] = flows.members(failed.id)
    assert [boom.state, step.state, two.state, callback.state] == [
        "dead", "cancelled", "succeeded", "cancelled"]
    assert boom.id in step.last_error and step.id in callback.last_error
    ignored = flow("ignore")
    run_all(queue)
    error, two_again = ignored.result(timeout=5)
    assert two_again == 2 and error["state"] == "cancelled"
    assert error["job"] == flows.members(ignored.id)[1].id  # the chain's step it cancelled
    assert states(ignored.id) == ["dead", "cancelled", "succeeded", "succeeded"]
    continued = flow("continue")
    leases = queue.dequeue(count=5)
    [boom_lease] = [lease for lease in leases if lease.payload["handler"].endswith("fails_with")]
    queue.nack(boom_lease, "boom", fatal=True)
    assert queue.get(continued.id).state == "pending"  # type: ignore[union-attr]  # not waiting for add
    for lease in leases:
        if lease is not boom_lease:
            queue.ack(lease, 2)
    run_all(queue)
    error, pending = continued.result(timeout=5)
    assert error["state"] == "cancelled" and pending is None


def test_a_policy_set_on_an_inner_composite_rules_its_own_failures(valkey_url: str) -> None:
    queue = Queue("default")
    # the inner chain's "ignore": its next step runs with the error object; the chord then runs
    ref = chord([chain(jobs.fails_with.s("inner"), jobs.total.s(), on_failure="ignore"),
                 jobs.add.s(1, 1)], jobs.total.s()).enqueue()
    run_all(queue)
    [error, two] = ref.result(timeout=5)
    assert two == 2 and error["state"] == "dead" and "inner" in error["error"]
    # a member's own policy comes first, however deep: the chord's "fail" does not stop it
    own = chord([chain(jobs.add.s(1, 1), jobs.fails_with.s().using(on_failure="ignore")),
                 jobs.add.s(1, 1)], jobs.total.s(), on_failure="fail").enqueue()
    run_all(queue)
    [error, two] = own.result(timeout=5)
    assert two == 2 and error["state"] == "dead" and error["job"] == flows.members(own.id)[1].id
    # a group's "ignore" inside a chain: the step after it gets the failed member's error object
    after = chain(jobs.add.s(1, 2), group([jobs.fails_with.s(), jobs.mul.s(2)], on_failure="ignore"),
                  jobs.total.s()).enqueue()
    run_all(queue)
    [error, six] = after.result(timeout=5)
    assert six == 6 and error["state"] == "dead" and "3" in error["error"]
    # the same group under the chain's default: the step after it is cancelled, the sibling ran
    stopped = chain(jobs.add.s(1, 2), group([jobs.fails_with.s(), jobs.mul.s(2)]), jobs.total.s()).enqueue()
    run_all(queue)
    assert states(stopped.id) == ["succeeded", "dead", "succeeded", "cancelled"]
    # a failure before a group cancels every member and what comes after, down the flow
    early = chain(jobs.fails_with.s("first"), group([jobs.mul.s(2), jobs.mul.s(3)]), jobs.total.s(),
                  jobs.mul.s(2)).enqueue()
    run_all(queue)
    assert states(early.id) == ["dead", "cancelled", "cancelled", "cancelled", "cancelled"]
    # a group of chains: one chain's failure stops that chain only
    both = group([chain(jobs.fails_with.s("left"), jobs.mul.s(2)),
                  chain(jobs.add.s(1, 1), jobs.mul.s(3))]).enqueue()
    run_all(queue)
    with pytest.raises(JobFailed):
        both.result(timeout=5)
    assert both.refs[1].result(timeout=5) == 6 and queue.counts()["waiting"] == 0


def test_a_dependency_of_a_step_does_not_take_the_previous_results_place(valkey_url: str) -> None:
    queue = Queue("default")
    other = jobs.add.enqueue(100, 0)
    ref = chain(jobs.add.s(1, 1), jobs.mul.using(depends_on=[other]).s(10)).enqueue()
    callback = chord([jobs.add.s(1, 1), jobs.add.s(2, 2)],
                     jobs.total.using(depends_on=[other]).s()).enqueue()
    assert queue.get(ref.id).state == "waiting"  # type: ignore[union-attr]
    run_all(queue)
    assert ref.result(timeout=5) == 20 and callback.result(timeout=5) == 6


def test_bad_nested_flows_are_refused_with_one_clear_error(valkey_url: str) -> None:
    queue = Queue("default")
    with pytest.raises(InvalidFlow, match="at least one"):
        chain(jobs.add.s(1, 2), group([]), jobs.total.s())
    with pytest.raises(InvalidFlow, match="signatures"):
        chain(jobs.add.s(1, 2), [jobs.mul.s(2)])  # type: ignore[arg-type]
    with pytest.raises(InvalidFlow, match="signatures"):
        chord([chain(jobs.add.s(1, 2))], "tests.jobapp.jobs.total")  # type: ignore[arg-type]
    with pytest.raises(InvalidFlow, match="on_failure"):
        group([jobs.add.s(1, 2)], on_failure="skip")
    with pytest.raises(InvalidFlow, match="a list of signatures"):
        group(jobs.add.s(1, 2))  # type: ignore[arg-type]
    with pytest.raises(InvalidFlow, match="cannot take the previous result"):
        chain(jobs.add.s(1, 2), group([jobs.mul.s(2), jobs.add.s(1, 2)])).enqueue()
    with pytest.raises(InvalidFlow, match="unknown queue 'wdie'"):
        group([chain(jobs.add.s(1, 2), jobs.mul.using(queue="wdie").s(2))]).enqueue()
    twice = jobs.add.using(job_id="JOB0SWpB9z1fMX").s(1, 1)
    with pytest.raises(InvalidFlow, match="twice"):
        group([twice, chain(twice, jobs.mul.s(2))]).enqueue()
    assert queue.counts()["pending"] == 0 and queue.counts()["waiting"] == 0  # nothing written


@st.composite
def dags(draw: Any) -> list[tuple[list[int], bool, str, str]]:
    """Random DAGs: per job, the earlier jobs it depends on, whether it fails, its policy, its
    lane ('' none: placed by its id or with its dependencies; so a DAG spans shards)."""
    n = draw(st.integers(2, 9))
    return [(sorted(draw(st.sets(st.integers(0, i - 1), max_size=3))) if i else [],
             draw(st.booleans()), draw(st.sampled_from(["fail", "ignore", "continue"])),
             draw(st.sampled_from(["", "a", "b", "c", "d", "e"])))
            for i in range(n)]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(graph=dags(), seed=st.integers(0, 2**32 - 1),
       relays=st.sampled_from(["now", "idle"]))
def test_random_dags_run_as_their_policies_say(valkey_server: Any, settings: Any, graph: Any,
                                               seed: int, relays: str) -> None:
    """Against a model: a job runs iff its policy says so (fail: every dependency succeeded;
    ignore, continue: always, once they end, or at the first failure for continue), at most
    once, and never before its dependencies (continue: before the others, once one failed).
    The queue has 4 shards and jobs random lanes: the DAGs span shards, their "member done"
    relayed by the finisher or only later, as by a maintenance turn (relay.py). The claims'
    order comes from a seed, not from draws of Hypothesis' own (how many claims there are
    depends on Valkey: Hypothesis would see its data drawn differently on a replay)."""
    order = random.Random(seed)
    import redis as redis_py

    from jobqueue import conf

    redis_py.Redis.from_url(valkey_server.url).flushall()
    settings.JOBQUEUE = {**settings.JOBQUEUE,
                         "QUEUES": {**settings.JOBQUEUE["QUEUES"], "spread": {"shards": 4}}}
    conf.reset()
    queue = Queue("spread")
    refs: list[str] = []
    for deps, fails, policy, lane in graph:
        handler = (jobs.fails_with if fails else jobs.noop).using(queue="spread", lane=lane or None)
        args = ("planned",) if fails else ()
        if deps:
            handler = handler.using(depends_on=[refs[d] for d in deps], on_failure=policy)
        refs.append(handler.enqueue(*args).id)
    index = {job_id: i for i, job_id in enumerate(refs)}
    ended: dict[int, str] = {}  # job -> its end, in the order jobs ran or were released
    runs: list[int] = []

    def shuffle(leases: list[Lease]) -> None:
        order.shuffle(leases)

    for lease in run_all(queue, shuffle=shuffle, relays=relays):
        i = index[lease.job_id]
        deps, _, policy, _ = graph[i]
        before = [ended.get(d) for d in deps]
        if policy == "continue" and "failed" in before:
            pass  # released at the first failure
        else:
            assert all(before), f"job {i} ran before its dependencies {deps}: {before}"
        runs.append(i)
        state = queue.get(lease.job_id).state  # type: ignore[union-attr]
        ended[i] = "ok" if state == "succeeded" else "failed"
        for j, job_id in enumerate(refs):  # jobs cancelled by this one's end
            info = queue.get(job_id)
            if j not in ended and info is not None and info.state == "cancelled":
                ended[j] = "failed"
    succeeded: dict[int, bool] = {}
    for i, (deps, fails, policy, _) in enumerate(graph):
        runs_now = policy != "fail" or all(succeeded[d] for d in deps)
        succeeded[i] = runs_now and not fails
        assert runs.count(i) == (1 if runs_now else 0), (i, graph, runs)
        expected = "succeeded" if succeeded[i] else ("dead" if runs_now else "cancelled")
        assert queue.get(refs[i]).state == expected, (i, graph)  # type: ignore[union-attr]
    assert queue.counts()["waiting"] == 0


@pytest.mark.django_db(transaction=True)
def test_the_console_shows_a_flow_and_links_it_from_each_job(client: Any) -> None:
    from django.contrib.auth.models import User

    User.objects.create_superuser("root", "root@example.com", "pw")
    client.login(username="root", password="pw")
    queue = Queue("default")
    ref = chord([jobs.add.s(1, 1), jobs.add.s(2, 2)], jobs.total.s()).enqueue()
    [lease, running] = queue.dequeue(count=2)
    assert queue.ack(lease, 2)
    assert write_progress([(running, '{"pct":50}')]) == [True]
    base = "/admin/jobqueue/job/live"
    page = client.get(f"{base}/flows/default/{ref.id}/").content.decode()
    assert "succeeded: <b>1</b>" in page and "active: <b>1</b>" in page and "waiting: <b>1</b>" in page
    assert f'id="flow-callback">{ref.id}' in page and "tests.jobapp.jobs.total" in page
    member = client.get(f"{base}/jobs/default/{lease.job_id}/").content.decode()
    assert f"/flows/default/{ref.id}/" in member
    callback = client.get(f"{base}/jobs/default/{ref.id}/").content.decode()
    assert "waits for" in callback and lease.job_id not in callback.split("waits for")[1][:200]
    shown = client.get(f"{base}/jobs/default/{running.job_id}/").content.decode()
    assert 'id="job-progress"' in shown and "pct" in shown
    assert "pct" in client.get(f"{base}/queues/default/?state=active").content.decode()
    assert client.get(f"{base}/flows/default/JOB0000000000a/").status_code == 404
    nested = group([chain(jobs.add.s(1, 1), jobs.mul.s(2)), jobs.add.s(3, 3)]).enqueue()
    page = client.get(f"{base}/flows/default/{nested.id}/").content.decode()
    assert all(info.id in page for info in flows.members(nested.id)) and "waiting: <b>1</b>" in page
    assert client.get(f"{base}/flows/default/nope/").status_code == 404
