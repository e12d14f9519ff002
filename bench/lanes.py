"""Lane caps: what a claim costs when most lanes are held at their cap, and what caps cost a
real worker.

1. Claim + ack of single jobs on a queue of 1,000 lanes: no cap; `lane_concurrency: 1` with no
   lane held; and the same with 900 lanes held at their cap (each with a running job that is
   never acked). A held lane leaves the claim's ring when the first claim meets it there, so the
   last two rates should be alike: claims stay O(1) in capped lanes (the first two differ by what
   counting slots costs).
2. No-op jobs through real `runworker --burst` processes at concurrency 8, the same jobs over
   `--lanes` lanes, on a queue without caps and on one with `lane_concurrency` (the mirror off:
   the claim path only), with `--workers` processes and with 4 (the issue's test: 4 workers ×
   concurrency 8). The jobs wait on the paused queue until every worker is up (a job scheduled
   far ahead holds the burst meanwhile), so start-up, which varies with a neighbour's load, is
   not in the rate: jobs per second from the resume to the last job's finish. The burst's end,
   from that finish (the scheduled job cancelled) to the last worker's exit, is given apart.
   The two queues take turns, `--rounds` times, so a neighbour's load falls on both alike; each
   row gives the range over the rounds, and the capped row the median of its rounds' ratios to
   the uncapped run just before each.

    .venv/bin/python bench/lanes.py [--jobs 20000] [--claims 20000] [--workers 2] [--cap 2]
                                    [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from _common import ROOT, table, valkey

HELD_LANES = 900
FREE_LANES = 100


def claims_per_second(queue: Any, claims: int, batch: int) -> float:
    """Claim `batch` jobs, ack them, again, until `claims` jobs were claimed: jobs per second."""
    done = 0
    started = time.perf_counter()
    while done < claims:
        leases = queue.dequeue(count=batch, worker="bench")
        if not leases:
            raise SystemExit(f"{queue.name}: ran dry after {done} claims (raise the backlog)")
        queue.ack_many([(lease, None) for lease in leases])
        done += len(leases)
    return done / (time.perf_counter() - started)


def claim_rows(claims: int, batch: int) -> list[tuple[str, float]]:
    from jobqueue import Queue
    from jobqueue.spec import JobSpec

    rows = []
    for name in ("open", "capped-free", "capped"):
        queue = Queue(name)
        lanes = HELD_LANES + FREE_LANES
        serving = FREE_LANES if name == "capped" else lanes  # the lanes that serve the claims
        for lane in range(lanes):
            count = claims // serving + 2 if lane >= lanes - serving else 2
            for start in range(0, count, 1000):
                queue.enqueue_many([JobSpec(lane, lane=f"tenant-{lane}")
                                    for _ in range(min(1000, count - start))])
        label = f"{lanes:,} lanes, no cap" if name == "open" else f"{lanes:,} lanes, cap 1, none held"
        if name == "capped":  # hold 900 lanes at their cap: one running job each, never acked
            leases = queue.dequeue(count=lanes, worker="holder")  # one job of every lane
            queue.ack_many([(lease, None) for lease in leases if lease.payload >= HELD_LANES])
            label = f"{lanes:,} lanes, {HELD_LANES} held at their cap"
        rate = claims_per_second(queue, claims, batch)
        if name == "capped":  # (the first claims met the held lanes and took them off the ring)
            label += f" (ring after: {queue.client.llen(queue.shard(0).key('ring'))} lanes)"
        rows.append((f"{label}, claim {batch} + ack", rate))
    return rows


def burst(jobs: int, workers: int, queue: str, lanes: int, settings: dict[str, Any]
          ) -> tuple[float, float]:
    """`jobs` no-op jobs over `lanes` lanes, run by `workers` burst workers once every one of them
    is up: jobs per second from then to the last job's finish, and the seconds from that finish
    to the last worker's exit (the burst's end)."""
    from jobqueue import Queue
    from jobqueue.keys import WORKERS_KEY
    from tests.jobapp import jobs as handlers

    counted = Queue(queue)
    client, before = counted.client, counted.counts()["succeeded"]
    counted.pause()  # (the jobs wait until every worker is up; a scheduled one holds the burst)
    holder = handlers.noop.using(queue=queue, delay=600).enqueue()
    per_lane = jobs // lanes
    for lane in range(lanes):
        for start in range(0, per_lane, 1000):
            handlers.noop.using(queue=queue, lane=f"tenant-{lane}").enqueue_many(
                [()] * min(1000, per_lane - start))
    env = dict(os.environ, JOBQUEUE_TEST_QUEUES=json.dumps(settings))
    procs = [subprocess.Popen([sys.executable, "manage.py", "runworker", "--burst", "--workers", "1",
                               "--queues", queue, "--concurrency", "8", "--no-mirror",
                               "--log-level", "WARNING"], cwd=ROOT, env=env)
             for _ in range(workers)]
    while client.hlen(WORKERS_KEY) < workers:  # (each advertises itself at its first turn)
        time.sleep(0.005)
    started = time.perf_counter()
    counted.resume()
    client.rpush(counted.shard(0).key("wake"), *["1"] * workers)  # (as an enqueue would)
    total = per_lane * lanes
    while counted.counts()["succeeded"] - before < total:
        time.sleep(0.002)
    finished = time.perf_counter()
    counted.cancel(holder.id)  # the burst may end
    for proc in procs:
        assert proc.wait(600) == 0
    return total / (finished - started), time.perf_counter() - finished


def runworker_rows(args: argparse.Namespace, queues: dict[str, Any]) -> list[str]:
    """Uncapped and capped bursts taking turns, `args.rounds` times, for each worker count."""
    lines = []
    for workers in dict.fromkeys((args.workers, 4)):
        runs: dict[str, list[tuple[float, float]]] = {"w-open": [], "w-capped": []}
        for _ in range(args.rounds):
            for name, rates in runs.items():
                rates.append(burst(args.jobs, workers, name, args.lanes, queues))
        for name, label in (("w-open", "no cap"), ("w-capped", f"lane_concurrency {args.cap}")):
            rates, ends = [r[0] for r in runs[name]], [r[1] for r in runs[name]]
            line = (f"  {workers} runworker × 8, {args.lanes} lanes, {label:<18}"
                    f"  {min(rates):>7,.0f}–{max(rates):>7,.0f} jobs/s"
                    f"   burst's end {min(ends):.2f}–{max(ends):.2f} s")
            if name == "w-capped":
                ratio = statistics.median(capped[0] / open_[0] for capped, open_
                                          in zip(runs["w-capped"], runs["w-open"], strict=True))
                line += f"   ÷ no cap (median of rounds): {ratio:.2f}×"
            lines.append(line)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--claims", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--lanes", type=int, default=50)
    parser.add_argument("--cap", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    queues = {"open": {}, "capped": {"lane_concurrency": 1}, "capped-free": {"lane_concurrency": 1},
              "w-open": {}, "w-capped": {"lane_concurrency": args.cap}}
    with valkey() as url:
        os.environ.update(VALKEY_URL=url, DJANGO_SETTINGS_MODULE="tests.settings",
                          JOBQUEUE_TEST_QUEUES=json.dumps(queues),
                          DATABASE_URL=os.environ.get("DATABASE_URL", "sqlite:///:memory:"))
        import django

        django.setup()
        table(f"claims of single jobs (batches of {args.batch}), {args.claims:,} claims",
              claim_rows(args.claims, args.batch))
        print(f"\nno-op jobs through runworker --burst (mirror off), {args.jobs:,} jobs, "
              f"{args.rounds} rounds, from every worker up to the last job's finish")
        print("\n".join(runworker_rows(args, queues)))


if __name__ == "__main__":
    main()
