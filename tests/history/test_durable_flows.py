"""Flows on a durable queue: each job's row keeps its place in the flow, so a restore after
Valkey lost its data (and the relay of rows that never reached Valkey) brings the flow back,
a waiting job waiting only for what has not finished."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis
from django.db import transaction

from jobqueue import Queue, chain, chord, flows, get_job
from jobqueue.exceptions import InvalidFlow
from jobqueue.history.mirror import Mirror
from jobqueue.models import Job
from jobqueue.worker.executor import execute
from tests.jobapp import jobs
from tests.servers import ValkeyProcess
from tests.workers import manage, run_burst

pytestmark = pytest.mark.django_db(transaction=True)
MEMBERS = 10
FAILING = 3
"""The member of the chord that fails (its policy: "ignore")."""


@pytest.fixture(autouse=True)
def _durable_queue(settings: Any) -> None:
    settings.JOBQUEUE = {**settings.JOBQUEUE, "QUEUES": {"default": {}, "durable": {"durable": True}}}


def _chord(effects_url: str) -> Any:
    """A chord on the durable queue: squares, one member that fails under "ignore", and a
    callback that records each run with the results it got."""
    header = [jobs.square_slowly.using(queue="durable").s(i, 0) for i in range(MEMBERS)]
    header[FAILING] = jobs.fails_with.using(queue="durable", on_failure="ignore").s("boom")
    return chord(header, jobs.record_chord.using(queue="durable").s(effects_url)).enqueue()


def _run(queue: Queue, count: int) -> list[str]:
    """Claim and run up to `count` ready jobs, recording each outcome as a worker would."""
    ran = []
    for lease in queue.dequeue(count=count):
        outcome = execute(lease)
        if outcome.ok:
            queue.ack_encoded([(lease, outcome.result)])
        else:
            queue.nack(lease, outcome.error, outcome.retry_in, fatal=True)
        ran.append(lease.job_id)
    return ran


def _runs(url: str) -> list[Any]:
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        return [json.loads(run) for run in client.lrange("chord:runs", 0, -1)]
    finally:
        client.close()


def _expected() -> list[Any]:
    return [i * i for i in range(MEMBERS)]


def test_a_durable_flow_writes_each_jobs_place_in_its_row() -> None:
    with transaction.atomic():
        ref = _chord("redis://127.0.0.1:1/0")
        callback = Job.objects.get(pk=ref.id)
        assert callback.state == "waiting" and callback.flow["takes"] == "list"
        assert [m[1] for m in callback.flow["members"]] == list(range(MEMBERS))
        assert Queue("durable").get(ref.id) is None  # Valkey gets it at the commit
    assert Queue("durable").get(ref.id).state == "waiting"  # type: ignore[union-attr]
    rows = Job.objects.filter(flow__isnull=False)
    assert rows.count() == MEMBERS + 1 and len({row.shard for row in rows}) == 1
    with pytest.raises(InvalidFlow, match="no job JOB0000000000a in durable queue"):
        jobs.add.using(queue="durable", depends_on=["JOB0000000000a"]).enqueue(1, 2)


@pytest.mark.slow
def test_restore_brings_back_a_chord_waiting_only_for_what_had_not_finished(
        valkey_server: ValkeyProcess) -> None:
    url = valkey_server.url
    ref = _chord(url)
    queue = Queue("durable")
    ran = _run(queue, 5)  # the first five members (mint order), the failing one among them
    assert Mirror([queue], "test").step() == 5
    assert Job.objects.get(pk=ran[FAILING]).state == "dead"
    redis.Redis.from_url(url).flushall()  # Valkey lost its data
    done = manage("jobqueue", "restore", url=url)
    assert done.returncode == 0 and f"restored {MEMBERS - 5 + 1} job(s)" in done.stdout, done.stderr
    assert "restored 0 job(s)" in manage("jobqueue", "restore", url=url).stdout
    info = get_job(ref.id, queue="durable")
    assert info is not None and info.state == "waiting" and info.source == "valkey"
    left = Job.objects.filter(flow__isnull=False, state="pending").values_list("pk", flat=True)
    assert flows.waits_for(info) == sorted(left) and len(left) == MEMBERS - 5
    late = jobs.add.using(queue="durable", depends_on=[ran[0]]).enqueue(1, 1)  # gone from Valkey
    assert queue.get(late.id).state == "pending"  # type: ignore[union-attr]  # it had succeeded
    assert run_burst(url, "--queues", "durable") == 0
    [run] = _runs(url)
    assert run[:FAILING] + run[FAILING + 1:] == _expected()[:FAILING] + _expected()[FAILING + 1:]
    assert run[FAILING]["state"] == "dead" and "boom" in run[FAILING]["error"]
    assert Job.objects.get(pk=ref.id).state == "succeeded"
    assert Job.objects.get(pk=late.id).result == 2


@pytest.mark.slow
def test_a_durable_flow_sent_while_valkey_was_down_is_resent(settings: Any,
                                                             valkey_server: ValkeyProcess) -> None:
    server = ValkeyProcess().start()
    try:
        settings.JOBQUEUE = {**settings.JOBQUEUE, "URL": server.url}
        first = jobs.add.using(queue="durable").enqueue(1, 1)
        server.stop(kill=True)  # Valkey goes down before the commit
        with transaction.atomic():
            ref = _chord(valkey_server.url)
            after = jobs.add.using(queue="durable", depends_on=[first, ref]).enqueue(2, 2)
        assert Job.objects.filter(relayed=False, flow__isnull=False).count() == MEMBERS + 2
        server.start()  # back, with what its append-only file kept (the first job)
        assert Queue("durable").get(ref.id) is None
        assert run_burst(server.url, "--queues", "durable") == 0
        [run] = _runs(valkey_server.url)
        assert run[:FAILING] == _expected()[:FAILING] and run[FAILING]["state"] == "dead"
        assert Job.objects.get(pk=ref.id).result == MEMBERS
        assert Job.objects.get(pk=after.id).state == "succeeded"
        assert not Job.objects.filter(relayed=False).exists()
    finally:
        server.cleanup()


def test_an_operator_retry_recreates_durable_flow_jobs_valkey_no_longer_holds(
        valkey_server: ValkeyProcess) -> None:
    from jobqueue.console.actions import retry_job

    queue = Queue("durable")
    ref = chain(jobs.add.using(queue="durable").s(1, 2), jobs.mul.using(queue="durable").s(10)).enqueue()
    [first] = queue.dequeue(count=1)
    queue.nack(first, "worker lost", fatal=True)  # dead: the next step ends cancelled
    assert Mirror([queue], "test").step() == 2
    redis.Redis.from_url(valkey_server.url).flushall()  # their Valkey rows are gone
    retry_job(queue, first.job_id)
    retry_job(queue, ref.id)
    assert queue.get(ref.id).state == "waiting"  # type: ignore[union-attr]
    assert flows.waits_for(queue.get(ref.id)) == [first.job_id]  # type: ignore[arg-type]
    assert _run(queue, 5) == [first.job_id] and _run(queue, 5) == [ref.id]
    assert ref.result(timeout=5) == 30
