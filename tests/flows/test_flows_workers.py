"""Flows through real `runworker` processes: a chord whose workers are SIGKILLed and restarted
while it runs calls back once, with every result in order (on one Valkey, on a cluster, and the
issue's chaos run: 1,000 members on a 4-shard queue of a 3-primary cluster)."""

from __future__ import annotations

import json
import os
import random
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster

from jobqueue import Queue, chord, flows
from tests.jobapp import jobs
from tests.servers import ValkeyCluster
from tests.workers import start_worker, wait_for

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


CHAOS_MEMBERS = 1000
CHAOS_BUDGET = 60.0
"""Seconds the chaos run may take in all, workers started and killed included (a few on a
loaded 2-core machine): a hang fails it instead of holding up the suite."""


def test_a_1000_member_chord_on_a_cluster_calls_back_once_though_workers_die_at_random(
        settings: Any, valkey_cluster: ValkeyCluster, tmp_path: Path) -> None:
    """The chaos run: a chord of 1,000 members on a queue of 4 shards on a 3-primary cluster,
    two workers, each SIGKILLed once at a random point of the members' progress and started
    anew; the callback runs once, with the 1,000 results in order. The header's members are
    placed by their ids over the 4 shards (dag.py), so most members' "done" reaches the
    callback's shard through a relay (relay.py): a worker killed between its ack and its relay
    leaves the entries to the other's maintenance. Leases of 1 s bring a killed worker's jobs
    back within about 2 s."""
    url = valkey_cluster.url
    effects = _client(url)
    effects.flushall(target_nodes=RedisCluster.PRIMARIES)
    queues = {"chaos": {"shards": 4}}
    settings.JOBQUEUE = {"URL": url, "QUEUES": {"default": {}, **queues}}
    seed = int.from_bytes(os.urandom(4), "big")
    rng = random.Random(seed)
    member = jobs.square_slowly.using(queue="chaos", lease=1)
    header = [member.s(i, 0.01) for i in range(CHAOS_MEMBERS)]
    ref = chord(header, jobs.record_chord.using(queue="chaos", lease=1).s(url)).enqueue()
    spread = Counter(info.shard for info in flows.members(ref.id, "chaos"))
    assert len(spread) == 4 and min(spread.values()) > CHAOS_MEMBERS // 8, spread
    queue, deadline = Queue("chaos"), time.monotonic() + CHAOS_BUDGET
    log = tmp_path / "workers.log"
    env = {"JOBQUEUE_TEST_QUEUES": json.dumps(queues)}

    def worker() -> Any:
        return start_worker(url, "--queues", "chaos", "--concurrency", "4", log=log, env=env)

    procs = [worker(), worker()]
    try:
        for share in sorted(rng.uniform(0.1, 0.8) for _ in range(2)):
            wait_for(lambda share=share: queue.counts()["succeeded"] >= share * CHAOS_MEMBERS,
                     timeout=deadline - time.monotonic())
            victim = procs.pop(rng.randrange(len(procs)))
            victim.send_signal(signal.SIGKILL)
            victim.wait(30)
            procs.append(worker())
        assert ref.result(timeout=max(deadline - time.monotonic(), 1)) == CHAOS_MEMBERS, seed
        runs = effects.lrange("chord:runs", 0, -1)
        assert len(runs) == 1, (seed, len(runs))
        assert json.loads(runs[0]) == [i * i for i in range(CHAOS_MEMBERS)], seed
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
        effects.close()
