"""Operator actions meeting flows, on the engine (claims, acks and nacks through `Queue`) on
standalone Valkey and a cluster: a waiting job cancelled then retried waits again for what is
not done; a job a member's failure cancelled comes back once a retry of that member succeeds,
whatever the other members did meanwhile, and never after the operator cancelled the flow;
a job that comes back does so where workers claim, and in its durable row."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from jobqueue import Queue, chain, chord, flows
from jobqueue.engine import layouts
from jobqueue.flows import relay
from jobqueue.history.mirror import Mirror
from jobqueue.models import Job
from tests.flows.test_flows import run_all
from tests.jobapp import jobs
from tests.workers import manage


def state(queue: Queue, job_id: str) -> str:
    return queue.get(job_id).state  # type: ignore[union-attr]


def test_a_chord_callback_cancelled_then_retried_waits_again_for_its_members(
        valkey_url: str) -> None:
    queue = Queue("default")
    ref = chord([jobs.add.s(1, 1), jobs.add.s(2, 2)], jobs.total.s()).enqueue()
    [first, second] = queue.dequeue(count=5)
    assert queue.cancel(ref.id) == "cancelled"
    assert queue.ack(first, first.payload["args"][0] * 2)  # a member ends meanwhile
    assert queue.retry(ref.id) == "waiting"
    assert flows.waits_for(queue.get(ref.id)) == [second.job_id]  # type: ignore[arg-type]
    assert queue.dequeue(count=5) == []
    assert queue.ack(second, second.payload["args"][0] * 2)
    run_all(queue)
    assert ref.result(timeout=5) == 6


def test_a_callback_cancelled_while_its_members_ended_runs_with_their_results_when_retried(
        valkey_url: str) -> None:
    queue = Queue("default")
    ref = chord([jobs.add.s(1, 1), jobs.add.s(2, 2)], jobs.total.s()).enqueue()
    assert queue.cancel(ref.id) == "cancelled"
    run_all(queue)  # the members run; the callback stays cancelled
    assert state(queue, ref.id) == "cancelled"
    assert queue.retry(ref.id) == "pending"
    [callback] = queue.dequeue(count=5)
    assert callback.payload["args"] == [[2, 4]]


def test_a_depends_on_job_cancelled_then_retried_waits_for_its_running_dependency(
        valkey_url: str) -> None:
    queue = Queue("default")
    a = jobs.add.enqueue(1, 2)
    d = jobs.add.using(depends_on=[a]).enqueue(5, 5)
    [running] = queue.dequeue(count=5)
    assert queue.cancel(d.id) == "cancelled" and queue.retry(d.id) == "waiting"
    assert queue.dequeue(count=5) == []  # not claimed while `a` still runs
    assert queue.ack(running, 3)
    run_all(queue)
    assert d.result(timeout=5) == 10


def test_a_continue_members_failure_while_its_callback_was_cancelled_runs_it_at_its_retry(
        valkey_url: str) -> None:
    # Under "continue" the first failure lets the callback run at once: one that came while the
    # callback was cancelled still does, once an operator retries the callback.
    queue = Queue("default")
    ref = chord([jobs.fails_with.using(on_failure="continue").s("a"), jobs.add.s(1, 1)],
                jobs.total.s()).enqueue()
    members = {lease.payload["args"][0]: lease for lease in queue.dequeue(count=5)}
    assert queue.cancel(ref.id) == "cancelled"
    assert queue.nack(members["a"], "a broke", fatal=True) == "dead"
    assert queue.retry(ref.id) == "pending"  # (not waiting for the other member)
    [callback] = queue.dequeue(count=5)
    [error, pending] = callback.payload["args"][0]
    assert error["state"] == "dead" and "a broke" in error["error"] and pending is None


def test_a_callback_a_member_cancelled_comes_back_when_its_retry_succeeds_after_another_failed(
        valkey_url: str) -> None:
    # flaky fails first (the callback is cancelled), then bad fails under "ignore": a retry of
    # flaky that succeeds must bring the callback back, with bad's error in its slot.
    queue = Queue("default")
    ref = chord([jobs.fails_with.s("flaky"), jobs.fails_with.using(on_failure="ignore").s("bad")],
                jobs.total.s()).enqueue()
    members = {lease.payload["args"][0]: lease for lease in queue.dequeue(count=5)}
    assert queue.nack(members["flaky"], "flaky", fatal=True) == "dead"
    assert state(queue, ref.id) == "cancelled"
    assert queue.nack(members["bad"], "bad", fatal=True) == "dead"
    assert queue.retry(members["flaky"].job_id) == "pending"
    [again] = queue.dequeue(count=5)
    assert queue.ack(again, 5)
    run_all(queue)
    five, error = ref.result(timeout=5)
    assert five == 5 and error["state"] == "dead" and "bad" in error["error"]


def test_a_retry_after_flows_cancel_brings_back_nothing_the_operator_cancelled(
        valkey_url: str) -> None:
    queue = Queue("default")
    ref = chain(jobs.fails_with.s("x"), jobs.mul.s(2), jobs.mul.s(3)).enqueue()
    [first] = queue.dequeue(count=5)
    assert queue.nack(first, "x", fatal=True) == "dead"  # the next steps end cancelled
    cancelled = flows.cancel(ref.id)  # (so they never come back)
    assert queue.retry(first.job_id) == "pending"
    [again] = queue.dequeue(count=5)
    assert queue.ack(again, 1)
    assert [info.state for info in flows.members(ref.id)] == ["succeeded", "cancelled", "cancelled"]
    assert queue.dequeue(count=5) == []
    assert cancelled == 2  # (counted: each cancel was made final)


def test_a_waiting_job_takes_a_new_priority_for_when_it_is_released(valkey_url: str) -> None:
    queue = Queue("default")
    ref = chain(jobs.add.s(1, 1), jobs.mul.s(2)).enqueue()
    assert queue.reprioritize(ref.id, 7) == "waiting"
    [first] = queue.dequeue(count=5)
    other = jobs.add.enqueue(0, 0)  # (ready before the step is)
    assert queue.ack(first, 2)
    [step, _] = queue.dequeue(count=2)
    assert step.job_id == ref.id and queue.get(ref.id).priority == 7  # type: ignore[union-attr]
    assert queue.get(other.id).state == "active"  # type: ignore[union-attr]


def test_a_dependent_that_comes_back_on_a_retired_shard_is_claimed_there(two: Queue) -> None:
    lane = {index: next(f"l{n}" for n in range(1000) if layouts.placement_hash(f"l{n}") % 2 == index)
            for index in (0, 1)}
    m = jobs.fails_with.using(queue="two", lane=lane[0]).enqueue("x")
    d = jobs.add.using(queue="two", lane=lane[1], depends_on=[m]).enqueue(1, 2)
    assert two.locate(d.id) == 1
    [lease] = two.dequeue(count=5)
    two.nack(lease, "x", fatal=True)
    relay.relay_shard(two, 0)
    assert state(two, d.id) == "cancelled"
    two.resize(1)
    assert layouts.settle(two.client, "two", 2) is not None  # shard 1 holds nothing live
    assert two.claim_shards() == 1
    two.retry(m.id)
    [again] = two.dequeue(count=5)
    assert two.ack_encoded([(again, "1")]) == [2] and relay.relay_shard(two, 0) == 1
    run_all(two)
    assert d.result(timeout=5) == 3


def test_a_job_made_to_wait_for_a_dead_job_on_another_shard_runs_once_its_retry_succeeds(
        two: Queue) -> None:
    # (Found by test_flow_machine.py: the link to a member that had ended already applied its
    # outcome without writing the edge on its row, so its retry's success reached no one.)
    lane = {index: next(f"l{n}" for n in range(1000) if layouts.placement_hash(f"l{n}") % 2 == index)
            for index in (0, 1)}
    m = jobs.fails_with.using(queue="two", lane=lane[0]).enqueue("x")
    [lease] = two.dequeue(count=5)
    assert two.nack(lease, "x", fatal=True) == "dead"
    d = jobs.add.using(queue="two", lane=lane[1], depends_on=[m]).enqueue(1, 2)
    assert state(two, d.id) == "cancelled"  # (its member had failed already)
    assert two.retry(m.id) == "pending"
    [again] = two.dequeue(count=5)
    assert two.ack_encoded([(again, "1")]) == [2] and relay.relay_shard(two, 0) == 1
    run_all(two)
    assert d.result(timeout=5) == 3


@pytest.mark.django_db(transaction=True)
def test_a_durable_dependent_that_comes_back_is_unfinished_in_its_row_and_restored(
        valkey_server: Any, settings: Any) -> None:
    settings.JOBQUEUE = {**settings.JOBQUEUE,
                         "QUEUES": {"default": {}, "durable": {"durable": True}}}
    queue = Queue("durable")
    ref = chain(jobs.fails_with.using(queue="durable").s("x"),
                jobs.mul.using(queue="durable").s(2)).enqueue()
    [first] = queue.dequeue(count=1)
    queue.nack(first, "x", fatal=True)
    Mirror([queue], "test").step()
    assert Job.objects.get(pk=ref.id).state == "cancelled"
    queue.retry(first.job_id)
    [again] = queue.dequeue(count=1)
    assert queue.ack(again, 3)
    assert state(queue, ref.id) == "pending"
    Mirror([queue], "test").step()
    assert Job.objects.get(pk=ref.id).state in ("waiting", "pending")
    redis.Redis.from_url(valkey_server.url).flushall()  # Valkey loses its data
    done = manage("jobqueue", "restore", url=valkey_server.url)
    assert done.returncode == 0, done.stderr
    assert state(queue, ref.id) == "pending"
    run_all(queue)
    assert ref.result(timeout=5) == 6
