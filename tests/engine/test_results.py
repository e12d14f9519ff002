"""Waiting for a job's result without polling (`JobRef.result`, `aresult`), and its bridges:
django.tasks' `TaskResult.refresh` / `aget_result`, Celery's `.delay(...).get()`."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster

from jobqueue import JobRef, Queue, get_job
from jobqueue.exceptions import JobFailed, JobNotFound
from jobqueue.history.mirror import Mirror
from jobqueue.models import Job
from tests.jobapp import celery_tasks, jobs
from tests.servers import ValkeyProcess
from tests.workers import run_burst, start_worker, wait_for


def finish_later(queue: Queue, fail: bool = False, cancel: str | None = None) -> threading.Thread:
    """A thread that claims one job once a waiter is counted on it, then records its outcome."""
    def run() -> None:
        wait_for(lambda: _awaited(queue), timeout=10)
        if cancel:
            queue.cancel(cancel)
            return
        [lease] = queue.dequeue(count=1)
        if fail:
            queue.nack(lease, "it broke", fatal=True)
        else:
            queue.ack(lease, {"answer": 42})

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _awaited(queue: Queue) -> bool:
    """Whether some caller is counted as waiting on a job of `queue` (the row's `notify`)."""
    client = queue.client
    for index in range(queue.all_shards()):
        for key in _keys(client, queue.shard(index).key("job:*")):
            if client.hget(key, "notify"):
                return True
    return False


def _keys(client: Any, pattern: str) -> list[str]:
    if isinstance(client, RedisCluster):
        return list(client.scan_iter(pattern, target_nodes=RedisCluster.PRIMARIES))
    return list(client.scan_iter(pattern))


@pytest.mark.parametrize("queue_name", ["default", "wide"])
def test_result_wakes_when_the_job_finishes(valkey_url: str, queue_name: str) -> None:
    ref = jobs.add.using(queue=queue_name).enqueue(1, 2)
    thread = finish_later(Queue(queue_name))
    assert ref.result(timeout=20) == {"answer": 42}
    thread.join()
    assert ref.result(timeout=0) == {"answer": 42}  # finished: answered at once, no wait


def test_result_raises_job_failed_for_dead_and_cancelled_jobs(valkey_url: str) -> None:
    dead = jobs.add.enqueue(1, 2)
    thread = finish_later(Queue("default"), fail=True)
    with pytest.raises(JobFailed) as failed:
        dead.result(timeout=20)
    thread.join()
    assert failed.value.state == "dead" and "it broke" in failed.value.error
    cancelled = jobs.add.enqueue(1, 2)
    thread = finish_later(Queue("default"), cancel=cancelled.id)
    with pytest.raises(JobFailed) as failed:
        cancelled.result(timeout=20)
    thread.join()
    assert failed.value.state == "cancelled"


def test_result_times_out_and_leaves_nothing_behind(valkey_url: str) -> None:
    ref = jobs.add.enqueue(1, 2)
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        ref.result(timeout=0.2)
    assert time.monotonic() - started >= 0.2
    queue = Queue("default")
    [lease] = queue.dequeue(count=1)
    assert queue.ack(lease, 3)
    assert ref.result(timeout=5) == 3


def test_aresult_waits_on_the_event_loop(valkey_url: str) -> None:
    ref = jobs.add.enqueue(1, 2)

    async def main() -> tuple[Any, int]:
        ticks = 0

        async def tick() -> None:  # the loop stays free while the result is awaited
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        ticker = asyncio.create_task(tick())
        thread = finish_later(Queue("default"))
        result = await ref.aresult(timeout=20)
        ticker.cancel()
        await asyncio.to_thread(thread.join)
        return result, ticks

    result, ticks = asyncio.run(main())
    assert result == {"answer": 42} and ticks > 0

    async def failed() -> None:
        dead = jobs.add.enqueue(1, 2)
        thread = finish_later(Queue("default"), fail=True)
        try:
            with pytest.raises(JobFailed):
                await dead.aresult(timeout=20)
        finally:
            await asyncio.to_thread(thread.join)
        with pytest.raises(TimeoutError):
            await jobs.add.enqueue(1, 1).aresult(timeout=0.1)

    asyncio.run(failed())


def test_aresult_loads_its_script_again_after_the_server_forgot_it(valkey_url: str) -> None:
    """A restarted (or flushed) server has no scripts: the async waiter loads the watch script
    and calls it by its SHA again."""
    ref = jobs.add.enqueue(2, 3)
    client = Queue("default").client
    [lease] = Queue("default").dequeue(count=1)
    Queue("default").ack(lease, 5)
    client.script_flush()  # (on a cluster: every primary)
    assert asyncio.run(ref.aresult(timeout=5)) == 5


def test_an_ack_nobody_waits_for_pushes_nothing(valkey_server: ValkeyProcess) -> None:
    """A finish pushes a wake token only when a caller is counted on the job: an ack of a job
    nobody awaits runs no command more than before (no RPUSH, no notify list)."""
    client = redis.Redis.from_url(valkey_server.url, decode_responses=True)
    queue = Queue("default")
    jobs.add.enqueue(1, 2)
    [lease] = queue.dequeue(count=1)
    client.config_resetstat()
    assert queue.ack(lease, 3)
    stats = client.info("commandstats")
    assert "cmdstat_rpush" not in stats and not list(client.scan_iter("*notify*"))
    assert "cmdstat_pexpire" in stats  # (the row's retention: the stats do count script calls)


@pytest.mark.django_db(transaction=True)
def test_a_job_valkey_no_longer_holds_is_answered_from_the_mirror(valkey_server: ValkeyProcess) -> None:
    queue = Queue("default")
    ok, dead = jobs.add.enqueue(1, 2), jobs.add.enqueue(2, 2)
    for lease, fail in zip(queue.dequeue(count=2), (False, True), strict=True):
        if fail:
            queue.nack(lease, "gone wrong", fatal=True)
        else:
            queue.ack(lease, 3)
    Mirror([queue], "test").step()
    queue.client.delete(queue.shard(0).job(ok.id), queue.shard(0).job(dead.id))
    assert ok.result(timeout=1) == 3
    with pytest.raises(JobFailed, match="gone wrong"):
        dead.result(timeout=1)
    with pytest.raises(JobNotFound):
        JobRef("JOB0000000000a", "default").result(timeout=1)
    assert asyncio.run(ok.aresult(timeout=1)) == 3
    assert Job.objects.get(pk=ok.id).result == 3


def past_expiry(queue: Queue, job_id: str) -> bool:
    """Whether the server's clock has passed the job's `expires_at`."""
    seconds, micros = queue.client.time()
    expires = queue.client.hget(queue.shard(0).job(job_id), "expires_at")
    return int(seconds) * 1000 + int(micros) // 1000 > int(expires)


@pytest.mark.django_db(transaction=True)
def test_an_expired_job_valkey_no_longer_holds_is_answered_from_the_mirror(
        valkey_server: ValkeyProcess) -> None:
    queue = Queue("default")
    ref = jobs.add.using(expires=0.05).enqueue(1, 2)
    wait_for(lambda: past_expiry(queue, ref.id))
    assert queue.dequeue(count=1) == []  # (the claim ends it expired)
    with pytest.raises(JobFailed, match="expired"):
        ref.result(timeout=1)
    Mirror([queue], "test").step()
    queue.client.delete(queue.shard(0).job(ref.id))
    with pytest.raises(JobFailed, match="expired") as failed:
        ref.result(timeout=1)
    assert failed.value.state == "expired"
    with pytest.raises(JobFailed, match="expired"):
        asyncio.run(ref.aresult(timeout=1))


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_result_from_a_real_worker_and_get_job_still_answers(valkey_server: ValkeyProcess,
                                                            tmp_path: Any) -> None:
    proc = start_worker(valkey_server.url, "--concurrency", "2", log=tmp_path / "worker.log")
    try:
        ref = jobs.add.enqueue(20, 22)
        assert ref.result(timeout=60) == 42
        info = get_job(ref.id)
        assert info is not None and info.result == 42 and info.state == "succeeded"
        with pytest.raises(JobFailed) as failed:
            jobs.fails_with.enqueue("nope").result(timeout=60)
        assert failed.value.state == "dead" and "nope" in str(failed.value)
        assert asyncio.run(jobs.add.enqueue(1, 1).aresult(timeout=60)) == 2
    finally:
        proc.terminate()
        proc.wait(60)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_celery_delay_get_and_django_tasks_results(settings: Any,
                                                   valkey_server: ValkeyProcess) -> None:
    from celery.exceptions import TimeoutError as CeleryTimeoutError

    from tests.jobapp import django_tasks

    settings.TASKS = {"default": {"BACKEND": "jobqueue.tasks.ValkeyBackend"}}
    res = celery_tasks.shout.delay("hi")
    with pytest.raises(CeleryTimeoutError):
        res.get(timeout=0.1)
    assert res.state == "PENDING" and not res.ready()
    task = django_tasks.multiply.enqueue(6, 7)
    assert run_burst(valkey_server.url) == 0
    assert res.get(timeout=10) == "HI!" and res.state == "SUCCESS" and res.result == "HI!"
    task.refresh()
    assert task.return_value == 42
    fetched = asyncio.run(django_tasks.multiply.aget_result(task.id))
    assert fetched.return_value == 42
