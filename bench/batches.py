"""Batch handlers against one job per call: a handler that inserts one row per job into MariaDB
(`bulk_create` for the batch handler at batch=100, one `create` per job for the plain one), the
same number of jobs through one `runworker --burst` each; jobs/s of each, their ratio, and the
script calls per job (counted by the server: its command statistics).

    .venv/bin/python bench/batches.py [--jobs 20000] [--concurrency 4]
        [--database mysql://root@127.0.0.1:3306/jobqueue_bench_batches]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from _common import ROOT, prepare_database, valkey

HERE = ROOT / "bench"


def script_calls(client: object) -> int:
    stats = client.info("commandstats")  # type: ignore[attr-defined]
    return sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in ("evalsha", "eval", "fcall"))


def run(handler: object, jobs: int, concurrency: int) -> tuple[float, float]:
    """(jobs/s, script calls per job) of `jobs` jobs of `handler`, each enqueued as a job of its
    own, run by one `runworker --burst`: from the first job's start to the last one's end (as
    their rows say: the worker's own start is left out)."""
    from batchapp.models import BatchRow

    from jobqueue import Queue

    BatchRow.objects.all().delete()
    queue = Queue("rows")
    refs = handler.enqueue_many([(i,) for i in range(jobs)])  # type: ignore[attr-defined]
    queue.client.config_resetstat()
    subprocess.run(
        [
            sys.executable,
            "manage.py",
            "runworker",
            "--burst",
            "--queues",
            "rows",
            "--concurrency",
            str(concurrency),
            "--workers",
            "1",
            "--no-mirror",
            "--log-level",
            "WARNING",
        ],
        cwd=ROOT,
        env=dict(os.environ),
        check=True,
    )
    calls = script_calls(queue.client) / jobs
    assert BatchRow.objects.count() == jobs, (BatchRow.objects.count(), jobs)
    rows = [queue.get(ref.id) for ref in refs]
    assert all(row is not None and row.state == "succeeded" for row in rows)
    first = min(row.started_at for row in rows if row and row.started_at)
    last = max(row.finished_at for row in rows if row and row.finished_at)
    return jobs / (last - first).total_seconds(), calls


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--database", default="mysql://root@127.0.0.1:3306/jobqueue_bench_batches")
    args = parser.parse_args()
    with valkey() as url:
        os.environ.update(
            VALKEY_URL=url,
            DATABASE_URL=args.database,
            DJANGO_SETTINGS_MODULE="bench_batch_settings",
            PYTHONPATH=f"{HERE}:{ROOT}",
        )
        sys.path.insert(0, str(HERE))
        prepare_database(args.database)
        import django

        django.setup()
        from batchapp import jobs as handlers
        from batchapp.models import BatchRow
        from django.db import connection

        with connection.schema_editor() as editor:
            editor.create_model(BatchRow)
        single, single_calls = run(handlers.row_each, args.jobs, args.concurrency)
        batched, batch_calls = run(handlers.row_batch, args.jobs, args.concurrency)
        print(
            f"\n{args.jobs:,} jobs, each inserting a row into "
            f"{args.database.split(':')[0]}, one runworker --concurrency {args.concurrency}"
        )
        print(f"  one job per call    {single:>10,.0f} jobs/s  {single_calls:.3f} script calls/job")
        print(f"  batch=100           {batched:>10,.0f} jobs/s  {batch_calls:.3f} script calls/job")
        print(f"  ratio               {batched / single:>10.1f}×")


if __name__ == "__main__":
    main()
