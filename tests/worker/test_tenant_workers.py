"""Tenant controls with real `runworker` processes: a lane's cap holds across workers, a killed
worker's slots come back, debounce runs once with the last arguments, an expired job never runs."""

from __future__ import annotations

import json
import signal
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from jobqueue import Queue
from jobqueue.api.registry import get_job
from jobqueue.models import Job
from tests.jobapp import jobs
from tests.servers import server_ms
from tests.workers import serving, start_worker, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

QUEUES = {"tenants": {"lane_concurrency": 2, "lease": 2}}
"""The queue the workers serve (passed to their settings too)."""


@pytest.fixture(params=["standalone", "cluster"])
def url(request: pytest.FixtureRequest, settings: Any) -> str:
    """The Valkey the test and its workers use, with the `tenants` queue configured."""
    return serving(request, settings, QUEUES)


def workers(url: str, n: int, *args: str) -> list[subprocess.Popen[bytes]]:
    return [start_worker(url, "--queues", "tenants", "--concurrency", "8", *args,
                         env={"JOBQUEUE_TEST_QUEUES": json.dumps(QUEUES)}) for _ in range(n)]


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    assert [proc.wait(30) for proc in procs] == [0] * len(procs)


def active_by_lane(queue: Queue) -> Counter[str]:
    """The lanes of the jobs active at one instant (one read of the active set)."""
    ids = queue.client.zrange(queue.shard(0).key("active"), 0, -1)
    pipe = queue.client.pipeline(transaction=False)
    for job_id in ids:
        pipe.hget(queue.shard(0).job(job_id), "lane")
    return Counter(pipe.execute())


def succeeded(queue: Queue, ids: list[str]) -> bool:
    return all((info := queue.get(i)) is not None and info.state == "succeeded" for i in ids)


def test_four_workers_never_run_more_of_a_lane_than_its_cap_and_other_lanes_go_on(url: str) -> None:
    queue = Queue("tenants")
    flood = [r.id for r in jobs.sleep.using(queue="tenants", lane="flood").enqueue_many([(0.2,)] * 40)]
    small = [r.id for lane in ("t1", "t2", "t3", "t4", "t5")
             for r in jobs.sleep.using(queue="tenants", lane=lane).enqueue_many([(0.2,)] * 4)]
    peak: Counter[str] = Counter()
    widest = 0

    def sampled(done: list[str]) -> bool:
        nonlocal widest
        now = active_by_lane(queue)
        for lane, n in now.items():
            peak[lane] = max(peak[lane], n)
        widest = max(widest, len(now))
        return succeeded(queue, done)

    procs = workers(url, 4)
    try:
        wait_for(lambda: sampled(small), timeout=60, every=0.01)
        assert not succeeded(queue, flood)  # the small lanes were served beside the flood
        wait_for(lambda: sampled(flood), timeout=120, every=0.01)
    finally:
        stop(procs)
    assert peak["flood"] == 2 and max(peak.values()) == 2, peak  # never above the cap
    assert widest >= 3  # other lanes ran beside the flood in the free slots
    assert queue.client.hgetall(queue.shard(0).key("slots")) == {}  # every slot came back
    assert queue.client.scard(queue.shard(0).key("capped")) == 0


def test_a_killed_workers_slots_come_back_when_its_leases_expire(url: str, tmp_path: Path) -> None:
    queue = Queue("tenants")
    never = str(tmp_path / "never")  # (no file: the first attempts run until the kill)
    held = [r.id for r in jobs.hangs_on_first_attempt.using(queue="tenants", lane="a")
            .enqueue_many([(never,)] * 2)]
    [victim] = workers(url, 1)
    wait_for(lambda: queue.client.hget(queue.shard(0).key("slots"), "a") == "2")
    more = [r.id for r in jobs.sleep.using(queue="tenants", lane="a").enqueue_many([(0.05,)] * 4)]
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    assert queue.client.hget(queue.shard(0).key("slots"), "a") == "2"  # held by the dead worker
    procs = workers(url, 1)
    try:  # its reaper frees them once the leases (2 s) end, and the lane goes on
        wait_for(lambda: succeeded(queue, held + more), timeout=60)
    finally:
        stop(procs)
    assert all(queue.get(i).attempts == 2 for i in held)  # type: ignore[union-attr]
    assert queue.client.hgetall(queue.shard(0).key("slots")) == {}


def test_a_hundred_debounced_enqueues_run_once_with_the_last_arguments(url: str) -> None:
    procs = workers(url, 1)
    try:
        refs = [jobs.add.using(queue="tenants", unique_key="reindex-42", debounce=2).enqueue(i, 1000)
                for i in range(100)]
        assert {r.id for r in refs} == {refs[0].id} and [r.created for r in refs].count(True) == 1
        wait_for(lambda: (info := get_job(refs[0].id, "tenants")) is not None
                 and info.state == "succeeded", timeout=60)
    finally:
        stop(procs)
    info = get_job(refs[0].id, "tenants")
    assert info and info.result == 1099 and info.attempts == 1
    assert Queue("tenants").counts()["succeeded"] == 1


def test_an_expired_job_never_runs_however_long_the_queue_was_paused(url: str) -> None:
    queue = Queue("tenants")
    queue.pause()
    late = jobs.add.using(queue="tenants", expires=0.5).enqueue(1, 1)
    procs = workers(url, 1)
    try:
        expires = int(queue.client.hget(queue.shard(0).job(late.id), "expires_at"))
        wait_for(lambda: server_ms(queue.client) > expires)
        queue.resume()
        fine = jobs.add.using(queue="tenants").enqueue(2, 2)  # the worker does serve the queue
        wait_for(lambda: (info := queue.get(fine.id)) is not None and info.state == "succeeded")
        wait_for(lambda: Job.objects.filter(pk=late.id, state="expired").exists())  # mirrored
    finally:
        stop(procs)
    info = queue.get(late.id)
    assert info and info.state == "expired" and info.attempts == 0 and info.result is None
    assert queue.counts()["expired"] == 1
