"""A Valkey Cluster with a replica per primary: a primary dies mid-run, its replica takes over,
and the worker rides it out."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis

from jobqueue import Queue
from jobqueue.models import Job
from tests.jobapp import jobs
from tests.servers import ValkeyCluster
from tests.workers import manage, start_worker, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def replicated(cluster: ValkeyCluster) -> bool:
    """Every replica has applied all its primary's writes."""
    for primary, replica in zip(cluster.nodes[: cluster.size], cluster.nodes[cluster.size :],
                                strict=True):
        ahead = redis.Redis(port=primary.port, decode_responses=True).info("replication")
        behind = redis.Redis(port=replica.port, decode_responses=True).info("replication")
        if ahead["master_repl_offset"] != behind.get("slave_repl_offset"):
            return False
    return True


def test_a_worker_rides_out_a_primary_failing_over_to_its_replica(settings: Any) -> None:
    cluster = ValkeyCluster(size=3, replicas=1, node_timeout_ms=1000).start()
    worker = None
    try:
        settings.JOBQUEUE = {"URL": cluster.url, "QUEUES": {"default": {"shards": 3}}}
        refs = jobs.sleep.enqueue_many([(0.002,)] * 3000)
        wait_for(lambda: replicated(cluster), timeout=30, every=0.05)  # nothing is lost to async
        worker = start_worker(cluster.url, "--concurrency", "4", "--lease", "3")
        wait_for(lambda: Job.objects.count() >= 300, timeout=60)
        started = time.monotonic()
        cluster.kill_primary(0)  # the node in the worker's URL, too
        failover = time.monotonic() - started
        wait_for(lambda: Job.objects.filter(state="succeeded").count() == len(refs), timeout=120)
        assert worker.poll() is None  # it rode the failover out
        rows = Job.objects.all()
        assert {row.id for row in rows} == {r.id for r in refs}
        reruns = sum(row.attempts > 1 for row in rows)
        print(f"failover took {failover:.1f} s; {reruns} of {len(refs)} jobs ran again")
        assert Queue("default").counts()["pending"] == 0
        # Idle now: its waiters found the shards' nodes again, the promoted replica's included.
        late = [jobs.add.enqueue(i, 1) for i in range(6)]
        wait_for(lambda: Job.objects.filter(pk__in=[r.id for r in late], state="succeeded")
                 .count() == 6, timeout=30)
    finally:
        if worker is not None:
            worker.terminate()
            worker.wait(30)
        cluster.cleanup()


def test_a_process_started_while_a_seed_node_is_down_finds_the_cluster_through_another() -> None:
    cluster = ValkeyCluster(size=3, replicas=1, node_timeout_ms=1000).start()
    try:
        others = ",".join(f"127.0.0.1:{node.port}" for node in cluster.nodes[1:3])
        several = cluster.url.replace("/0?", f",{others}/0?")
        assert manage("jobqueue", "stats", url=several).returncode == 0
        cluster.kill_primary(0)  # the first node of both URLs
        alone = manage("jobqueue", "stats", url=cluster.url)
        assert alone.returncode == 1 and len(alone.stderr.strip().splitlines()) == 1
        assert manage("jobqueue", "stats", url=several).returncode == 0
    finally:
        cluster.cleanup()


def test_wait_replicas_returns_once_a_replica_holds_the_jobs_and_says_when_none_did(
        settings: Any) -> None:
    import signal

    from jobqueue.exceptions import NotReplicated
    from jobqueue.spec import JobSpec

    cluster = ValkeyCluster(size=3, replicas=1, node_timeout_ms=1000).start()
    try:
        settings.JOBQUEUE = {"URL": cluster.url,
                             "QUEUES": {"default": {"shards": 3, "wait_replicas": 1}}}
        queue = Queue("default")
        refs = queue.enqueue_many([JobSpec(i) for i in range(30)])
        assert len(refs) == 30 and all(r.created for r in refs)
        replica = cluster.nodes[cluster.size]  # primary 0's, which holds shard 2 ({default#2})
        assert replica.proc is not None
        replica.proc.send_signal(signal.SIGSTOP)
        try:
            with pytest.raises(NotReplicated, match="only 0 of 1 replica") as caught:
                queue.enqueue_many([JobSpec(i) for i in range(30)])
        finally:
            replica.proc.send_signal(signal.SIGCONT)
        assert len(caught.value.refs) == 30  # written on the primaries, and said so
        assert all(queue.locate(r.id) is not None for r in caught.value.refs)
    finally:
        cluster.cleanup()


def test_wait_replicas_without_a_replica_raises_after_the_wait(settings: Any) -> None:
    from jobqueue.exceptions import NotReplicated

    settings.JOBQUEUE = {**settings.JOBQUEUE, "QUEUES": {"default": {"wait_replicas": 1}}}
    with pytest.raises(NotReplicated) as caught:
        Queue("default").enqueue("x")
    assert caught.value.refs and Queue("default").get(caught.value.refs[0].id) is not None
