"""Run timeouts in the scripts: the claim caps a lease at the timeout and a second, the first
renewal of a started run writes its deadline (the limit counts from the run's start, not the
claim), renewals stop a second past it, and the reaper ends a run past it with a JobTimeout
(Valkey and Valkey Cluster). The worker's side is tests/worker/test_worker_timeouts.py."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from jobqueue import Queue, conf
from jobqueue.engine import handoff
from jobqueue.exceptions import ConfigurationError, InvalidOption
from jobqueue.spec import JobSpec
from tests.servers import server_ms, wait_past
from tests.workers import wait_for


@pytest.mark.parametrize("bad", [0, -1, 86_400.5, "5", True, float("nan"), [1]])
def test_a_timeout_outside_a_millisecond_to_a_day_or_not_a_number_is_refused(
        queue: Queue, bad: object) -> None:
    with pytest.raises(InvalidOption, match="timeout"):
        queue.enqueue("p", timeout=bad)
    with pytest.raises(InvalidOption, match="timeout"):
        queue.enqueue_many([JobSpec("p", timeout=bad)])  # type: ignore[arg-type]
    assert queue.counts()["pending"] == 0


def test_a_bad_queue_timeout_is_one_settings_error_naming_it(settings: Any) -> None:
    settings.JOBQUEUE = {**settings.JOBQUEUE, "QUEUES": {"slow": {"timeout": 0}}}
    conf.reset()
    with pytest.raises(ConfigurationError, match=r"'slow'.*timeout must be within"):
        conf.get_config()


def test_a_job_without_a_timeout_claims_as_before(queue: Queue, valkey: Any) -> None:
    ref = queue.enqueue("p")
    [lease] = queue.dequeue(count=1, lease=30, worker="w")
    row = valkey.hgetall(queue.shard(0).job(ref.id))
    assert "deadline" not in row and "lease_ms" not in row
    assert (lease.lease, lease.timeout, lease.deadline) == (30.0, 0.0, 0.0)


def test_the_claim_caps_the_lease_at_the_timeout_and_a_second_and_writes_no_deadline(
        queue: Queue, valkey: Any) -> None:
    ref = queue.enqueue("p", timeout=2, lease=60)
    before = server_ms(valkey)
    [lease] = queue.dequeue(count=1, lease=30, worker="w")
    row = valkey.hgetall(queue.shard(0).job(ref.id))
    assert "deadline" not in row  # (the run has not started: the claim is not its start)
    assert before + 3000 <= int(row["lease_until"]) <= server_ms(valkey) + 3000
    assert (lease.lease, lease.timeout, lease.deadline) == (3.0, 2.0, 0.0)
    # a job not started yet (prefetched) is renewed as any other: its wait costs it nothing
    assert queue.extend(lease, 600)
    assert int(valkey.hget(queue.shard(0).job(ref.id), "lease_until")) >= before + 600_000
    assert "deadline" not in valkey.hgetall(queue.shard(0).job(ref.id))


def test_a_started_run_renewal_writes_its_deadline_and_ends_the_lease_a_second_past_it(
        queue: Queue, valkey: Any) -> None:
    ref = queue.enqueue("p", timeout=2, lease=60)
    [lease] = queue.dequeue(count=1, lease=30, worker="w")
    run = lease.started()
    assert run.deadline > 0 and run[:7] == lease[:7]
    before = server_ms(valkey)
    assert queue.extend(run, 600)
    row = valkey.hgetall(queue.shard(0).job(ref.id))
    deadline = int(row["deadline"])
    assert before + 1000 < deadline <= server_ms(valkey) + 2000
    assert int(row["lease_until"]) == deadline + 1000 == valkey.zscore(queue.shard(0).key("active"), ref.id)
    # a renewal (the heartbeat's, a checkpoint's) never reaches past the deadline's second,
    # and a later renewal never puts the deadline off
    assert queue.extend(run._replace(deadline=run.deadline + 60), 600)
    assert queue.checkpoint(run, {"at": 1}, extend=600)
    assert int(valkey.hget(queue.shard(0).job(ref.id), "deadline")) == deadline
    assert valkey.zscore(queue.shard(0).key("active"), ref.id) == deadline + 1000


def test_a_new_attempt_starts_without_the_deadline_of_the_last(queue: Queue, valkey: Any) -> None:
    ref = queue.enqueue("p", timeout=1, max_attempts=3)
    [first] = queue.dequeue(count=1, lease=30, worker="w")
    assert queue.extend(first.started(), 30)
    assert queue.nack(first, "failed", retry_in=0) == "pending"
    queue.dequeue(count=1, lease=30, worker="w")
    assert "deadline" not in valkey.hgetall(queue.shard(0).job(ref.id))


def test_a_queue_timeout_applies_to_its_jobs_and_a_job_own_wins(settings: Any, valkey: Any) -> None:
    settings.JOBQUEUE = {**settings.JOBQUEUE, "QUEUES": {"slow": {"timeout": timedelta(seconds=5)}}}
    conf.reset()
    queue = Queue("slow", client=valkey)
    assert queue.options.timeout == 5.0
    queue.enqueue("queue's")
    queue.enqueue("own", timeout=0.5)
    leases = {lease.payload: lease for lease in queue.dequeue(count=2, lease=30, worker="w")}
    assert leases["queue's"].timeout == 5.0 and leases["own"].timeout == 0.5


def test_the_reaper_ends_a_run_past_its_timeout_with_job_timeout(queue: Queue, valkey: Any) -> None:
    ref = queue.enqueue("stuck", timeout=0.05, max_attempts=2, backoff=0)
    [first] = queue.dequeue(count=1, lease=30, worker="stuck-worker")
    assert queue.extend(first.started(), 30)  # (the heartbeat of the run it started)
    wait_past(valkey, queue.shard(0).key("active"))  # (the lease: deadline + 1 s)
    assert queue.reap() == 1
    info = queue.get(ref.id)
    assert info and info.state == "pending" and "JobTimeout" in info.last_error
    history = valkey.hget(queue.shard(0).job(ref.id), "history")
    assert "JobTimeout" in history
    assert queue.ack(first, "late") is False  # (the stuck run's late result changes nothing)
    [second] = queue.dequeue(count=1, lease=30, worker="w2")
    second = second.started()
    wait_for(lambda: not queue.extend(second, 30) or server_ms(valkey) > int(
        valkey.hget(queue.shard(0).job(ref.id), "deadline")) + 1000, timeout=10)
    wait_past(valkey, queue.shard(0).key("active"))
    queue.reap()
    info = queue.get(ref.id)
    assert info and info.state == "dead" and "JobTimeout" in info.last_error


def test_a_lease_expired_before_the_deadline_is_not_called_a_timeout(queue: Queue) -> None:
    ref = queue.enqueue("p", timeout=60, max_attempts=1)
    queue.dequeue(count=1, lease=0.05, worker="gone")
    wait_past(queue.client, queue.shard(0).key("active"))
    assert queue.reap() == 1
    info = queue.get(ref.id)
    assert info and info.state == "dead" and info.last_error == "lease expired"


def test_a_job_whose_worker_died_before_its_run_started_is_not_called_a_timeout(
        queue: Queue, valkey: Any) -> None:
    # claimed (prefetched), never started: the lease lapses a second past the timeout, and
    # the reaper says so; the run never began, so it did not pass its limit
    ref = queue.enqueue("p", timeout=0.05, max_attempts=2)
    queue.dequeue(count=1, lease=30, worker="gone")
    assert valkey.zscore(queue.shard(0).key("active"), ref.id) <= server_ms(valkey) + 1050
    wait_past(valkey, queue.shard(0).key("active"))
    assert queue.reap() == 1
    info = queue.get(ref.id)
    assert info and info.state == "pending" and info.last_error == "lease expired"


def test_a_corrupt_timeout_in_the_lease_field_buries_the_job(queue: Queue, valkey: Any) -> None:
    ref = queue.enqueue("p", timeout=1)
    valkey.hset(queue.shard(0).job(ref.id), "lease_ms", "30000:x")
    assert queue.dequeue(count=1, lease=30, worker="w") == []
    info = queue.get(ref.id)
    assert info and info.state == "dead" and "lease_ms" in info.last_error


def test_a_job_handed_to_an_idle_worker_gets_its_lease_capped_too(valkey: Any) -> None:
    queue = Queue("default", client=valkey)
    shard = queue.shard(0)
    valkey.hset(shard.key("idle"), "w", handoff.offer(30_000, False))
    before = server_ms(valkey)
    ref = queue.enqueue("p", timeout=1.5)
    [lease] = handoff.withdraw(queue.client, shard, "w")
    row = valkey.hgetall(shard.job(ref.id))
    assert (lease.job_id, lease.lease, lease.timeout, lease.deadline) == (ref.id, 2.5, 1.5, 0.0)
    assert "deadline" not in row and before + 2500 <= int(row["lease_until"]) <= server_ms(valkey) + 2500


def test_a_reaped_timeout_is_retried_after_the_job_backoff(queue: Queue, valkey: Any) -> None:
    ref = queue.enqueue("stuck", timeout=0.05, max_attempts=3, backoff=60)
    [lease] = queue.dequeue(count=1, lease=30, worker="stuck-worker")
    assert queue.extend(lease.started(), 30)
    wait_past(valkey, queue.shard(0).key("active"))
    assert queue.reap() == 1
    info = queue.get(ref.id)
    assert info and info.state == "scheduled" and "JobTimeout" in info.last_error
    due = valkey.zscore(queue.shard(0).key("schedule"), ref.id)
    assert server_ms(valkey) + 55_000 < due <= server_ms(valkey) + 60_000


def test_a_reaped_timeout_counts_as_a_failed_run(queue: Queue, valkey: Any) -> None:
    ref = queue.enqueue("stuck", timeout=0.05, max_attempts=3, backoff=60)
    [lease] = queue.dequeue(count=1, lease=30, worker="stuck-worker")
    assert queue.extend(lease.started(), 30)
    wait_past(valkey, queue.shard(0).key("active"))
    assert queue.reap() == 1
    assert "JobTimeout" in queue.get(ref.id).last_error  # type: ignore[union-attr]
    # as nack.lua counts a failed run that will be retried (meta n_failed, the minute's
    # `failed`, the duration histogram): jobqueue_jobs_finished_total{outcome="failed"}
    shard = queue.shard(0)
    assert valkey.hget(shard.key("meta"), "n_failed") == "1"
    minute = server_ms(valkey) // 60000
    assert any(valkey.hget(f"{shard.base}:m:{m}", "failed") == "1" for m in (minute - 1, minute))
    assert int(valkey.hget(f"{shard.base}:hist", "sum_ms") or -1) >= 0


def test_a_flow_job_keeps_its_timeout() -> None:
    from jobqueue import chain
    from tests.jobapp import jobs

    chain(jobs.add.s(1, 2).using(timeout=4), jobs.mul.s(10)).enqueue()
    [first] = Queue("default").dequeue(count=5, lease=30, worker="w")
    assert (first.timeout, first.lease) == (4.0, 5.0)
