"""`ctx.progress(value)`: fenced by the attempt's token, coalesced, kept after the job ends."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from jobqueue import JobContext, Queue, get_job
from jobqueue.api.handler import PROGRESS_EVERY, ProgressBoard, write_progress
from jobqueue.worker.executor import execute
from tests.jobapp import jobs
from tests.servers import ValkeyProcess
from tests.workers import start_worker, wait_for


def _script_calls(client: Any) -> int:
    return int(client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))


def test_only_the_current_attempts_holder_writes_progress(valkey_url: str) -> None:
    queue = Queue("default")
    jobs.noop.enqueue()
    [old] = queue.dequeue(count=1, lease=0.05)
    wait_for(lambda: queue.reap() == 1)
    [new] = queue.dequeue(count=1)
    assert write_progress([(old, '"stale"'), (new, '"fresh"')]) == [False, True]
    assert queue.get(new.job_id).progress == "fresh"  # type: ignore[union-attr]
    assert queue.ack(new, None)
    assert write_progress([(new, '"late"')]) == [False]
    assert queue.get(new.job_id).progress == "fresh"  # type: ignore[union-attr]  # kept after the end


def test_progress_in_a_tight_loop_is_coalesced(valkey_server: ValkeyProcess) -> None:
    client = redis.Redis.from_url(valkey_server.url, decode_responses=True)
    queue = Queue("default")
    jobs.noop.enqueue()
    [lease] = queue.dequeue(count=1)
    board, stop = ProgressBoard(), threading.Event()
    ctx = JobContext(lease)
    import jobqueue.api.handler as handler

    original, handler.PROGRESS = handler.PROGRESS, board  # this test's own board
    writer = threading.Thread(target=board.run, args=(stop,))
    writer.start()
    try:
        wait_for(lambda: board.attached)
        before, started = _script_calls(client), time.monotonic()
        for i in range(20_000):
            ctx.progress({"step": i})
        elapsed = time.monotonic() - started
        wait_for(lambda: queue.get(lease.job_id).progress == {"step": 19_999})  # type: ignore[union-attr]
        calls = _script_calls(client) - before
    finally:
        stop.set()
        writer.join()
        handler.PROGRESS = original
    assert 1 <= calls <= elapsed / PROGRESS_EVERY + 3  # a few a second, not 20,000


def test_without_a_worker_the_context_writes_itself_and_the_end_writes_the_last(
        valkey_url: str) -> None:
    queue = Queue("default")
    jobs.counts_up.enqueue(500)
    [lease] = queue.dequeue(count=1)
    outcome = execute(lease)
    assert outcome.ok
    assert queue.get(lease.job_id).progress == {"done": 500, "of": 500}  # type: ignore[union-attr]


def test_the_last_progress_is_written_while_the_progress_thread_is_writing_it(
        valkey_url: str, tmp_path: Path) -> None:
    """The progress thread has taken the job's last value and is about to write it when the
    job ends: the runner must not let the outcome be recorded before that write lands (a
    fenced write after the ack is refused, and the value lost)."""
    import jobqueue.api.handler as handler

    queue = Queue("default")
    gate = tmp_path / "go"
    jobs.reports_then_waits.enqueue(100, str(gate))
    [lease] = queue.dequeue(count=1)
    board, stop = ProgressBoard(), threading.Event()
    about_to_write, recorded = threading.Event(), threading.Event()

    def held_before_its_write(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code is write_progress.__code__:
            about_to_write.set()  # (the value is taken: the write has yet to go out)
            recorded.wait(1.0)  # it lands after the outcome, unless the runner waits for it

    def progress_thread() -> None:
        sys.settrace(held_before_its_write)
        board.run(stop)

    def runner() -> None:
        outcome = execute(lease)
        assert queue.ack_encoded([(lease, outcome.result)]) == [1]
        recorded.set()

    original, handler.PROGRESS = handler.PROGRESS, board
    writer, running = threading.Thread(target=progress_thread), threading.Thread(target=runner)
    writer.start()
    try:
        wait_for(lambda: board.attached)
        running.start()
        wait_for(about_to_write.is_set)
        gate.touch()
        running.join(30)
    finally:
        stop.set()
        writer.join()
        handler.PROGRESS = original
    assert queue.get(lease.job_id).progress == 100  # type: ignore[union-attr]


def test_progress_must_be_json() -> None:
    from jobqueue.exceptions import InvalidPayload
    from jobqueue.records import Lease

    ctx = JobContext(Lease("JOB0000000000a", 1, None, None, 30.0, "default", 0))
    with pytest.raises(InvalidPayload, match="progress"):
        ctx.progress(object())


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_running_jobs_progress_is_visible_and_stays_after_it_ends(
        valkey_server: ValkeyProcess, tmp_path: Path) -> None:
    proc = start_worker(valkey_server.url, "--concurrency", "2", log=tmp_path / "worker.log")
    try:
        gate = tmp_path / "go"
        held = jobs.waits_for_file.enqueue(str(gate))
        wait_for(lambda: (info := get_job(held.id)) is not None and info.progress == "started"
                 and info.state == "active", timeout=60)
        gate.touch()
        assert held.result(timeout=60) == "finished"
        assert get_job(held.id).progress == "finishing"  # type: ignore[union-attr]
        tight = jobs.counts_up.enqueue(20_000)
        assert tight.result(timeout=60) == 20_000
        assert get_job(tight.id).progress == {"done": 20_000, "of": 20_000}  # type: ignore[union-attr]
    finally:
        proc.terminate()
        proc.wait(60)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("handler", ["waits_for_file", "awaits_file"])
def test_a_last_progress_valkey_refuses_loses_only_that_progress(
        settings: Any, tmp_path: Path, handler: str) -> None:
    # The last progress of a job is written as it ends, while Valkey refuses writes (an error
    # reply: OOM). That write is lost and logged; the job's outcome is still recorded once
    # Valkey takes writes again, and the worker (one runner) goes on running jobs.
    server = ValkeyProcess("--maxmemory-policy", "noeviction", appendonly=False).start()
    try:
        settings.JOBQUEUE = {**settings.JOBQUEUE, "URL": server.url}
        client = redis.Redis(port=server.port)
        log, gate = tmp_path / "worker.log", tmp_path / "go"
        proc = start_worker(server.url, "--queues", "default", "--concurrency", "1", log=log)
        try:
            held = getattr(jobs, handler).enqueue(str(gate))
            wait_for(lambda: (info := get_job(held.id)) is not None and info.state == "active"
                     and info.progress == "started", timeout=60)
            client.config_set("maxmemory", 1)  # (every write refused: OOM)
            try:
                gate.touch()
                wait_for(lambda: "its last progress could not be written" in log.read_text()
                         or "Traceback" in log.read_text())
            finally:
                client.config_set("maxmemory", 0)
            assert held.result(timeout=30) == "finished"
            assert jobs.add.enqueue(1, 2).result(timeout=30) == 3
        finally:
            proc.terminate()
            assert proc.wait(60) == 0
        assert "job=" + held.id in log.read_text()
    finally:
        server.cleanup()
