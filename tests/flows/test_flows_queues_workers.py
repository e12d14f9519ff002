"""Flows across queues through real `runworker` processes, one per queue: each job runs on its
queue's worker; a chord whose members are on one queue and whose callback is on another calls
back once with every result in order, though the workers of both queues are SIGKILLed and
started anew while it runs (on one Valkey, and on a 3-primary cluster)."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from jobqueue import Queue, chain, chord, flows
from tests.flows.test_flows_workers import _client
from tests.jobapp import jobs
from tests.workers import start_worker, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
QUEUES = {"work": {"shards": 4}, "report": {"shards": 2}}
MEMBERS = 300


@pytest.fixture
def two_queues(valkey_url: str, settings: Any) -> str:
    """`work` (4 shards) and `report` (2) next to the `valkey_url` fixture's queues."""
    from jobqueue import conf

    settings.JOBQUEUE = {**settings.JOBQUEUE, "QUEUES": {**settings.JOBQUEUE["QUEUES"], **QUEUES}}
    conf.reset()
    effects = _client(valkey_url)
    effects.delete("chord:runs")
    effects.close()
    return valkey_url


def worker(url: str, queue: str, log: Path) -> Any:
    return start_worker(
        url,
        "--queues",
        queue,
        "--concurrency",
        "4",
        log=log,
        env={"JOBQUEUE_TEST_QUEUES": json.dumps(QUEUES)},
    )


def test_each_job_of_a_chain_across_queues_runs_on_its_queues_worker(two_queues: str, tmp_path: Path) -> None:
    ref = chain(
        jobs.add.using(queue="work").s(2, 3),
        jobs.mul.using(queue="report").s(4),
        jobs.mul.using(queue="work").s(10),
    ).enqueue()
    log = tmp_path / "workers.log"
    procs = [worker(two_queues, "work", log), worker(two_queues, "report", log)]
    try:
        assert ref.result(timeout=60) == 200
        assert [(info.queue, info.worker.split(":")[0] != "") for info in flows.members(ref.id, "work")] == [
            ("work", True),
            ("report", True),
            ("work", True),
        ]
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)


def test_a_chord_across_queues_calls_back_once_in_order_though_workers_are_killed(
    two_queues: str, tmp_path: Path
) -> None:
    url, effects = two_queues, _client(two_queues)
    header = [jobs.square_slowly.using(queue="work", lease=1).s(i, 0.01) for i in range(MEMBERS)]
    ref = chord(header, jobs.record_chord.using(queue="report", lease=1).s(url)).enqueue()
    assert ref.queue == "report"
    work, log = Queue("work"), tmp_path / "workers.log"
    procs = {
        "work": [worker(url, "work", log), worker(url, "work", log)],
        "report": [worker(url, "report", log)],
    }
    try:
        for share, name in ((MEMBERS // 3, "work"), (2 * MEMBERS // 3, "report")):
            wait_for(lambda share=share: work.counts()["succeeded"] >= share, timeout=120)
            victim = procs[name].pop(0)  # a worker of each queue, killed mid-run, started anew
            victim.send_signal(signal.SIGKILL)
            victim.wait(30)
            procs[name].append(worker(url, name, log))
        assert ref.result(timeout=180) == MEMBERS
        runs = effects.lrange("chord:runs", 0, -1)
        assert len(runs) == 1 and json.loads(runs[0]) == [i * i for i in range(MEMBERS)]
        assert Queue("report").get(ref.id).worker  # type: ignore[union-attr]
    finally:
        for proc in (p for group in procs.values() for p in group):
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
        effects.close()
