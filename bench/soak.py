"""Soak: a million no-op jobs over 100 lanes and 3 queues, drained by 2 `runworker` processes
(mirror on, into MariaDB), finished rows kept in Valkey for `--retention` seconds. Prints
Valkey's memory and the workers' resident memory before, while and after the queues drain, then
again once they have stood idle: nothing may grow.

    .venv/bin/python bench/soak.py [--jobs 1000000] [--idle 120] [--retention 60]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from _common import ROOT, valkey
from worker import prepare_database

QUEUES = ("soak0", "soak1", "soak2")
LANES = 100


def rss_mib(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/status") as status:
            total += next(int(line.split()[1]) for line in status if line.startswith("VmRSS"))
    return total / 1024


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--idle", type=float, default=120.0, help="seconds to watch once drained")
    parser.add_argument("--retention", type=float, default=60.0,
                        help="seconds finished rows stay in Valkey (the default setting is a day)")
    parser.add_argument("--database", default="mysql://root@127.0.0.1:3306/jobqueue_bench")
    args = parser.parse_args()
    with valkey(appendonly=True) as url:
        os.environ.update(VALKEY_URL=url, JOBQUEUE_RETENTION=str(args.retention), DATABASE_URL=args.database,
                          DJANGO_SETTINGS_MODULE="bench_settings",
                          PYTHONPATH=f"{ROOT / 'bench'}:{ROOT}")
        prepare_database(args.database)
        import django

        django.setup()
        from benchapp import jobs as handlers

        from jobqueue import Queue
        from jobqueue.conf import get_client
        from jobqueue.models import Job

        client = get_client()
        queues = [Queue(name) for name in QUEUES]

        def used_mib() -> float:
            return int(client.info("memory")["used_memory"]) / 2**20

        def backlog() -> int:
            return sum(c["pending"] + c["active"] + c["scheduled"]
                       for c in (q.counts() for q in queues))

        print(f"soak: {args.jobs:,} jobs, {len(QUEUES)} queues x {LANES} lanes, 2 workers")
        print(f"  {'t (s)':>6}  {'phase':<9} {'backlog':>9}  {'Valkey MiB':>10}  {'workers MiB':>11}")
        baseline = used_mib()
        print(f"  {0:>6.0f}  {'empty':<9} {0:>9,}  {baseline:>10.1f}  {'-':>11}")
        started = time.monotonic()
        chunk = 10_000
        for n in range(0, args.jobs, chunk):
            queue, lane = QUEUES[(n // chunk) % len(QUEUES)], f"lane{(n // chunk) % LANES}"
            handlers.noop.using(queue=queue, lane=lane).enqueue_many(
                [() for _ in range(min(chunk, args.jobs - n))])
        enqueued = time.monotonic() - started
        print(f"  {enqueued:>6.0f}  {'enqueued':<9} {backlog():>9,}  {used_mib():>10.1f}  {'-':>11}")
        workers = [subprocess.Popen([sys.executable, "manage.py", "runworker", "--workers", "1",
                                     "--concurrency", "16", "--log-level", "WARNING"],
                                    cwd=ROOT, env=dict(os.environ)) for _ in range(2)]
        pids = [w.pid for w in workers]
        peak_valkey = peak_rss = 0.0
        try:
            while (left := backlog()) > 0:
                time.sleep(10)
                valkey_mib, worker_mib = used_mib(), rss_mib(pids)
                peak_valkey, peak_rss = max(peak_valkey, valkey_mib), max(peak_rss, worker_mib)
                print(f"  {time.monotonic() - started:>6.0f}  {'draining':<9} {left:>9,}  "
                      f"{valkey_mib:>10.1f}  {worker_mib:>11.1f}")
            drained = time.monotonic() - started - enqueued
            samples = []
            for _ in range(int(args.idle // 10)):
                time.sleep(10)
                samples.append((used_mib(), rss_mib(pids)))
                print(f"  {time.monotonic() - started:>6.0f}  {'idle':<9} {backlog():>9,}  "
                      f"{samples[-1][0]:>10.1f}  {samples[-1][1]:>11.1f}")
        finally:
            for w in workers:
                w.terminate()
            for w in workers:
                w.wait(60)
        mirrored = Job.objects.filter(state="succeeded").count()
        print(f"enqueue {args.jobs / enqueued:,.0f} jobs/s; drain {args.jobs / drained:,.0f} jobs/s; "
              f"{mirrored:,} rows mirrored")
        if samples:
            first, last = samples[0], samples[-1]
            print(f"idle: Valkey {first[0]:.1f} -> {last[0]:.1f} MiB (empty: {baseline:.1f}, "
                  f"peak {peak_valkey:.1f}); workers {first[1]:.1f} -> {last[1]:.1f} MiB "
                  f"(peak {peak_rss:.1f})")
        assert mirrored == args.jobs, (mirrored, args.jobs)


if __name__ == "__main__":
    os.chdir(ROOT)
    main()
