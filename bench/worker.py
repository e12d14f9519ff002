"""End to end: no-op jobs through real `runworker --burst` processes, mirror on, into MariaDB;
and the mirror alone (terminal events → bulk upserts).

    .venv/bin/python bench/worker.py [--jobs 20000] [--database mysql://root@127.0.0.1:3306/jobqueue_bench]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from _common import ROOT, prepare_database, rate, table, valkey


def end_to_end(jobs: int, workers: int, concurrency: int, extra: list[str]) -> float:
    from jobqueue.models import Job
    from tests.jobapp import jobs as handlers

    Job.objects.all().delete()
    handlers.noop.enqueue_many([() for _ in range(jobs)])
    started = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "manage.py", "runworker", "--burst",
                               "--concurrency", str(concurrency), "--log-level", "WARNING", *extra],
                              cwd=ROOT, env=dict(os.environ)) for _ in range(workers)]
    for proc in procs:
        assert proc.wait(600) == 0
    elapsed = time.perf_counter() - started
    assert Job.objects.filter(state="succeeded").count() == jobs
    return jobs / elapsed


def mirror_only(jobs: int) -> float:
    try:
        from jobqueue.history.mirror import Mirror
    except ImportError:  # a checkout from before the rooms (--baseline, --roots)
        from jobqueue.mirror import Mirror
    from jobqueue import Queue
    from jobqueue.models import Job
    from tests.jobapp import jobs as handlers

    Job.objects.all().delete()
    handlers.noop.using(queue="mirrorbench").enqueue_many([() for _ in range(jobs)])
    q = Queue("mirrorbench")
    while leases := q.dequeue(count=500, worker="bench"):
        q.ack_many([(lease, None) for lease in leases])
    mirror = Mirror([q], consumer="bench")
    written = rate(jobs, lambda: mirror.step())
    count = Job.objects.filter(queue="mirrorbench").count()
    assert count == jobs, (count, jobs)
    return written


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--database", default="mysql://root@127.0.0.1:3306/jobqueue_bench")
    args = parser.parse_args()
    with valkey(appendonly=True) as url:
        os.environ.update(VALKEY_URL=url, DATABASE_URL=args.database,
                          DJANGO_SETTINGS_MODULE="tests.settings")
        prepare_database(args.database)
        import django

        django.setup()
        rows = [("mirror alone (bulk upsert 1000/batch)", mirror_only(args.jobs * 2))]
        for workers, concurrency in [(1, 1), (1, 8), (2, 8), (2, 32)]:
            name = f"{workers} runworker × --concurrency {concurrency}"
            rows.append((name, end_to_end(args.jobs, workers, concurrency, [])))
        table(f"end to end, no-op jobs, AOF everysec, mirror into {args.database.split(':')[0]}, "
              f"{args.jobs:,} jobs", rows)


if __name__ == "__main__":
    main()
