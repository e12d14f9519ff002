"""Scale-out: processed jobs/s on one Valkey and on a 3-primary cluster, and what many workers on
many shards cost Valkey (the question partition ownership would answer).

No-op jobs drained by real `runworker --burst` processes, no mirror (Valkey is what is measured).
For each setup: jobs/s, Valkey CPU per job (all nodes), and the server-side p50/p99 of the script
calls (Valkey's latency tracking of EVALSHA: during a drain these are the claims, which carry the
acks), and script calls per job (a claim that finds another worker took the work is wasted).

    .venv/bin/python bench/scaleout.py [--jobs 20000]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import redis
from _common import ROOT, django_setup, valkey


@contextlib.contextmanager
def cluster() -> Iterator[tuple[str, list[int]]]:
    from tests.servers import ValkeyCluster

    nodes = ValkeyCluster(size=3).start()
    try:
        yield nodes.url, [n.port for n in nodes.nodes]
    finally:
        nodes.cleanup()


def stats(ports: list[int]) -> tuple[float, int, list[dict[str, float]]]:
    """(CPU seconds, EVALSHA calls, EVALSHA latency percentiles per node) over the nodes."""
    cpu, calls, latency = 0.0, 0, []
    for port in ports:
        client = redis.Redis(port=port, decode_responses=True)
        info = client.info("cpu")
        cpu += info["used_cpu_sys"] + info["used_cpu_user"]
        calls += client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
        latency.append(client.info("latencystats").get("latency_percentiles_usec_evalsha", {}))
        client.close()
    return cpu, calls, latency


def reset(ports: list[int]) -> None:
    for port in ports:
        client = redis.Redis(port=port)
        client.config_resetstat()
        client.close()


def drain(url: str, ports: list[int], jobs: int, shards: int, procs: int,
          concurrency: int) -> dict[str, Any]:
    from benchapp.jobs import noop
    from django.conf import settings

    from jobqueue import Queue, conf

    settings.JOBQUEUE = {"URL": url, "QUEUES": {"bench": {"shards": shards}}}
    conf.reset()
    queue = Queue("bench")
    for start in range(0, jobs, 5000):
        noop.using(queue="bench").enqueue_many([() for _ in range(min(5000, jobs - start))])
    reset(ports)
    cpu0, _, _ = stats(ports)
    env = dict(os.environ, VALKEY_URL=url, DJANGO_SETTINGS_MODULE="bench_settings",
               PYTHONPATH=f"{ROOT / 'bench'}:{ROOT}")
    started = time.perf_counter()
    workers = [subprocess.Popen([sys.executable, "manage.py", "runworker", "--burst", "--workers", "1",
                                 "--queues", "bench", "--no-mirror", "--concurrency", str(concurrency),
                                 "--log-level", "WARNING"], cwd=ROOT, env=env) for _ in range(procs)]
    for worker in workers:
        assert worker.wait(600) == 0
    elapsed = time.perf_counter() - started
    cpu1, calls, latency = stats(ports)
    left = queue.counts()["pending"]
    return {"rate": jobs / elapsed, "valkey_us": (cpu1 - cpu0) / jobs * 1e6,
            "calls_per_job": calls / jobs, "left": left,
            "latency": " ".join(f"{n.get('p50', 0):.0f}/{n.get('p99', 0):.0f}" for n in latency)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=20_000)
    args = parser.parse_args()
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench_settings"
    django_setup("redis://127.0.0.1:1/0")
    setups = [  # (where, shards, worker processes, concurrency each)
        ("1 Valkey", 1, 2, 16), ("1 Valkey", 3, 2, 16), ("3-primary cluster", 3, 2, 16),
        ("1 Valkey", 1, 8, 4), ("1 Valkey", 16, 8, 4), ("3-primary cluster", 16, 8, 4),
    ]
    rows = []
    for where, shards, procs, concurrency in setups:
        if where == "1 Valkey":
            with valkey() as url:
                port = int(url.rsplit(":", 1)[1].split("/")[0])
                result = drain(url, [port], args.jobs, shards, procs, concurrency)
        else:
            with cluster() as (url, ports):
                result = drain(url, ports, args.jobs, shards, procs, concurrency)
        rows.append((where, shards, procs, concurrency, result))
    print(f"\n{args.jobs:,} no-op jobs drained by runworker --burst (no mirror)")
    print(f"  {'where':<26} {'shards':>6} {'procs×c':>8} {'jobs/s':>8} {'valkey µs/job':>13} "
          f"{'scripts/job':>11}  EVALSHA p50/p99 µs per node")
    for where, shards, procs, concurrency, r in rows:
        print(f"  {where:<26} {shards:>6} {f'{procs}×{concurrency}':>8} {r['rate']:>8,.0f} "
              f"{r['valkey_us']:>13.1f} {r['calls_per_job']:>11.3f}  {r['latency']}"
              + (f"  ({r['left']} left!)" if r["left"] else ""))


if __name__ == "__main__":
    main()
