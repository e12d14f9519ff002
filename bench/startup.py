"""Start-up of `runworker`: spawn to the first finished job, and the CPU the start costs.

Each run enqueues `--jobs` async no-op jobs (the peers' `atick`), spawns `manage.py runworker
--burst` with the bench settings (mirror into MariaDB on, as bench/peers.py runs it), notes when
the first job has finished (the job INCRs `bench:done`), and waits for the burst to end: the CPU
column is the user+sys time of the worker and every process it waited for (the mirror's
process, `--workers` children), start to exit. With `--baseline PATH` another checkout's code
takes turns with this one's, run after run, so both are measured in the same minutes.

    .venv/bin/python bench/startup.py [--runs 10] [--jobs 300] [--workers 1] [--baseline PATH]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _common import ROOT, compile_checkout, prepare_database, valkey

HERE = Path(__file__).resolve().parent
DATABASE_URL = "mysql://root@127.0.0.1:3306/jqstartup"


def env(url: str, root: Path) -> dict[str, str]:
    return {**os.environ, "BENCH_URL": url, "VALKEY_URL": url, "PYTHONPATH": f"{HERE}:{root}",
            "DJANGO_SETTINGS_MODULE": "bench_settings", "DATABASE_URL": DATABASE_URL}


def one_run(url: str, root: Path, jobs: int, workers: int, concurrency: int) -> tuple[float, float]:
    """Seconds from spawn to the first finished job; CPU seconds of the whole burst."""
    import redis

    client = redis.Redis.from_url(url)
    client.set("bench:done", 0)
    subprocess.run([sys.executable, "jq_enqueue.py", str(jobs), "bulk", "atick"],
                   env=env(url, root), cwd=HERE, check=True, capture_output=True)
    argv = [sys.executable, str(root / "manage.py"), "runworker", "--burst", "--workers", str(workers),
            "--concurrency", str(concurrency), "--log-level", "WARNING"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    spawned = time.perf_counter()
    proc = subprocess.Popen(argv, env=env(url, root), cwd=HERE, stdout=subprocess.DEVNULL)
    while int(client.get("bench:done") or 0) < 1:
        if proc.poll() is not None:
            raise RuntimeError(f"{root}: the worker exited ({proc.returncode}) before a job")
        time.sleep(0.001)
    first = time.perf_counter() - spawned
    if proc.wait(120) != 0:
        raise RuntimeError(f"{root}: the worker exited with {proc.returncode}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return first, cpu


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=0, help="default: 128 / workers")
    parser.add_argument("--baseline", type=Path, help="another checkout, taking turns with this one")
    parser.add_argument("--source", action="store_true",
                        help="no bytecode compiled first (under PYTHONDONTWRITEBYTECODE=1, each start "
                             "compiles the checkout's modules)")
    args = parser.parse_args()
    concurrency = args.concurrency or 128 // args.workers
    roots = {"this": ROOT, **({"base": args.baseline.resolve()} if args.baseline else {})}
    if not args.source:
        for root in roots.values():
            compile_checkout(root)
    with valkey() as url:
        os.environ.update(env(url, ROOT))
        prepare_database(DATABASE_URL, ROOT)
        found: dict[str, list[tuple[float, float]]] = {name: [] for name in roots}
        for run in range(args.runs):
            for name, root in (roots.items() if run % 2 == 0 else reversed(roots.items())):
                found[name].append(one_run(url, root, args.jobs, args.workers, concurrency))
    print(f"start-up, --workers {args.workers} --concurrency {concurrency}, {args.jobs} jobs waiting,"
          f" {args.runs} runs: spawn → first finished job (s), CPU of the whole burst (s)")
    for name, runs in found.items():
        walls, cpus = [w for w, _ in runs], [c for _, c in runs]
        print(f"  {name:5} first job min {min(walls):.3f} median {statistics.median(walls):.3f}"
              f" max {max(walls):.3f} | CPU min {min(cpus):.3f} median {statistics.median(cpus):.3f}")


if __name__ == "__main__":
    main()
