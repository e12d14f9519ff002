"""Sealed jobs against plain ones (encryption at rest, docs/howto/encryption.md): the same async
job with a 1 KB argument and a result, on a queue with `encrypt` and on one without, in
alternating rounds; enqueue rate (one call per job) and processing rate from the workers' spawn
to their exit (`runworker --burst` in peers.py's best configuration for async jobs: `--workers
2, c=64`; the mirror off, as it only copies the opaque values). The target: sealed ≥ 0.8× plain.

    .venv/bin/python bench/sealed.py [--jobs 20000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import base64
import os
import statistics
import subprocess
import sys
import time

from _common import ROOT, table, valkey

BLOB = "x" * 1024


def run(queue: str, jobs: int) -> tuple[float, float]:
    """(enqueue rate, processing rate) of `jobs` jobs on `queue`."""
    from benchapp.jobs import acarry

    from jobqueue import Queue

    handler = acarry.using(queue=queue)
    started = time.perf_counter()
    for _ in range(jobs):
        handler.enqueue(BLOB)
    enqueued = jobs / (time.perf_counter() - started)
    started = time.perf_counter()
    worker = subprocess.run(
        [
            sys.executable,
            "manage.py",
            "runworker",
            "--burst",
            "--workers",
            "2",
            "--concurrency",
            "64",
            "--queues",
            queue,
            "--no-mirror",
            "--log-level",
            "WARNING",
        ],
        cwd=ROOT,
        env=dict(os.environ),
        check=True,
    )
    processed = jobs / (time.perf_counter() - started)
    assert worker.returncode == 0 and Queue(queue).counts()["succeeded"] >= jobs
    return enqueued, processed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with valkey() as url:
        os.environ.update(
            VALKEY_URL=url,
            BENCH_URL=url,
            DJANGO_SETTINGS_MODULE="bench_sealed_settings",
            JOBQUEUE_BENCH_KEY=base64.urlsafe_b64encode(os.urandom(32)).decode(),
            PYTHONPATH=f"{ROOT / 'bench'}:{ROOT}",
        )
        import django

        django.setup()
        from jobqueue.conf import get_client

        seen: dict[str, list[tuple[float, float]]] = {"plain": [], "sealed": []}
        for turn in range(args.rounds):  # (each round starts with the other one)
            for queue in ("plain", "sealed") if turn % 2 == 0 else ("sealed", "plain"):
                get_client().flushall()
                seen[queue].append(run(queue, args.jobs))
        median = {
            queue: (statistics.median(e for e, _ in runs), statistics.median(p for _, p in runs))
            for queue, runs in seen.items()
        }
        table(
            f"{args.jobs:,} async jobs with a 1 KB argument, median of {args.rounds} round(s)",
            [
                ("plain: enqueue, one call per job", median["plain"][0]),
                ("sealed: enqueue, one call per job", median["sealed"][0]),
                ("plain: processed, from spawn (--workers 2, c=64)", median["plain"][1]),
                ("sealed: processed, from spawn (--workers 2, c=64)", median["sealed"][1]),
            ],
        )
        print(
            f"\n  sealed / plain: enqueue {median['sealed'][0] / median['plain'][0]:.2f}×, "
            f"processed {median['sealed'][1] / median['plain'][1]:.2f}×"
        )


if __name__ == "__main__":
    main()
