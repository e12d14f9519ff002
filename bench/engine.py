"""Engine throughput of `Queue` against one local valkey-server: enqueue, claim + ack.

Each figure is the median of three runs after a warm-up.

    .venv/bin/python bench/engine.py [--jobs 100000]
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

from _common import django_setup, rate, table, valkey


def median_rate(n: int, setup: Callable[[], object], run: Callable[[], object]) -> float:
    rates = []
    for _ in range(3):
        setup()
        rates.append(rate(n, run))
    return statistics.median(rates)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--single", type=int, default=10_000)
    args = parser.parse_args()
    with valkey() as url:
        django_setup(url)
        from jobqueue import Queue
        from jobqueue.spec import JobSpec

        q = Queue("bench")
        payload = {"handler": "bench.noop", "args": [1, 2], "kwargs": {}}
        specs = [JobSpec(payload) for _ in range(args.jobs)]
        laned = [JobSpec(payload, lane=f"tenant-{i % 1000}") for i in range(args.jobs)]

        def fresh() -> None:
            q.client.flushall()

        def drain(batch: int) -> Callable[[], None]:
            def run() -> None:
                while leases := q.dequeue(count=batch, worker="bench"):
                    q.ack_many([(lease, None) for lease in leases])
            return run

        for _ in range(500):  # warm-up: scripts loaded, connections open
            q.enqueue(payload)
        rows = [
            ("enqueue, one call per job", median_rate(
                args.single, fresh, lambda: [q.enqueue(payload) for _ in range(args.single)])),
            ("enqueue_many (500 per call)", median_rate(
                args.jobs, fresh, lambda: q.enqueue_many(specs))),
            ("claim 100 + ack_many", median_rate(
                args.jobs, lambda: (fresh(), q.enqueue_many(specs)), drain(100))),
            ("claim 1 + ack 1", median_rate(
                args.single, lambda: (fresh(), q.enqueue_many(specs[: args.single])), drain(1))),
            ("claim 100 + ack_many, 1000 lanes", median_rate(
                args.jobs, lambda: (fresh(), q.enqueue_many(laned)), drain(100))),
        ]
        table(f"jobqueue engine, one valkey-server, {args.jobs:,} jobs (median of 3)", rows)


if __name__ == "__main__":
    main()
