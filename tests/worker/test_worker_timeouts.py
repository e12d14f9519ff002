"""Run timeouts with the real runworker (subprocesses, real Valkey): an async run is cancelled, a
thread's run abandoned (its late return dropped, its slot kept until it returns), a pool process
killed and replaced, a stuck worker's run reaped by another worker; Celery's time limits."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from jobqueue import conf, get_job
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
        wait_for(lambda: [w.get("abandoned") for w in presence.workers(client)] == [1])
        wait_for(late.exists, timeout=20)  # the abandoned run returns at last ...
        wait_for(lambda: [w.get("abandoned") for w in presence.workers(client)] == [0])
        info = get_job(ref.id)  # ... and changes nothing
        assert info and (info.state, info.result, info.attempts) == ("succeeded", "retried", 2)
        assert "JobTimeout" in info.history[0]["error"]
        assert late.read_text() == "cancelled=True timed_out=True"
        assert "what it returned is discarded" in (tmp_path / "log").read_text()
    finally:
        late.touch()
        _stop(worker)


def test_an_abandoned_thread_keeps_its_slot_until_it_returns(
        valkey_server: ValkeyProcess, tmp_path: Path) -> None:
    late = tmp_path / "late"
    first = jobs.overruns_first_attempt.using(timeout=0.3).enqueue(str(late), 2)
    worker = start_worker(valkey_server.url, "--concurrency", "1")
    try:
        wait_for(lambda: (get_job(first.id) or first).attempts >= 1)  # type: ignore[union-attr]
        after = jobs.add.enqueue(1, 2)
        wait_for(lambda: _state(first.id) == "succeeded" and _state(after.id) == "succeeded",
                 timeout=30)
        # at --concurrency 1 nothing ran beside the abandoned thread: the retry, and the job
        # behind it, started once the thread had returned
        started = get_job(first.id).started_at  # type: ignore[union-attr]
        assert late.exists() and started.timestamp() >= late.stat().st_mtime - 0.05  # type: ignore[union-attr]
    finally:
        _stop(worker)


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
        wait_for(lambda: _state(ref.id) == "active", every=0.005)
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
        with pytest.raises(InvalidOption, match=r"timeout|soft_time_limit"):
            celery_tasks.shout.apply_async(["x"], **bad)
    soft = celery_tasks.catches_its_soft_limit.delay()
    assert run_burst(valkey_server.url, "--concurrency", "4", timeout=60) == 0
    assert Job.objects.get(pk=soft.id).result == "cleaned up"
    row = Job.objects.get(pk=hard.id)
    assert (row.state, row.attempts) == ("dead", 2) and "JobTimeout" in row.last_error, (
        row.state, row.attempts, row.last_error)

