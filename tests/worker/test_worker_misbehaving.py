"""Handlers that misbehave, on each path a job runs on (a runner thread, the event loop, the
`--processes` pool), through the real runworker: whatever a handler does, its job ends, is
charged once, and the worker goes on; a stop ends what still runs before handing it back."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

from jobqueue import Queue, get_job
from jobqueue.models import Job
from tests.jobapp import jobs
from tests.servers import ValkeyProcess
from tests.workers import run_burst, start_worker, stop_twice, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

RAISES = ["SystemExit", "KeyboardInterrupt", "CancelledError", "GeneratorExit"]
ON_A_CONNECTION = ["atomic left open", "autocommit off", "write"]
"""Run in this order on one connection (one runner, `--concurrency 1`): the last one's write
must be committed alone, whatever the first two left behind."""


def alive(pid: int) -> bool:
    """Whether process `pid` still runs (a zombie waiting for its parent does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def users() -> set[str]:
    from django.contrib.auth.models import User

    return set(User.objects.values_list("username", flat=True))


def check_ended(refs: dict[str, Any], failed: list[str]) -> None:
    """Each job ended once: those in `failed` dead after one run naming what they raised, the
    others succeeded after one run."""
    for how, ref in refs.items():
        row = Job.objects.get(pk=ref.id)
        state = "dead" if how in failed else "succeeded"
        assert (row.state, row.attempts) == (state, 1), (how, row.state, row.attempts, row.last_error)
        if how in RAISES:
            assert how in row.last_error, (how, row.last_error)


def check_connection_left_clean(refs: dict[str, Any]) -> None:
    """What the jobs that left a transaction open wrote was rolled back; the job after them
    wrote alone, and it was committed."""
    written = users()
    assert f"written-{refs['write'].id}" in written
    assert not {f"left-open-{refs['atomic left open'].id}",
                f"uncommitted-{refs['autocommit off'].id}"} & written


def test_misbehaving_handlers_on_threads_and_on_the_event_loop(valkey_server: ValkeyProcess) -> None:
    plain = {how: jobs.misbehaves.enqueue(how) for how in RAISES + ON_A_CONNECTION}
    coroutines = {how: jobs.amisbehaves.enqueue(how, 0.6)
                  for how in [*RAISES, "cancelled sub-task", "block"]}
    after = [jobs.add.enqueue(1, 1), jobs.async_sleep.enqueue(0)]  # the worker goes on
    assert run_burst(valkey_server.url, "--concurrency", "1", timeout=90) == 0
    check_ended(plain, RAISES)
    check_ended(coroutines, [*RAISES, "cancelled sub-task"])
    assert "CancelledError" in Job.objects.get(pk=coroutines["cancelled sub-task"].id).last_error
    check_connection_left_clean(plain)
    assert [Job.objects.get(pk=ref.id).state for ref in after] == ["succeeded"] * 2


def test_misbehaving_handlers_in_the_process_pool(valkey_server: ValkeyProcess) -> None:
    plain = {how: jobs.misbehaves.enqueue(how) for how in [*RAISES, "exit", *ON_A_CONNECTION]}
    coroutine = jobs.amisbehaves.enqueue("CancelledError")  # (asyncio.run in the pool process)
    after = jobs.add.enqueue(1, 1)
    assert run_burst(valkey_server.url, "--processes", "--concurrency", "1", timeout=90) == 0
    check_ended(plain, [*RAISES, "exit"])
    assert "exited with code 7" in Job.objects.get(pk=plain["exit"].id).last_error
    check_ended({"CancelledError": coroutine}, ["CancelledError"])
    check_connection_left_clean(plain)
    assert Job.objects.get(pk=after.id).state == "succeeded"


def test_past_the_grace_a_pool_process_running_a_job_is_ended_before_it_is_handed_back(
        valkey_server: ValkeyProcess, tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    ref = jobs.misbehaves.enqueue("hang", str(pid_file))
    worker = start_worker(valkey_server.url, "--processes", "--concurrency", "1", "--grace", "1")
    pid = 0
    try:
        wait_for(lambda: pid_file.exists() and pid_file.read_text(), timeout=60)
        pid = int(pid_file.read_text())
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0
        wait_for(lambda: not alive(pid), timeout=10)  # not left to run it beside a new run
    finally:
        worker.kill()
        if pid and alive(pid):
            os.kill(pid, signal.SIGKILL)
    info = get_job(ref.id)
    assert info and info.state == "pending" and info.attempts == 1 and info.last_error == ""


def test_a_second_stop_ends_async_jobs_that_block_the_loop_or_swallow_their_cancel(
        valkey_server: ValkeyProcess, tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    swallows = jobs.amisbehaves.enqueue("swallow", 0.05)
    worker = start_worker(valkey_server.url, "--concurrency", "2", log=log)
    try:
        wait_for(lambda: getattr(get_job(swallows.id), "progress", None) == "started")
        blocks = jobs.amisbehaves.enqueue("block", 120)
        wait_for(lambda: getattr(get_job(blocks.id), "progress", None) == "blocking")
        stop_twice(worker, log)
        assert worker.wait(20) == 0  # "exits 0 without waiting for them"
    finally:
        worker.kill()
    for ref in (swallows, blocks):
        info = get_job(ref.id)
        assert info and info.state == "pending" and info.attempts == 1 and info.last_error == ""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "group-sigterm"])
def test_a_stop_signal_to_the_process_group_leaves_pool_jobs_their_grace(
        valkey_server: ValkeyProcess, tmp_path: Path, sig: signal.Signals) -> None:
    """Ctrl-C in a terminal, or supervisord's `stopasgroup`, signals the pool's processes too:
    they leave the stop to the worker, whose running jobs finish within the grace."""
    log, go = tmp_path / "worker.log", tmp_path / "go"
    ref = jobs.waits_for_file.enqueue(str(go))
    worker = start_worker(valkey_server.url, "--processes", "--concurrency", "1", "--grace", "20",
                          log=log, new_session=True)
    try:
        wait_for(lambda: getattr(get_job(ref.id), "progress", None) == "started", timeout=60)
        os.killpg(worker.pid, sig)
        wait_for(lambda: "stop requested" in log.read_text())
        go.touch()
        assert worker.wait(30) == 0
    finally:
        worker.kill()
    info = get_job(ref.id)
    assert info and info.state == "succeeded" and info.attempts == 1, info


def test_async_jobs_run_at_most_concurrency_at_once_and_prefetched_ones_are_handed_back(
        valkey_server: ValkeyProcess, tmp_path: Path) -> None:
    go = tmp_path / "go"
    refs = jobs.aholds_until.enqueue_many([(str(go),)] * 4)
    client = Queue("default").client
    worker = start_worker(valkey_server.url, "--concurrency", "2")  # (prefetch 2: holds 4)
    try:
        wait_for(lambda: Queue("default").counts()["active"] == 4)
        wait_for(lambda: client.llen("test:started") >= 2)
        worker.send_signal(signal.SIGTERM)
        wait_for(lambda: Queue("default").counts()["pending"] == 2, timeout=10)  # at once
        go.touch()
        assert worker.wait(30) == 0
    finally:
        worker.kill()
    started = set(client.lrange("test:started", 0, -1))
    states = {ref.id: get_job(ref.id) for ref in refs}
    assert len(started) == 2  # never more than --concurrency ran
    assert {i.state for r, i in states.items() if r in started} == {"succeeded"}  # type: ignore[union-attr]
    assert {(i.state, i.attempts, i.last_error)  # type: ignore[union-attr]
            for r, i in states.items() if r not in started} == {("pending", 1, "")}


def test_a_pool_process_that_dies_fails_its_own_job_only(
        valkey_server: ValkeyProcess, tmp_path: Path) -> None:
    go = tmp_path / "go"
    innocent = jobs.waits_for_file.enqueue(str(go))
    worker = start_worker(valkey_server.url, "--processes", "--concurrency", "2")
    try:
        wait_for(lambda: getattr(get_job(innocent.id), "progress", None) == "started", timeout=60)
        crash = jobs.misbehaves.enqueue("exit")  # (in the other process, meanwhile)
        wait_for(lambda: (get_job(crash.id) or crash).state == "dead", timeout=60)  # type: ignore[union-attr]
        go.touch()
        wait_for(lambda: (get_job(innocent.id) or innocent).state != "active")  # type: ignore[union-attr]
        after = jobs.add.enqueue(2, 2)  # (the next job gets a new process)
        wait_for(lambda: (get_job(after.id) or after).state == "succeeded", timeout=60)  # type: ignore[union-attr]
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0
    finally:
        worker.kill()
    info = get_job(innocent.id)
    assert info and info.state == "succeeded" and info.attempts == 1, info
    assert (info := get_job(crash.id)) and info.attempts == 1 and "exited with code 7" in info.last_error
