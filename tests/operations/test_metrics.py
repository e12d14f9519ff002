"""Prometheus metrics read from Valkey (what every worker did, whichever process is scraped), and
the job signals."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client

from jobqueue import Queue, conf, signals
from jobqueue.spec import JobSpec
from jobqueue.worker import Worker, WorkerConfig
from tests.jobapp import jobs
from tests.workers import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def sample(text: str, name: str, **labels: str) -> float:
    """The value of one sample in Prometheus' text format (labels in any order)."""
    for line in text.splitlines():
        match = re.fullmatch(rf"{re.escape(name)}\{{(.*)\}} (\S+)", line)
        if match and dict(re.findall(r'(\w+)="([^"]*)"', match.group(1))) == labels:
            return float(match.group(2))
    raise AssertionError(f"{name}{labels} not in\n{text}")


def test_metrics_count_states_outcomes_and_durations_from_valkey(client: Client) -> None:
    queue = Queue("default")
    queue.enqueue_many([JobSpec(i) for i in range(5)])
    queue.enqueue("later", delay=60)
    leases = queue.dequeue(count=3)
    queue.ack_many([(leases[0], 1), (leases[1], 2)])
    queue.nack(leases[2], "boom", retry_in=30)  # a failed run, retried later
    text = client.get("/metrics").content.decode()
    assert sample(text, "jobqueue_jobs", queue="default", state="pending") == 2
    assert sample(text, "jobqueue_jobs", queue="default", state="scheduled") == 2
    assert sample(text, "jobqueue_jobs_finished_total", queue="default", outcome="succeeded") == 2
    assert sample(text, "jobqueue_jobs_finished_total", queue="default", outcome="failed") == 1
    assert sample(text, "jobqueue_job_duration_seconds_count", queue="default") == 3
    assert sample(text, "jobqueue_job_duration_seconds_bucket", queue="default", le="+Inf") == 3
    assert 0 <= sample(text, "jobqueue_oldest_wait_seconds", queue="default") < 60


def test_metrics_show_expired_jobs_and_the_busiest_capped_lanes_only(client: Client,
                                                                   settings: Any) -> None:
    from tests.servers import server_ms

    settings.JOBQUEUE = {**settings.JOBQUEUE, "QUEUES": {"default": {"lane_concurrency": 3}}}
    conf.reset()
    queue = Queue("default")
    queue.enqueue_many([JobSpec(i, lane=f"tenant-{i % 12}") for i in range(12 * 4)])
    late = queue.enqueue("late", expires=0.05)
    expires = int(queue.client.hget(queue.shard(0).job(late.id), "expires_at"))
    wait_for(lambda: server_ms(queue.client) > expires)
    leases = queue.dequeue(count=100)
    queue.ack_many([(lease, None) for lease in leases if lease.payload % 12 < 2])  # 2 lanes: 0 left
    text = client.get("/metrics").content.decode()
    assert sample(text, "jobqueue_jobs_finished_total", queue="default", outcome="expired") == 1
    assert sample(text, "jobqueue_jobs", queue="default", state="expired") == 1
    reported = re.findall(r'jobqueue_lane_active\{lane="([^"]+)",queue="default"\} (\S+)', text)
    assert len(reported) == 10 and all(float(n) == 3 for _, n in reported)  # the top 10, at cap
    assert not {"tenant-0", "tenant-1"} & {lane for lane, _ in reported}


def test_metrics_show_the_global_cap_and_its_permits_held(client: Client, settings: Any) -> None:
    settings.JOBQUEUE = {**settings.JOBQUEUE, "QUEUES": {"default": {"global_concurrency": 3}}}
    conf.reset()
    queue = Queue("default")
    queue.enqueue_many([JobSpec(i) for i in range(5)])
    assert len(queue.dequeue(count=2)) == 2
    text = client.get("/metrics").content.decode()
    assert sample(text, "jobqueue_global_concurrency", queue="default") == 3
    assert sample(text, "jobqueue_global_permits", queue="default") == 2
    queue.set_global_concurrency(None)
    text = client.get("/metrics").content.decode()
    assert "jobqueue_global_concurrency{" not in text  # (a queue without a cap: no series)


def test_metrics_want_the_token_when_one_is_set(client: Client, settings: Any) -> None:
    settings.JOBQUEUE = {**settings.JOBQUEUE, "METRICS_TOKEN": "s3cret"}
    conf.reset()
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer nope").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret").status_code == 200


def test_signals_fire_on_enqueue_start_and_finish() -> None:
    seen: list[tuple[str, Any]] = []

    def enqueued(sender: Any, ref: Any, **_: Any) -> None:
        seen.append(("enqueued", ref.id))

    def started(sender: Any, lease: Any, **_: Any) -> None:
        seen.append(("started", lease.job_id))

    def finished(sender: Any, lease: Any, state: str, duration: float, **_: Any) -> None:
        seen.append(("finished", (lease.job_id, state, duration >= 0)))

    def broken(sender: Any, **_: Any) -> None:
        raise RuntimeError("a receiver's bug must not stop the job")

    receivers = [(signals.job_enqueued, enqueued), (signals.job_started, started),
                 (signals.job_finished, finished), (signals.job_finished, broken)]
    for signal, receiver in receivers:
        signal.connect(receiver)
    try:
        ref = jobs.add.using(immediate=True).enqueue(20, 22)
        again = jobs.add.using(immediate=True, unique_key="k").enqueue(1, 1)
        jobs.add.using(immediate=True, unique_key="k").enqueue(1, 1)  # the same job: no signal
        Worker(WorkerConfig(queues=("default",), burst=True, mirror=False)).run()
    finally:
        for signal, receiver in receivers:
            signal.disconnect(receiver)
    assert seen.count(("enqueued", ref.id)) == 1 and seen.count(("enqueued", again.id)) == 1
    assert len([s for s in seen if s[0] == "enqueued"]) == 2
    assert ("started", ref.id) in seen and ("finished", (ref.id, "succeeded", True)) in seen
    assert seen.index(("started", ref.id)) < seen.index(("finished", (ref.id, "succeeded", True)))


def test_job_finished_says_cancelled_for_a_run_an_operator_cancelled_that_then_returned(
        tmp_path: Any) -> None:
    """A handler that ignores the cancel flag and returns: its ack records it cancelled, and
    the signal says so (not "succeeded")."""
    import threading

    seen: list[tuple[str, str]] = []

    def finished(sender: Any, lease: Any, state: str, **_: Any) -> None:
        seen.append((lease.job_id, state))

    gate = tmp_path / "go"
    ref = jobs.reports_then_waits.enqueue("working", str(gate))
    plain = jobs.add.enqueue(1, 2)
    worker = Worker(WorkerConfig(queues=("default",), burst=True, mirror=False))
    signals.job_finished.connect(finished)
    running = threading.Thread(target=worker.run)
    running.start()
    try:
        wait_for(lambda: (info := Queue("default").get(ref.id)) is not None
                 and info.progress == "working")
        assert Queue("default").cancel(ref.id) == "active"  # flagged: it ignores the flag
        gate.touch()
        running.join(30)
    finally:
        gate.touch()
        running.join(30)
        signals.job_finished.disconnect(finished)
    assert Queue("default").get(ref.id).state == "cancelled"  # type: ignore[union-attr]
    assert sorted(seen) == sorted([(ref.id, "cancelled"), (plain.id, "succeeded")])
