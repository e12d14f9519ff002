"""A cProfile of one worker at concurrency 1 over N waiting jobs, every thread profiled (the
job runs on a runner thread, or on the event loop's for an `async def` handler: Python 3.12's
cProfile sees every thread through sys.monitoring):

    .venv/bin/python bench/profile_c1.py [--jobs 20000] [--handler noop] [--top 40]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats

from _common import valkey


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--handler", default="noop")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--sort", default="tottime")
    args = parser.parse_args()
    with valkey() as url:
        os.environ.update(VALKEY_URL=url, BENCH_URL=url, DJANGO_SETTINGS_MODULE="bench_settings")
        import django

        django.setup()
        from benchapp import jobs

        from jobqueue.worker.core import Worker
        from jobqueue.worker.serving import WorkerConfig

        getattr(jobs, args.handler).enqueue_many([() for _ in range(args.jobs)])
        profile = cProfile.Profile()
        profile.enable()
        Worker(WorkerConfig(concurrency=1, burst=True, mirror=False)).run()
        profile.disable()
    pstats.Stats(profile).sort_stats(args.sort).print_stats(args.top)


if __name__ == "__main__":
    main()
