"""A cProfile of one worker at concurrency 1 (or `--concurrency N`) over N waiting jobs, every
thread profiled (the job runs on a runner thread, or on the event loop's for an `async def`
handler: Python 3.12's cProfile sees every thread through sys.monitoring); `--cpu` prints the
worker process's CPU per job (user and system) and its context switches instead:

    .venv/bin/python bench/profile_c1.py [--jobs 20000] [--handler noop] [--top 40]
        [--concurrency 1] [--cpu]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import resource
import sys
import time

from _common import valkey

if "--root" in sys.argv:  # (another checkout's code: before anything imports jobqueue)
    sys.path.insert(0, sys.argv[sys.argv.index("--root") + 1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--handler", default="noop")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--root", help="the checkout whose code runs (default: this one)")
    parser.add_argument("--sort", default="tottime")
    parser.add_argument("--cpu", action="store_true",
                        help="no profile: print the worker's CPU per job (its process, no start-up)")
    args = parser.parse_args()
    with valkey() as url:
        os.environ.update(VALKEY_URL=url, BENCH_URL=url, DJANGO_SETTINGS_MODULE="bench_settings")
        import django

        django.setup()
        from benchapp import jobs

        import jobqueue
        from jobqueue.worker.core import Worker
        from jobqueue.worker.serving import WorkerConfig

        getattr(jobs, args.handler).enqueue_many([() for _ in range(args.jobs)])
        worker = Worker(WorkerConfig(concurrency=args.concurrency, burst=True, mirror=False))
        profile = cProfile.Profile()
        usage, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        if not args.cpu:
            profile.enable()
        worker.run()
        profile.disable()
        wall, after = time.perf_counter() - wall, resource.getrusage(resource.RUSAGE_SELF)
    if args.cpu:
        def per_job(field: str) -> float:
            return (getattr(after, field) - getattr(usage, field)) / args.jobs

        user, system = per_job("ru_utime") * 1e6, per_job("ru_stime") * 1e6
        print(f"{jobqueue.__file__.rsplit('/', 2)[0]}: {user + system:.1f} µs CPU per job "
              f"(user {user:.1f}, system {system:.1f}; worker process, Valkey apart), "
              f"{per_job('ru_nvcsw') + per_job('ru_nivcsw'):.2f} context switches per job, "
              f"{args.jobs / wall:,.0f} jobs/s")
    else:
        pstats.Stats(profile).sort_stats(args.sort).print_stats(args.top)


if __name__ == "__main__":
    main()
