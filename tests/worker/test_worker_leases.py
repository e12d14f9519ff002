"""A lease that lapses under a real worker (its process stopped longer than the lease, so no
heartbeat renews it) and the job claimed again by the same worker: both runs are held, renewed,
recorded and forgotten each by its own token."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from jobqueue import Queue, conf
from tests.jobapp import jobs
from tests.servers import ValkeyProcess
from tests.workers import start_worker, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
PAIR = {"pair": {"concurrency": 2}}


def server_ms(queue: Queue) -> int:
    seconds, micros = queue.client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def test_a_run_whose_lease_lapsed_and_its_rerun_are_held_apart(
        valkey_server: ValkeyProcess, settings: Any, tmp_path: Path) -> None:
    settings.JOBQUEUE = {"URL": valkey_server.url, "QUEUES": {"default": {}, **PAIR}}
    conf.reset()
    queue, log = Queue("pair"), tmp_path / "worker.log"
    job = jobs.held_per_attempt.using(queue="pair", lease=1).enqueue(str(tmp_path / "j"))
    proc = start_worker(valkey_server.url, "--queues", "pair", "--concurrency", "2",
                        "--no-mirror", log=log, env={"JOBQUEUE_TEST_QUEUES": json.dumps(PAIR)})
    try:
        row = lambda: queue.client.hgetall(queue.shard(0).job(job.id))  # noqa: E731
        wait_for(lambda: row().get("progress") == "1", timeout=60)
        proc.send_signal(signal.SIGSTOP)  # no heartbeat: the first run's lease lapses
        try:
            wait_for(lambda: queue.reap() == 1)
        finally:
            proc.send_signal(signal.SIGCONT)
        wait_for(lambda: row().get("progress") == "2")  # claimed again by the same worker
        (tmp_path / "j.1").touch()  # the first run ends, late: its outcome is refused
        wait_for(lambda: "attempt=1" in log.read_text() and "outcome=stale" in log.read_text())
        # The second run's lease is still renewed: it reaches two leases past this moment
        # with the same token (not reaped and claimed a third time).
        later = server_ms(queue) + 2000
        wait_for(lambda: int(row().get("lease_until") or 0) > later or row()["attempts"] != "2")
        assert row()["attempts"] == "2" and row()["state"] == "active"
        (tmp_path / "j.2").touch()
        assert job.result(timeout=30) == 2
        # Each run was forgotten by its own token: the queue's `concurrency: 2` still lets this
        # worker hold two of its jobs at once.
        both = [jobs.held_per_attempt.using(queue="pair").enqueue(str(tmp_path / name))
                for name in ("a", "b")]
        wait_for(lambda: all(queue.client.hget(queue.shard(0).job(ref.id), "progress") == "1"
                             for ref in both))
        for name in ("a", "b"):
            (tmp_path / f"{name}.1").touch()  # (each fails its first run, and runs again)
            (tmp_path / f"{name}.2").touch()
        assert [ref.result(timeout=30) for ref in both] == [2, 2]
    finally:
        proc.send_signal(signal.SIGCONT)
        proc.terminate()
        proc.wait(60)


def test_a_job_whose_lease_is_shorter_than_the_workers_own_is_renewed_in_time(
        valkey_server: ValkeyProcess) -> None:
    """The heartbeat planned its wait for the worker's lease (30 s: a renewal every 10 s) when
    a job with a lease of its own, shorter, is claimed: it renews that one in time too."""
    ref = jobs.sleep.using(lease=0.6).enqueue(2.5)
    proc = start_worker(valkey_server.url, "--concurrency", "1", "--no-mirror")
    queue, reaped = Queue("default"), 0
    try:
        wait_for(lambda: queue.get(ref.id).state == "active", timeout=60)  # type: ignore[union-attr]

        def reap_until_done() -> bool:
            nonlocal reaped
            reaped += queue.reap()
            return queue.get(ref.id).state != "active"  # type: ignore[union-attr]

        wait_for(reap_until_done, every=0.05)
    finally:
        proc.terminate()
        proc.wait(60)
    info = queue.get(ref.id)
    assert reaped == 0 and info is not None and info.state == "succeeded" and info.attempts == 1


def test_a_job_joining_with_a_shorter_lease_never_puts_off_the_renewal_of_those_held(
        valkey_server: ValkeyProcess, settings: Any) -> None:
    # A job held with a 3 s lease is due its renewal 1 s after the heartbeat planned it. Jobs
    # that join with ever shorter leases bring the renewal forward when theirs would lapse
    # first, and never push it back: each join before it is due would otherwise put it off.
    import threading

    from jobqueue.worker.heartbeat import Heartbeat
    from jobqueue.worker.serving import HeldJobs

    settings.JOBQUEUE = {**settings.JOBQUEUE, "URL": valkey_server.url}
    queue = Queue("default")
    refs = [jobs.add.using(lease=seconds).enqueue(1, 1) for seconds in (3.0, 2.9, 2.8, 0.6)]
    leases = {lease.job_id: lease for lease in queue.dequeue(count=4, worker="w-1")}
    first, *joining = (leases[ref.id] for ref in refs)
    held = HeldJobs(capacity=8, concurrency=4)
    heartbeat = Heartbeat(held, lambda name: queue, threading.Event(), default_lease=30.0)
    assert heartbeat.plan(now=0.0) == 10.0  # (nothing held: the worker's own lease)
    held.add([first])
    assert held.sooner.is_set()  # (the wait planned for 30 s must be planned again)
    held.sooner.clear()
    assert heartbeat.plan(now=0.0) == pytest.approx(1.0)
    now = 0.0
    for lease in joining[:2]:  # (2.9 s at 0.3, 2.8 s at 0.6: due later than the first's)
        now += 0.3
        held.add([lease])
        assert held.sooner.is_set()
        held.sooner.clear()
        assert heartbeat.plan(now=now) == pytest.approx(1.0)
    held.add([joining[2]])  # (0.6 s at 0.7: its renewal is due before the one planned)
    assert heartbeat.plan(now=0.7) == pytest.approx(0.9)
    heartbeat.renew()  # (made at 0.9: the next one is planned afresh)
    assert heartbeat.plan(now=0.9) == pytest.approx(1.1)
    for lease in leases.values():
        assert queue.ack(lease, "2")
