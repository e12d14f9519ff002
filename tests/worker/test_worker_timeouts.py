"""Run timeouts with the real runworker (subprocesses, real Valkey): an async run is cancelled, a
thread's run overrunning (its late return dropped, its slot kept until it returns), a pool
process killed and replaced, a stuck worker's run reaped by another worker; the limit counts from
the run's start (a prefetched job's wait, a pool process's start are not charged); Celery's time
limits."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from jobqueue import Queue, conf, get_job
from jobqueue.exceptions import InvalidOption
from jobqueue.models import Job
from jobqueue.worker import presence
from tests.jobapp import celery_tasks, jobs
from tests.servers import ValkeyProcess
from tests.workers import run_burst, start_worker, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _state(job_id: str) -> str | None:
    info = get_job(job_id)
    return info.state if info else None


def _stop(worker: object) -> None:
    worker.send_signal(signal.SIGTERM)  # type: ignore[attr-defined]
    assert worker.wait(30) == 0  # type: ignore[attr-defined]


def test_a_hanging_async_run_is_cancelled_and_the_job_dies_with_job_timeout(valkey_url: str) -> None:
    ref = jobs.ahangs.using(timeout=0.3, max_attempts=2, backoff=0).enqueue(3600)
    beside = jobs.ahangs.enqueue(0.01)  # (the loop goes on serving the others)
    swallows = jobs.aswallows_cancel.using(timeout=0.3).enqueue(3600)
    assert run_burst(valkey_url, "--concurrency", "4", timeout=60) == 0
    row = Job.objects.get(pk=ref.id)
    assert (row.state, row.attempts) == ("dead", 2)
    assert row.last_error.startswith("jobqueue.exceptions.JobTimeout:") and "0.3 s" in row.last_error
    assert Job.objects.get(pk=beside.id).result == "woke"
    row = Job.objects.get(pk=swallows.id)  # (what it returned past its limit is not a success)
    assert row.state == "dead" and "JobTimeout" in row.last_error and row.result is None


def test_a_thread_run_past_its_timeout_is_retried_and_its_late_return_changes_nothing(
        valkey_server: ValkeyProcess, tmp_path: Path) -> None:
    late = tmp_path / "late"
    ref = jobs.overruns_first_attempt.using(timeout=0.5).enqueue(str(late), 4)
    worker = start_worker(valkey_server.url, "--concurrency", "2", log=tmp_path / "log")
    try:
        wait_for(lambda: _state(ref.id) == "succeeded", timeout=20)
        assert not late.exists()  # (retried on the other slot while the first still ran)
        client = conf.get_client()
        wait_for(lambda: [w.get("overrunning") for w in presence.workers(client)] == [1])
        wait_for(late.exists, timeout=20)  # the overrunning run returns at last ...
        wait_for(lambda: [w.get("overrunning") for w in presence.workers(client)] == [0])
        info = get_job(ref.id)  # ... and changes nothing
        assert info and (info.state, info.result, info.attempts) == ("succeeded", "retried", 2)
        assert "JobTimeout" in info.history[0]["error"]
        assert late.read_text() == "cancelled=True timed_out=True"
        assert "what it returned is discarded" in (tmp_path / "log").read_text()
    finally:
        late.touch()
        _stop(worker)


def test_an_overrunning_thread_keeps_its_slot_until_it_returns(
        valkey_server: ValkeyProcess, tmp_path: Path) -> None:
    late = tmp_path / "late"
    first = jobs.overruns_first_attempt.using(timeout=0.3, max_attempts=2).enqueue(str(late), 2)
    worker = start_worker(valkey_server.url, "--concurrency", "1")
    try:
        wait_for(lambda: (get_job(first.id) or first).attempts >= 1)  # type: ignore[union-attr]
        after = jobs.add.enqueue(1, 2)
        wait_for(lambda: _state(first.id) == "succeeded" and _state(after.id) == "succeeded",
                 timeout=30)
        # at --concurrency 1 nothing ran beside the overrunning thread: the retry, and the job
        # behind it, started once the thread had returned
        info = get_job(first.id)
        assert info is not None and info.attempts == 2  # (one timeout, one success)
        assert late.exists() and info.started_at.timestamp() >= late.stat().st_mtime - 0.05  # type: ignore[union-attr]
    finally:
        _stop(worker)


def test_a_worker_whose_only_thread_overruns_takes_no_job_it_cannot_start(
        valkey_server: ValkeyProcess, tmp_path: Path) -> None:
    # The only runner thread overruns for ~4 s (its run passed its 0.3 s limit). A job enqueued
    # meanwhile must not be claimed (nor handed over) into this worker, where no thread can
    # start it: it waits in its queue until the thread returns, then runs within its limit.
    late = tmp_path / "late"
    first = jobs.overruns_first_attempt.using(timeout=0.3, max_attempts=5).enqueue(str(late), 4)
    worker = start_worker(valkey_server.url, "--concurrency", "1")
    try:
        wait_for(lambda: [w.get("overrunning") for w in presence.workers(conf.get_client())] == [1])
        after = jobs.add.using(timeout=1, max_attempts=1).enqueue(1, 2)
        wait_for(lambda: _state(after.id) in ("succeeded", "dead"), timeout=30)
        info = get_job(after.id)
        assert info is not None and info.state == "succeeded", (info.state, info.last_error)
        assert info.started_at.timestamp() >= late.stat().st_mtime - 0.05  # type: ignore[union-attr]
        wait_for(lambda: _state(first.id) == "succeeded", timeout=30)  # (its retry, after)
    finally:
        late.touch()
        _stop(worker)


def test_a_prefetched_job_is_not_charged_its_wait_against_its_timeout(valkey_url: str) -> None:
    # Each run takes 0.6 s, well within its 1 s limit; at --concurrency 1 the worker claims
    # both at once (prefetch), so the second waits 0.6 s in the inbox before it starts.
    refs = [jobs.sleep.using(timeout=1.0, max_attempts=1).enqueue(0.6) for _ in range(2)]
    asyncs = [jobs.ahangs.using(timeout=1.0, max_attempts=1).enqueue(0.6) for _ in range(2)]
    assert run_burst(valkey_url, "--concurrency", "1", timeout=60) == 0
    rows = {row.pk: (row.state, row.last_error[:80])
            for row in Job.objects.filter(pk__in=[r.id for r in refs + asyncs])}
    assert len(rows) == 4 and all(state == "succeeded" for state, _ in rows.values()), rows


def test_a_pool_process_start_is_not_charged_to_the_first_job_timeout(valkey_url: str) -> None:
    # Under --processes a runner spawns its process (and sets Django up there) inside the run of
    # its first job, after the claim: a quick job with a short limit must still succeed.
    ref = jobs.add.using(timeout=0.5, max_attempts=1).enqueue(1, 2)
    assert run_burst(valkey_url, "--processes", "--concurrency", "1", timeout=60) == 0
    row = Job.objects.get(pk=ref.id)
    assert (row.state, row.result) == ("succeeded", 3), row.last_error


def test_an_async_run_that_returns_past_its_deadline_is_not_a_success(valkey_url: str) -> None:
    # A handler that holds the loop past its limit gives the loop's timer no chance to cancel
    # it: what it returns then is still its timeout, as on a thread.
    ref = jobs.blocks_the_loop.using(timeout=0.2, max_attempts=1).enqueue(0.6)
    assert run_burst(valkey_url, "--concurrency", "1", timeout=60) == 0
    row = Job.objects.get(pk=ref.id)
    assert row.state == "dead" and "JobTimeout" in row.last_error, (row.state, row.last_error)


def test_a_spinning_run_under_processes_has_its_process_killed_and_replaced(
        valkey_server: ValkeyProcess, tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    ref = jobs.spins.using(timeout=1).enqueue(str(pid_file))
    worker = start_worker(valkey_server.url, "--processes", "--concurrency", "1")
    try:
        wait_for(pid_file.exists, timeout=30)
        pid = int(pid_file.read_text())

        def gone() -> bool:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return True
            return False

        wait_for(gone, timeout=10)
        wait_for(lambda: _state(ref.id) == "dead", timeout=10)
        assert "JobTimeout" in get_job(ref.id).last_error  # type: ignore[union-attr]
        after = jobs.add.enqueue(2, 3)  # a new process runs the next job
        wait_for(lambda: _state(after.id) == "succeeded", timeout=30)
    finally:
        _stop(worker)


def test_a_stuck_worker_run_is_ended_by_another_worker_reaper(
        valkey_server: ValkeyProcess, tmp_path: Path) -> None:
    release = tmp_path / "release"
    ref = jobs.hangs_on_first_attempt.using(timeout=2, max_attempts=3).enqueue(str(release))
    stuck = start_worker(valkey_server.url, "--concurrency", "1")
    other = None
    try:
        row = Queue("default").shard(0).job(ref.id)
        # the started run's first renewal tells the server its deadline (a worker stuck before
        # that leaves a lease that lapses as any other: "lease expired")
        wait_for(lambda: conf.get_client().hget(row, "deadline") is not None, every=0.005)
        stuck.send_signal(signal.SIGSTOP)  # (its heartbeat cannot renew past the deadline)
        other = start_worker(valkey_server.url, "--concurrency", "1")
        wait_for(lambda: _state(ref.id) == "succeeded", timeout=30)
        info = get_job(ref.id)
        assert info and (info.result, info.attempts) == (2, 2)
        first = info.history[0]
        assert "JobTimeout" in first["error"] and "reaped" in first["error"]
    finally:
        release.touch()
        stuck.send_signal(signal.SIGCONT)
        _stop(stuck)
        if other is not None:
            _stop(other)


def test_celery_time_limits_map_to_the_timeout_and_the_soft_limit_raises_inside_the_task(
        valkey_server: ValkeyProcess) -> None:
    mapped = celery_tasks.shout.apply_async(["hi"], time_limit=2, soft_time_limit=1)
    info = get_job(mapped.id)
    assert info and info.timeout == 2.0 and info.payload["soft_time_limit"] == 1.0
    hard = celery_tasks.overruns_its_time_limit.delay()
    assert get_job(hard.id).timeout == 0.5  # type: ignore[union-attr]
    for bad in ({"time_limit": 0}, {"soft_time_limit": "soon"}):
        with pytest.raises(InvalidOption, match=rf"^{next(iter(bad))} must"):
            celery_tasks.shout.apply_async(["x"], **bad)
    soft = celery_tasks.catches_its_soft_limit.delay()
    assert run_burst(valkey_server.url, "--concurrency", "4", timeout=60) == 0
    assert Job.objects.get(pk=soft.id).result == "cleaned up"
    row = Job.objects.get(pk=hard.id)
    assert (row.state, row.attempts) == ("dead", 2) and "JobTimeout" in row.last_error, (
        row.state, row.attempts, row.last_error)

