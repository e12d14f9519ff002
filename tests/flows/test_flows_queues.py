"""Flows across queues: a flow's jobs on the queues their signatures name (`wide`, 3 shards, and
`default`, 1), each run where its queue's workers are, its members' outcomes carried to the
dependents on the other queue as across shards (relay.py); failure policies, an operator's
cancel and retry, the members listed from both queues, bad input. On the engine in this process,
on standalone Valkey and a cluster."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import transaction
from django.test import Client

from jobqueue import Queue, chain, chord, conf, flows, group
from jobqueue.console import actions
from jobqueue.engine import layouts
from jobqueue.exceptions import InvalidFlow, JobFailed
from jobqueue.flows import relay
from jobqueue.keys import placement_hash
from jobqueue.models import Job
from tests.flows.test_flows import run_all, server_ms
from tests.jobapp import jobs
from tests.workers import wait_for

A, B = "wide", "default"


def run_queues(*names: str) -> int:
    """Run every job of these queues that becomes ready, a queue at a time, and relay what is
    left in their streams (as a maintenance turn does: a claim that found a job expired), until
    nothing is left; how many ran."""
    ran = 0
    while True:
        done = sum(len(run_all(Queue(name))) for name in names)
        ran += done
        if not done and not sum(relay.relay_queue(Queue(name)) for name in names):
            return ran


def on(name: str, handler: Any) -> Any:
    return handler.using(queue=name)


def test_a_chord_with_members_on_one_queue_calls_back_on_the_other_once_in_order(valkey_url: str) -> None:
    ref = chord([on(A, jobs.mul).s(i, 1) for i in range(30)], jobs.echo.s()).enqueue()
    assert ref.queue == B and Queue(B).get(ref.id).state == "waiting"  # type: ignore[union-attr]
    assert Queue(A).counts()["pending"] == 30 and Queue(B).counts()["pending"] == 0
    assert run_queues(B) == 0  # (the callback's queue alone: nothing is ready there)
    assert run_queues(A) == 30
    assert Queue(B).counts()["pending"] == 1
    assert run_queues(B) == 1
    assert ref.result(timeout=5) == {"args": [list(range(30))], "kwargs": {}}


def test_a_chain_goes_from_queue_to_queue_and_back(valkey_url: str) -> None:
    ref = chain(on(A, jobs.add).s(2, 3), jobs.mul.s(4), on(A, jobs.mul).s(10)).enqueue()
    assert ref.queue == A
    assert run_queues(A) == 1 and Queue(B).counts()["pending"] == 1
    assert run_queues(A, B) == 2
    assert ref.result(timeout=5) == 200


def test_a_group_across_queues_lists_its_results_in_order(valkey_url: str) -> None:
    ref = group([jobs.add.s(1, 1), on(A, jobs.add).s(2, 2), jobs.add.s(3, 3)]).enqueue()
    assert [r.queue for r in ref.refs] == [B, A, B]
    run_queues(A, B)
    assert ref.result(timeout=5) == [2, 4, 6]
    nested = chain(
        on(A, jobs.add).s(1, 1), group([jobs.mul.s(2), on(A, jobs.mul).s(3)]), jobs.total.s()
    ).enqueue()
    run_queues(A, B)
    assert nested.result(timeout=5) == 10


def test_depends_on_a_job_of_another_queue(valkey_url: str) -> None:
    first = on(A, jobs.add).enqueue(1, 2)
    later = jobs.add.using(depends_on=[first]).enqueue(3, 4)
    assert Queue(B).get(later.id).state == "waiting"  # type: ignore[union-attr]
    assert run_queues(B) == 0
    run_queues(A, B)
    assert later.result(timeout=5) == 7
    gone = jobs.add.using(depends_on=[first.id]).enqueue  # (an id alone: of its own queue)
    with pytest.raises(InvalidFlow, match="no live job"):
        gone(1, 1)


@pytest.mark.parametrize(
    ("policy", "expected"), [("fail", "cancelled"), ("ignore", "ran"), ("continue", "ran")]
)
def test_a_members_failure_on_one_queue_rules_its_callback_on_the_other(
    valkey_url: str, policy: str, expected: str
) -> None:
    ref = chord(
        [on(A, jobs.fails_with).s("bad"), on(A, jobs.add).s(1, 1)], jobs.total.s(), on_failure=policy
    ).enqueue()
    run_queues(A, B)
    info = Queue(B).get(ref.id)
    assert info is not None
    if expected == "cancelled":
        assert info.state == "cancelled" and "ended dead" in info.last_error
        with pytest.raises(JobFailed):
            ref.result(timeout=5)
    else:
        [slot, two] = ref.result(timeout=5)
        assert slot["state"] == "dead" and "bad" in slot["error"]
        # ("continue" runs it at once: the other member's slot is empty unless it was done)
        assert two == 2 or (policy == "continue" and two is None)


def test_an_operator_cancels_a_flow_across_queues_and_retries_a_failed_member(valkey_url: str) -> None:
    ref = chord([on(A, jobs.add).s(i, i) for i in range(4)], jobs.total.s()).enqueue()
    found = flows.members(ref.id, B)
    assert [info.queue for info in found] == [A] * 4 + [B]
    assert flows.members(ref.id, A) == found  # (from either queue)
    assert flows.cancel(ref.id, B) == 5
    assert {info.state for info in flows.members(ref.id, A)} == {"cancelled"}
    assert run_queues(A, B) == 0
    # A member that died on A cancels the callback on B; its retry, once it succeeds,
    # brings the callback back, waiting, then run with every result.
    flaky = on(A, jobs.fails_once).using(max_attempts=1)
    ref = chord([flaky.s(), on(A, jobs.add).s(1, 1)], jobs.echo.s()).enqueue()
    run_queues(A, B)
    assert Queue(B).get(ref.id).state == "cancelled"  # type: ignore[union-attr]
    member = flows.members(ref.id, B)[0]
    assert member.queue == A and member.state == "dead"
    assert Queue(A).retry(member.id) == "pending"
    run_queues(A, B)
    [span, two] = ref.result(timeout=5)["args"][0]
    assert span.startswith("0x") and two == 2


def test_a_member_that_expires_on_one_queue_cancels_its_dependent_on_the_other(valkey_url: str) -> None:
    ref = chain(on(A, jobs.add).using(expires=0.05).s(1, 2), jobs.mul.s(2)).enqueue()
    first = flows.members(ref.id, B)[0]
    end = first.expires_at
    assert first.queue == A and end is not None
    wait_for(lambda: server_ms(Queue(A)) > end.timestamp() * 1000)
    run_queues(A, B)
    assert Queue(A).get(first.id).state == "expired"  # type: ignore[union-attr]
    with pytest.raises(JobFailed) as failed:
        ref.result(timeout=5)
    assert failed.value.state == "cancelled" and "expired" in failed.value.error


def test_either_queue_resized_while_a_flow_across_them_runs(valkey_url: str) -> None:
    """The members' queue shrunk while they wait on its retired shards; the callback's queue
    shrunk while the callback waits on a retired shard: it is released and claimed there, and
    the resize settles only once it has run."""
    wide = Queue(A)
    lane = next(f"l{n}" for n in range(1000) if placement_hash(f"l{n}") % 3 == 2)
    ref = chord([jobs.mul.s(i, 1) for i in range(5)], on(A, jobs.echo).using(lane=lane).s()).enqueue()
    assert wide.locate(ref.id) == 2
    # (members placed by their random ids: 30 miss one of 3 shards once in ~70,000 runs, 12 once
    # in ~40)
    spread = chord([on(A, jobs.mul).s(i, 1) for i in range(30)], jobs.total.s()).enqueue()
    assert len({info.shard for info in flows.members(spread.id, B)[:-1]}) == 3
    wide.resize(1)
    assert layouts.settle(wide.client, A, 3) is None  # (jobs wait on its retiring shards)
    run_queues(A, B)
    assert ref.result(timeout=5) == {"args": [list(range(5))], "kwargs": {}}
    assert spread.result(timeout=5) == sum(range(30))
    assert layouts.settle(wide.client, A, 3) is not None


@pytest.mark.django_db(transaction=True)  # (the flow is written at once, not at a commit)
def test_the_flow_page_lists_the_jobs_of_both_queues_with_their_queue(
    valkey_url: str, admin_client: Client
) -> None:
    ref = chord([on(A, jobs.add).s(i, 1) for i in range(3)], jobs.total.s()).enqueue()
    base = "/admin/jobqueue/job/live"
    for name in (A, B):
        whole = admin_client.get(f"{base}/flows/{name}/{ref.id}/").content.decode()
        before, graph = whole.split('<svg class="jq-flow"', 1)
        graph, after = graph.split("</svg>", 1)
        page = before + after
        # The graph draws the jobs of both queues, each box linking to its job on its queue.
        assert graph.count('class="jq-node"') == 4
        assert graph.count(f'href="{base}/jobs/{A}/JOB') == 3
        assert graph.count(f'href="{base}/jobs/{B}/{ref.id}/"') == 1
        assert "4 jobs" in page and "pending: <b>3</b>" in page and "waiting: <b>1</b>" in page
        # each member's row and the callback's "waits for" link to it; the callback's row and
        # its line above the table:
        assert page.count(f"{base}/jobs/{A}/JOB") == 6
        assert page.count(f"{base}/jobs/{B}/JOB") == page.count(f"{base}/jobs/{B}/{ref.id}/") == 2
        assert page.count(f"<td>{A}</td>") == 3 and page.count(f"<td>{B}</td>") == 1
    # The callback's own page links the members it waits for to their pages on their queue
    # (found on every queue a flow may span: the user's leave to see each is asked); the find
    # page leads there too.
    page = admin_client.get(f"{base}/jobs/{B}/{ref.id}/").content.decode()
    member = flows.members(ref.id, B)[0].id
    assert page.count(f"{base}/jobs/{A}/JOB") == 3 and f"{base}/jobs/{B}/JOB" not in page.replace(
        f"{base}/jobs/{B}/{ref.id}/", ""
    )
    found = admin_client.get(f"{base}/find/?id={member}")
    assert found.status_code == 302 and found["Location"].endswith(f"/jobs/{A}/{member}/")


def test_a_flow_naming_an_unknown_queue_is_refused_and_stores_nothing(valkey_url: str) -> None:
    with pytest.raises(InvalidFlow, match=r"unknown queue 'wdie'.*did you mean 'wide'"):
        chord([on("wdie", jobs.add).s(1, 1)], jobs.total.s()).enqueue()
    assert Queue(A).counts()["pending"] == Queue(B).counts()["waiting"] == 0
    assert Queue("wdie").counts()["pending"] == 0
    assert run_queues(A, B) == 0


@pytest.mark.django_db(transaction=True)
def test_a_flow_across_queues_with_a_durable_one_is_refused_and_stores_nothing(settings: Any) -> None:
    settings.JOBQUEUE = {**settings.JOBQUEUE, "QUEUES": {"default": {}, "durable": {"durable": True}}}
    conf.reset()
    with pytest.raises(InvalidFlow, match="durable queue 'durable'"):
        chain(on("durable", jobs.add).s(1, 1), jobs.mul.s(2)).enqueue()
    with pytest.raises(InvalidFlow, match="durable queue 'durable'"), transaction.atomic():
        chord([jobs.add.s(1, 1)], on("durable", jobs.total).s()).enqueue()
    assert not Job.objects.exists()
    assert Queue("durable").counts()["pending"] == Queue(B).counts()["pending"] == 0
    ref = chain(on("durable", jobs.add).s(1, 1), on("durable", jobs.mul).s(2)).enqueue()
    assert ref.queue == "durable"  # (one durable queue: as before)


def test_an_operators_cancel_of_a_member_reaches_its_dependent_while_the_members_queue_has_no_worker(
    valkey_url: str,
) -> None:
    """The callback's queue has workers, the members' queue none (the reason an operator cancels
    its jobs): the cancel's "member done" is relayed at once, as `flows.cancel` relays, not left
    for a maintenance turn of the members' queue's workers that do not run."""
    ref = chord([on(A, jobs.add).s(i, i) for i in range(3)], jobs.total.s()).enqueue()
    member = flows.members(ref.id, B)[0]
    assert member.queue == A and actions.cancel_job(Queue(A), member.id).startswith("Cancelled")
    assert run_queues(B) == 0
    assert Queue(B).get(ref.id).state == "cancelled"  # type: ignore[union-attr]
