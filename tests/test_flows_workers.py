"""Flows through real `runworker` processes: a chord whose workers are SIGKILLed and restarted
while it runs calls back once, with every result in order."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster

from jobqueue import Queue, chord
from tests.jobapp import jobs

from .workers import start_worker, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
MEMBERS = 300


def _client(url: str) -> Any:
    if "cluster=true" in url:
        return RedisCluster.from_url(url.split("?")[0], decode_responses=True)
    return redis.Redis.from_url(url, decode_responses=True)


def test_a_chord_calls_back_once_though_its_workers_are_killed(valkey_url: str,
                                                               tmp_path: Path) -> None:
    effects = _client(valkey_url)
    header = [jobs.square_slowly.using(lease=1).s(i, 0.02) for i in range(MEMBERS)]
    ref = chord(header, jobs.record_chord.using(lease=1).s(valkey_url)).enqueue()
    queue = Queue("default")
    log = tmp_path / "workers.log"
    procs = [start_worker(valkey_url, "--concurrency", "4", log=log) for _ in range(2)]
    try:
        for share in (MEMBERS // 3, 2 * MEMBERS // 3):  # kill one mid-run, twice; start anew
            wait_for(lambda share=share: queue.counts()["succeeded"] >= share, timeout=120)
            procs[0].send_signal(signal.SIGKILL)
            procs[0].wait(30)
            procs = [*procs[1:], start_worker(valkey_url, "--concurrency", "4", log=log)]
        assert ref.result(timeout=180) == MEMBERS
        runs = effects.lrange("chord:runs", 0, -1)
        assert len(runs) == 1 and json.loads(runs[0]) == [i * i for i in range(MEMBERS)]
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
        effects.close()
