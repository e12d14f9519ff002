"""Engine throughput of `Queue` against one local valkey-server: enqueue, claim + ack.

    .venv/bin/python bench/engine.py [--jobs 100000]
"""

from __future__ import annotations

import argparse

from _common import django_setup, rate, table, valkey


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--single", type=int, default=10_000)
    args = parser.parse_args()
    with valkey() as url:
        django_setup(url)
        from jobqueue.store import JobSpec, Queue

        q = Queue("bench")
        payload = {"handler": "bench.noop", "args": [1, 2], "kwargs": {}}
        single = rate(args.single, lambda: [q.enqueue(payload) for _ in range(args.single)])
        q.client.flushall()
        specs = [JobSpec(payload) for _ in range(args.jobs)]
        bulk = rate(args.jobs, lambda: q.enqueue_many(specs))

        def drain(batch: int) -> None:
            while leases := q.dequeue(count=batch, worker="bench"):
                q.ack_many([(lease, None) for lease in leases])

        claim_ack = rate(args.jobs, lambda: drain(100))
        q.enqueue_many(specs[: args.single])
        claim_ack_1 = rate(args.single, lambda: drain(1))
        laned = [JobSpec(payload, lane=f"tenant-{i % 1000}") for i in range(args.jobs)]
        q.enqueue_many(laned)
        claim_ack_lanes = rate(args.jobs, lambda: drain(100))
        table(f"jobqueue engine, one valkey-server, {args.jobs:,} jobs", [
            ("enqueue, one call per job", single),
            ("enqueue_many (500 per call)", bulk),
            ("claim 100 + ack_many", claim_ack),
            ("claim 1 + ack 1", claim_ack_1),
            ("claim 100 + ack_many, 1000 lanes", claim_ack_lanes),
        ])


if __name__ == "__main__":
    main()
