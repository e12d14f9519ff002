"""Start-up of `runworker`: spawn to the first finished job, and the CPU the start costs.

Each run enqueues `--jobs` async no-op jobs (the peers' `atick`), spawns `manage.py runworker
--burst` with the bench settings (mirror into MariaDB on, from the venv of a deploy: as
bench/peers.py runs it), notes when the first job has finished (the job INCRs `bench:done`),
reads the CPU time the worker's processes (the mirror's, `--workers` children) have used by
then, and waits for the burst to end: the last column is the user+sys time of the worker and
every process it waited for, start to exit. CPU time moves less than wall time on a machine
others share. With `--baseline PATH` another checkout's code takes turns with this one's, run
after run, so both are measured in the same minutes.

With `--floor`, each run also times what every Django process that talks to Valkey through
redis-py pays before it could run a job, whatever its queue: `python -c` importing Django's
command line and setting Django up with the same settings (which imports the installed apps,
jobqueue and redis-py with them; `FLOORS` says how the collector is set); and the same for
django-vtasks' two-app project in this bench, from its own venv. The first job's time minus the
floor is what runworker itself adds.

    .venv/bin/python bench/startup.py [--runs 10] [--jobs 300] [--workers 1] [--baseline PATH]
                                      [--floor]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import time
from pathlib import Path

from _common import ROOT, compile_checkout, deployed_python, prepare_database, valkey

HERE = Path(__file__).resolve().parent
DATABASE_URL = "mysql://root@127.0.0.1:3306/jqstartup"


def env(url: str, root: Path) -> dict[str, str]:
    return {**os.environ, "BENCH_URL": url, "VALKEY_URL": url, "PYTHONPATH": f"{HERE}:{root}",
            "DJANGO_SETTINGS_MODULE": "bench_settings", "DATABASE_URL": DATABASE_URL}


def tree_cpu(pid: int) -> float:
    """CPU seconds so far of process `pid` and its descendants, every thread (Linux schedstat:
    nanoseconds, not the 10 ms ticks of /proc/PID/stat)."""
    total, pending = 0, [pid]
    while pending:
        tasks = Path(f"/proc/{pending.pop()}/task")
        try:
            for task in tasks.iterdir():
                total += int((task / "schedstat").read_text().split()[0])
                pending += [int(child) for child in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):  # (a thread or process ended meanwhile)
            continue
    return total / 1e9


def one_run(url: str, root: Path, jobs: int, workers: int, concurrency: int) -> tuple[float, float, float]:
    """Seconds from spawn to the first finished job; CPU seconds until then (the worker's
    processes); CPU seconds of the whole burst."""
    import redis

    client = redis.Redis.from_url(url)
    client.set("bench:done", 0)
    python = deployed_python("deploy")
    subprocess.run([python, "jq_enqueue.py", str(jobs), "bulk", "atick"],
                   env=env(url, root), cwd=HERE, check=True, capture_output=True)
    argv = [python, str(root / "manage.py"), "runworker", "--burst", "--workers", str(workers),
            "--concurrency", str(concurrency), "--log-level", "WARNING"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    spawned = time.perf_counter()
    proc = subprocess.Popen(argv, env=env(url, root), cwd=HERE, stdout=subprocess.DEVNULL)
    while int(client.get("bench:done") or 0) < 1:
        if proc.poll() is not None:
            raise RuntimeError(f"{root}: the worker exited ({proc.returncode}) before a job")
        time.sleep(0.001)
    first = time.perf_counter() - spawned
    cpu_first = tree_cpu(proc.pid)
    if proc.wait(120) != 0:
        raise RuntimeError(f"{root}: the worker exited with {proc.returncode}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return first, cpu_first, cpu


FLOORS = {
    "bench_settings": ("deploy", "import gc, os, django.core.management, django; gc.disable(); "
                                 "django.setup(); os._exit(0)"),
    "vtasks_settings": ("vtasks", "import os, django.core.management, django; django.setup(); "
                                  "os._exit(0)"),
}
"""Each floor's venv and process: Django's command line imported and Django set up, ending
there (`os._exit`: the interpreter's teardown is no part of anyone's start). For jobqueue's the
cyclic collector is off from `django.setup()` on, about where runworker's start turns it off
(as Django imports jobqueue); django-vtasks' start leaves it on."""


def floor_run(url: str, root: Path, settings: str) -> float:
    """Seconds from spawn to the end of the floor's process with `settings`."""
    venv, code = FLOORS[settings]
    spawned = time.perf_counter()
    subprocess.run([deployed_python(venv), "-c", code],
                   env={**env(url, root), "DJANGO_SETTINGS_MODULE": settings}, cwd=HERE, check=True)
    return time.perf_counter() - spawned


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=0, help="default: 128 / workers")
    parser.add_argument("--baseline", type=Path, help="another checkout, taking turns with this one")
    parser.add_argument("--floor", action="store_true",
                        help="also time Django's floor with these settings, and a two-app project's")
    parser.add_argument("--source", action="store_true",
                        help="compile no bytecode first (bytecode left by an earlier run is used)")
    args = parser.parse_args()
    concurrency = args.concurrency or 128 // args.workers
    roots = {"this": ROOT, **({"base": args.baseline.resolve()} if args.baseline else {})}
    if not args.source:
        for root in roots.values():
            compile_checkout(root)
    with valkey() as url:
        os.environ.update(env(url, ROOT))
        prepare_database(DATABASE_URL, ROOT)
        found: dict[str, list[tuple[float, float, float]]] = {name: [] for name in roots}
        floors: dict[str, list[float]] = {settings: [] for settings in FLOORS}
        for run in range(args.runs):
            for name, root in (roots.items() if run % 2 == 0 else reversed(roots.items())):
                found[name].append(one_run(url, root, args.jobs, args.workers, concurrency))
            for settings in floors if args.floor else ():
                floors[settings].append(floor_run(url, ROOT, settings))
    print(f"start-up, --workers {args.workers} --concurrency {concurrency}, {args.jobs} jobs waiting,"
          f" {args.runs} runs: spawn → first finished job (s), the workers' CPU until then (s), "
          f"CPU of the whole burst (s); min / median")
    for name, runs in found.items():
        walls, firsts, cpus = zip(*runs, strict=True)
        print(f"  {name:5} first job {min(walls):.3f} / {statistics.median(walls):.3f}"
              f" | CPU to it {min(firsts):.3f} / {statistics.median(firsts):.3f}"
              f" | CPU of the burst {min(cpus):.3f} / {statistics.median(cpus):.3f}")
    if args.floor:
        print("  floor, spawn → Django set up (s), min / median:")
        for settings, walls in floors.items():
            print(f"    {settings:16} {min(walls):.3f} / {statistics.median(walls):.3f}")
        first = statistics.median(w for w, _, _ in found["this"])
        print(f"  runworker's own, first job's median minus the bench settings' floor median:"
              f" {first - statistics.median(floors['bench_settings']):.3f} s")

if __name__ == "__main__":
    main()
