"""What asynchronous replication loses when a primary dies, and what `wait_replicas` costs.

A 3-primary Valkey Cluster with one replica each (real processes on loopback). One thread
enqueues one job per call on a 3-shard queue; primary 0 is SIGKILLed mid-run, its replica takes
over, and every enqueue that had been acknowledged is looked up. On loopback a replica is never
behind, so `--lag` first stops primary 0's replica (SIGSTOP) for that many seconds while a second
thread bulk-enqueues megabytes (more than the kernel's socket buffers hold, past which the
primary cuts the replica off, as a slow link would), and lets it go (SIGCONT) as its primary is
killed. Run with `wait_replicas` 0
(the default) and 1.

    .venv/bin/python bench/failover.py [--seconds 2] [--lag 0.5] [--rounds 3]
"""

from __future__ import annotations

import argparse
import signal
import threading
import time
from typing import Any

import redis
from _common import django_setup
from redis.exceptions import RedisError


def flood(queue: Any, seconds: float) -> None:
    """Bulk-enqueue 10 KB jobs for `seconds` (and drop them): megabytes of replication stream."""
    from jobqueue.exceptions import JobQueueError
    from jobqueue.spec import JobSpec

    until = time.monotonic() + seconds
    while time.monotonic() < until:
        try:
            queue.enqueue_many([JobSpec({"pad": "x" * 10_000}) for _ in range(100)])
        except (RedisError, JobQueueError):
            return


def one_round(wait: int, seconds: float, lag: float) -> tuple[int, int, int, float, float]:
    """(acknowledged, lost, refused, enqueues/s before the kill, failover seconds)."""
    from django.conf import settings

    from jobqueue import Queue, conf
    from jobqueue.exceptions import NotReplicated
    from tests.servers import ValkeyCluster

    cluster = ValkeyCluster(size=3, replicas=1, node_timeout_ms=1000).start()
    try:
        settings.JOBQUEUE = {"URL": cluster.url,
                             "QUEUES": {"default": {"shards": 3, "wait_replicas": wait}}}
        conf.reset()
        queue = Queue("default")
        acknowledged: list[str] = []
        refused = 0
        stop = threading.Event()

        def enqueue() -> None:
            nonlocal refused
            while not stop.is_set():
                try:
                    acknowledged.append(queue.enqueue({"n": len(acknowledged)}).id)
                except NotReplicated:
                    refused += 1
                except RedisError:  # the primary is gone: keep trying until its replica serves
                    time.sleep(0.01)

        thread = threading.Thread(target=enqueue)
        started = time.perf_counter()
        thread.start()
        time.sleep(seconds)
        before = len(acknowledged) / (time.perf_counter() - started)
        replica = cluster.nodes[cluster.size]  # primary 0's
        assert replica.proc is not None
        if lag:
            # A replica that falls further behind than its output buffer allows is cut off (as
            # on a slow link): writes from then on never reach it.
            primary = redis.Redis(port=cluster.nodes[0].port)
            primary.config_set("client-output-buffer-limit", "replica 64kb 32kb 1")
            primary.close()
            replica.proc.send_signal(signal.SIGSTOP)
            ballast = threading.Thread(target=flood, args=(queue, lag))  # past the kernel's buffers
            ballast.start()
            time.sleep(lag)
            ballast.join()
        killed = time.perf_counter()
        threading.Timer(0.05, replica.proc.send_signal, [signal.SIGCONT]).start()
        cluster.kill_primary(0)
        failover = time.perf_counter() - killed
        time.sleep(1.0)
        stop.set()
        thread.join()
        present = sum(1 for job_id in acknowledged if queue.locate(job_id) is not None)
        return len(acknowledged), len(acknowledged) - present, refused, before, failover
    finally:
        cluster.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--lag", type=float, default=0.5)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    django_setup("redis://127.0.0.1:1/0")
    print(f"SIGKILL of a primary (3 primaries, 1 replica each, its replica {args.lag} s behind) "
          f"while one thread enqueues, {args.rounds} rounds")
    for wait in (0, 1):
        for _ in range(args.rounds):
            acked, lost, refused, rate, failover = one_round(wait, args.seconds, args.lag)
            print(f"  wait_replicas={wait}: {rate:7,.0f} enqueues/s; failover {failover:.1f} s; "
                  f"{acked:,} acknowledged, {lost} lost, {refused} refused (not replicated)")


if __name__ == "__main__":
    main()
