"""The real runworker with `async def` handlers (subprocesses, real Valkey): one event loop,
checkpoints and cancels awaited, a blocked loop named, a graceful stop."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from jobqueue import Queue, get_job
from jobqueue.models import Job
from tests.jobapp import jobs
from tests.servers import ValkeyProcess
from tests.workers import run_burst, start_worker, stop_twice, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_an_async_handler_saves_checkpoints_and_sees_its_cancel_awaiting(
        valkey_server: ValkeyProcess) -> None:
    ref = jobs.acancellable.enqueue(60)
    other = jobs.acancellable.enqueue(0.5)  # on the same loop meanwhile: never held up
    worker = start_worker(valkey_server.url)
    try:
        wait_for(lambda: ((get_job(ref.id) or ref).checkpoint or {}).get("step", 0) >= 3)  # type: ignore[union-attr]
        wait_for(lambda: (get_job(other.id) or other).state == "succeeded", timeout=10)  # type: ignore[union-attr]
        assert Queue("default").cancel(ref.id) == "active"
        wait_for(lambda: (get_job(ref.id) or ref).state == "cancelled", timeout=10)  # type: ignore[union-attr]
        info = get_job(ref.id)
        assert info and "cancelled while it ran" in info.last_error and info.checkpoint["step"] >= 3
        assert (get_job(other.id) or other).result >= 5  # type: ignore[union-attr, operator]
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(20) == 0


def test_an_async_handler_that_blocks_the_loop_is_named_in_the_log(
        valkey_server: ValkeyProcess, tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    ref = jobs.blocks_the_loop.enqueue(2.5)
    worker = start_worker(valkey_server.url, log=log)
    try:
        wait_for(lambda: (get_job(ref.id) or ref).state == "succeeded", timeout=20)  # type: ignore[union-attr]
        wait_for(lambda: "blocked the worker's event loop" in log.read_text(), timeout=5)
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(20) == 0
    text = log.read_text()
    assert "in blocks_the_loop" in text and "time.sleep(seconds)" in text  # the blocking call
    assert text.count("blocked the worker's event loop") == 1  # once per stall


def test_async_handlers_share_one_event_loop_and_run_side_by_side(
        valkey_server: ValkeyProcess) -> None:
    refs = jobs.async_sleep.enqueue_many([(1.0,)] * 40)
    fails = jobs.async_fails.enqueue("boom")
    retried = jobs.async_fails.enqueue("retry")
    plain = jobs.add.enqueue(2, 2)  # a plain handler beside them still runs on a thread
    started = time.monotonic()
    assert run_burst(valkey_server.url, "--concurrency", "40") == 0
    results = [Job.objects.get(pk=r.id).result for r in refs]
    assert time.monotonic() - started < 25  # 40 one-second sleeps at once, not one after another
    # Side by side: the last one started before the first one's sleep was over (counted on
    # the loop's own clock, so a slow machine that delays them all does not matter).
    assert max(r["started"] for r in results) < min(r["slept"] for r in results)
    assert len({r["thread"] for r in results}) == 1  # one loop thread ran them all
    assert {r["loop"] for r in results} == {"uvloop"}  # (installed: the default)
    assert sorted(r["done"] for r in results) == list(range(1, 41))  # one client, kept
    dead = Job.objects.get(pk=fails.id)
    assert dead.state == "dead" and dead.attempts == 2
    assert "ValueError: async boom on attempt 2" in dead.last_error
    assert Job.objects.get(pk=retried.id).state == "dead"
    assert Job.objects.get(pk=plain.id).result == 4


def test_event_loop_asyncio_runs_async_handlers_on_asyncios_own_loop(
        valkey_server: ValkeyProcess) -> None:
    refs = jobs.async_sleep.enqueue_many([(0,)] * 3)
    assert run_burst(valkey_server.url, env={"JOBQUEUE_TEST_EVENT_LOOP": "asyncio"}) == 0
    assert {Job.objects.get(pk=r.id).result["loop"] for r in refs} == {"asyncio"}


def test_the_worker_tunes_the_interpreter_for_its_threads(valkey_server: ValkeyProcess) -> None:
    # Start-up's objects are hidden from the garbage collector (full collections over Django's
    # objects were most of a no-op job's time in it); once async handlers run, the GIL changes
    # hands sooner (the main loop and the event loop each wait for sockets in turn).
    plain = jobs.interpreter_state.enqueue()
    assert run_burst(valkey_server.url) == 0
    state = Job.objects.get(pk=plain.id).result
    assert state["frozen"] > 10_000 and state["threshold"][0] == 10_000
    assert state["switch"] == 0.005  # (plain handlers only: the default)
    coroutine = jobs.ainterpreter_state.enqueue()
    assert run_burst(valkey_server.url) == 0
    assert Job.objects.get(pk=coroutine.id).result["switch"] == pytest.approx(0.0002)


def test_a_stopping_worker_lets_async_jobs_finish_or_cancels_and_releases_them(
        valkey_server: ValkeyProcess, tmp_path: Path) -> None:
    short = jobs.async_sleep.enqueue(2)
    worker = start_worker(valkey_server.url)
    wait_for(lambda: (get_job(short.id) or short).state == "active")  # type: ignore[union-attr]
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(20) == 0
    assert (info := get_job(short.id)) and info.state == "succeeded" and info.attempts == 1
    long = jobs.async_sleep.using(max_attempts=1).enqueue(60)
    log = tmp_path / "worker.log"
    worker = start_worker(valkey_server.url, log=log)
    wait_for(lambda: (get_job(long.id) or long).state == "active")  # type: ignore[union-attr]
    stop_twice(worker, log)  # the second: release now; the task is cancelled
    assert worker.wait(10) == 0
    assert (info := get_job(long.id)) and info.state == "pending" and info.attempts == 1


def test_an_async_handler_that_never_awaits_runs_at_concurrency_1(
        valkey_server: ValkeyProcess) -> None:
    # Each job ends within its eager start, inside the claim that the previous job's outcome
    # made: its outcome must wait for the loop's next turn, or the worker waits on itself.
    refs = jobs.ainterpreter_state.enqueue_many([() for _ in range(30)])
    assert run_burst(valkey_server.url, "--concurrency", "1", timeout=60) == 0
    assert all(Job.objects.get(pk=ref.id).state == "succeeded" for ref in refs)
