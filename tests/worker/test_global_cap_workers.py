"""The global cap with real `runworker` processes: a 4-shard queue capped at 3 and served by two
workers at concurrency 8 runs 3 at once and never more; a killed worker's permits come back within
1.5 leases; a cap lowered live holds. Each job counts itself in Valkey while it runs
(`tests.jobapp.jobs.tallied`), so "at once" is across both processes."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from jobqueue import Queue
from jobqueue.keys import cap_keys
from tests.jobapp import jobs
from tests.servers import server_ms
from tests.workers import serving, start_worker, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

LEASE = 2
QUEUES = {"capped": {"shards": 4, "global_concurrency": 3, "lease": LEASE}}
"""The queue the workers serve (passed to their settings too)."""


@pytest.fixture(params=["standalone", "cluster"])
def url(request: pytest.FixtureRequest, settings: Any) -> str:
    """The Valkey the test and its workers use, with the `capped` queue configured."""
    return serving(request, settings, QUEUES)


def workers(url: str, n: int) -> list[subprocess.Popen[bytes]]:
    return [start_worker(url, "--queues", "capped", "--concurrency", "8",
                         env={"JOBQUEUE_TEST_QUEUES": json.dumps(QUEUES)}) for _ in range(n)]


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    assert [proc.wait(30) for proc in procs] == [0] * len(procs)


def tallied(tally: str, n: int, seconds: float, hold_first: str = "") -> list[str]:
    return [ref.id for ref in jobs.tallied.using(queue="capped")
            .enqueue_many([(tally, seconds, hold_first)] * n)]


def count(queue: Queue, tally: str, what: str) -> int:
    return int(queue.client.get(f"{{{tally}}}:{what}") or 0)


def succeeded(queue: Queue, ids: list[str]) -> bool:
    return all((info := queue.get(i)) is not None and info.state == "succeeded" for i in ids)


def test_two_workers_on_four_shards_run_as_many_as_the_cap_at_once_and_never_more(url: str) -> None:
    queue = Queue("capped")
    ids = tallied("t1", 30, 0.3)
    assert len({queue.locate(i) for i in ids}) == 4  # (spread over every shard)
    procs = workers(url, 2)
    try:
        wait_for(lambda: succeeded(queue, ids), timeout=120)
    finally:
        stop(procs)
    assert count(queue, "t1", "peak") == 3
    assert count(queue, "t1", "running") == 0
    assert queue.client.hget(cap_keys("capped").key("permits"), "") in (None, "0")  # all back


def test_a_killed_workers_permits_come_back_within_half_a_lease_after_its_leases(
        url: str, tmp_path: Path) -> None:
    queue = Queue("capped")
    held = tallied("t2", 3, 0.2, hold_first=str(tmp_path / "never"))
    [victim] = workers(url, 1)
    wait_for(lambda: count(queue, "t2", "held") == 3, timeout=60)
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    killed_at = server_ms(queue.client)
    [(_, deadline)] = queue.client.zrange(cap_keys("capped").key("holders"), 0, -1,
                                          withscores=True)
    assert deadline <= killed_at + LEASE * 1500  # its permits lapse within 1.5 leases
    more = tallied("t2", 9, 0.3)
    procs = workers(url, 1)
    try:  # the dead worker's three permits are the whole cap: nothing ran until they lapsed
        wait_for(lambda: succeeded(queue, held + more), timeout=120)
    finally:
        stop(procs)
    assert count(queue, "t2", "peak") == 3  # all three slots came back
    assert all(queue.get(i).attempts == 2 for i in held)  # type: ignore[union-attr]


def test_a_cap_lowered_live_to_one_holds(url: str) -> None:
    queue = Queue("capped")
    ids = tallied("t3", 40, 0.2)
    procs = workers(url, 2)
    try:
        wait_for(lambda: count(queue, "t3", "peak") == 3, timeout=60)
        queue.set_global_concurrency(1)
        wait_for(lambda: count(queue, "t3", "running") <= 1, timeout=30)
        queue.client.set("{t3}:peak", count(queue, "t3", "running"))  # counted afresh from here
        wait_for(lambda: succeeded(queue, ids), timeout=120)
    finally:
        stop(procs)
    assert count(queue, "t3", "peak") == 1


def test_a_run_overrunning_its_timeout_keeps_its_permit_until_its_thread_returns(
        url: str, tmp_path: Path) -> None:
    """Three runs pass their timeout on threads that cannot be stopped (recorded failed, retried
    at once): the cap of 3 still counts their threads, so no retry starts until they return."""
    from jobqueue import get_job
    lates = [tmp_path / f"late{i}" for i in range(3)]
    refs = [jobs.overruns_first_attempt.using(queue="capped", timeout=0.5, max_attempts=2)
            .enqueue(str(late), 3) for late in lates]
    procs = workers(url, 1)
    try:
        wait_for(lambda: all(late.exists() for late in lates)
                 and all(getattr(get_job(ref.id), "state", "") == "succeeded" for ref in refs),
                 timeout=60)
    finally:
        stop(procs)
    returned = min(late.stat().st_mtime for late in lates)
    for ref in refs:
        info = get_job(ref.id)
        assert info is not None and info.attempts == 2 and info.started_at is not None
        assert info.started_at.timestamp() >= returned - 0.05, "a retry ran beside the overrun"
