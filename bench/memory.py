"""Valkey memory per waiting job, jobqueue beside BullMQ, with and without a priority, and what
a jobqueue job's bytes are made of.

Each system enqueues `--jobs` no-op jobs one at a time, then 100 more (a warm-up), Valkey is
emptied with FLUSHALL SYNC, and `used_memory` is read before and after `--jobs` more single
enqueues: once with the default priority and once with priority 1. (bench/peers.py's "bytes"
column warms up with a bulk enqueue and measures as many jobs as its run processes: a count
changes the bytes a job costs, as Valkey's tables grow in steps, BullMQ's more than jobqueue's:
199 bytes at 20,000 jobs there, 213–215 at 10,000.) BullMQ keeps a job without a priority
on a list and a job with one in a sorted set; jobqueue keeps every waiting job in its lane's
sorted set (the score is its priority), so its cost does not change with a priority but for
the row's `priority` field. Then jobqueue's parts: the row (MEMORY USAGE of a sample of job
keys, the key itself included) and the lane's sorted set per entry.

    .venv/bin/python bench/memory.py [--jobs 10000]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from _common import ROOT, valkey

HERE = Path(__file__).resolve().parent
NODE = ["node", str(HERE / "node" / "peer.js")]


def used(client: Any) -> int:
    return int(client.info("memory")["used_memory"])


def jobqueue_enqueue(n: int, priority: int) -> None:
    from benchapp import jobs

    handler = jobs.tick.using(priority=priority) if priority else jobs.tick
    for _ in range(n):
        handler.enqueue()


def bullmq_enqueue(url: str, n: int, priority: int) -> None:
    subprocess.run([*NODE, "enqueue", str(n), "single"], check=True, capture_output=True,
                   env={**os.environ, "BENCH_URL": url, "BENCH_PRIORITY": str(priority)})


def per_job(client: Any, enqueue: Callable[[int], None], n: int) -> float:
    """Bytes per job of `n` single enqueues, after a warm-up of the same jobs."""
    enqueue(n)
    enqueue(100)
    client.execute_command("FLUSHALL", "SYNC")
    before = used(client)
    enqueue(n)
    return (used(client) - before) / n


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=10_000)
    args = parser.parse_args()
    with valkey() as url:
        os.environ.update({"BENCH_URL": url, "VALKEY_URL": url,
                           "DJANGO_SETTINGS_MODULE": "bench_settings"})
        os.environ.pop("DATABASE_URL", None)  # (enqueue writes no database row)
        sys.path.insert(0, str(HERE))
        import django
        import redis

        django.setup()
        client = redis.Redis.from_url(url)
        print(f"Valkey bytes per waiting job, {args.jobs:,} single enqueues:")
        for priority in (0, 1):
            mine = per_job(client, partial(jobqueue_enqueue, priority=priority), args.jobs)
            bull = per_job(client, partial(bullmq_enqueue, url, priority=priority), args.jobs)
            print(f"  priority {priority}: jobqueue {mine:6.1f}   BullMQ {bull:6.1f}")
        client.execute_command("FLUSHALL", "SYNC")
        jobqueue_enqueue(args.jobs, 0)
        rows = [key for key in client.scan_iter("emq:*:job:*", count=1000)][:200]
        row = sum(client.memory_usage(key, samples=0) for key in rows) / len(rows)
        lane = client.memory_usage("emq:{default}:pending", samples=0) / args.jobs
        print(f"jobqueue's parts: a row (key, fields, payload) {row:.0f} bytes by MEMORY USAGE,"
              f" the lane's sorted set {lane:.0f} bytes an entry; the rest is the keyspace's own"
              f" table")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
