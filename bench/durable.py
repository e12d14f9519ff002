"""Durable queues against plain ones: enqueue rates with the row written to MariaDB first.

    .venv/bin/python bench/durable.py [--jobs 5000] [--database mysql://root@127.0.0.1:3306/jobqueue_bench]
"""

from __future__ import annotations

import argparse
import os

from _common import ROOT, rate, table, valkey
from worker import prepare_database


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--bulk", type=int, default=50_000)
    parser.add_argument("--database", default="mysql://root@127.0.0.1:3306/jobqueue_bench")
    args = parser.parse_args()
    with valkey() as url:
        os.environ.update(VALKEY_URL=url, DATABASE_URL=args.database,
                          DJANGO_SETTINGS_MODULE="bench_durable_settings",
                          PYTHONPATH=f"{ROOT / 'bench'}:{ROOT}")
        prepare_database(args.database)
        import django

        django.setup()
        from benchapp.jobs import tick
        from django.db import transaction

        from jobqueue.models import Job

        durable, plain = tick.using(queue="durable"), tick.using(queue="plain")

        def in_transactions(handler: object) -> None:
            for _ in range(args.jobs):
                with transaction.atomic():
                    handler.enqueue()  # type: ignore[attr-defined]

        def threads(handler: object, count: int) -> None:
            """`count` producers (web workers, say) each enqueueing one job per call."""
            from concurrent.futures import ThreadPoolExecutor

            from django.db import connection

            def produce(share: int) -> None:
                for _ in range(share):
                    handler.enqueue()  # type: ignore[attr-defined]
                connection.close()

            with ThreadPoolExecutor(count) as pool:
                list(pool.map(produce, [n // count] * count))

        n, bulk = args.jobs, args.bulk
        rows = [
            ("plain, one call per job", rate(n, lambda: [plain.enqueue() for _ in range(n)])),
            ("durable, one call per job (autocommit)",
             rate(n, lambda: [durable.enqueue() for _ in range(n)])),
            ("durable, one transaction per job", rate(n, lambda: in_transactions(durable))),
            ("plain, one call per job, 8 producer threads", rate(n, lambda: threads(plain, 8))),
            ("durable, one call per job, 8 producer threads", rate(n, lambda: threads(durable, 8))),
            ("plain, enqueue_many", rate(bulk, lambda: plain.enqueue_many([()] * bulk))),
            ("durable, enqueue_many", rate(bulk, lambda: durable.enqueue_many([()] * bulk))),
        ]
        assert Job.objects.filter(durable=True).count() == 3 * n + bulk
        table(f"{n:,} single / {bulk:,} bulk no-op enqueues, Valkey + MariaDB on loopback", rows)


if __name__ == "__main__":
    main()
