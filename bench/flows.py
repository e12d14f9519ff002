"""Flows: a chord of N members through real workers, against one local valkey-server, with
BullMQ's FlowProducer (a parent with N children) and Celery's chord (Valkey as its broker and
result backend) as references when they are installed.

For each system and round: the fan-out's rate (N over the time from the enqueue to the
callback's start) and the gap from the last member's finish to the callback's start (members
return when they finished; the callback compares with its own start). For jobqueue also:
`result()`'s wake-up latency after its job's finish (the row's finished_at, on the same clock),
and the same chord with its callback on another queue (`report`, served by a worker of its own:
a flow across queues, each member's "done" relayed to the callback's queue).

The chord across queues is measured as issue 36 describes its usual shape: the fan-out on a
worker pool of its own (`runworker --queues default`), the callback on another queue served by
other workers (a second `runworker --queues report`, a process of its own, idle until the
callback comes). Both rows count the same span (the chord's enqueue to its callback's start),
on the same machine: the second pays for the relay (each member's outcome written to its shard's
`:outcomes` stream, delivered on `report` by the members' worker's relay thread) and for the
second process.

    .venv/bin/python bench/flows.py [--members 1000] [--rounds 5] [--concurrency 16] [--no-peers]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from _common import ROOT, valkey

HERE = Path(__file__).resolve().parent
Round = tuple[float, float]
"""(jobs/s through the fan-out, ms from the last member's finish to the callback's start)."""


def env(url: str, **extra: str) -> dict[str, str]:
    return {**os.environ, "BENCH_URL": url, "VALKEY_URL": url, "PYTHONPATH": f"{HERE}:{ROOT}",
            "DJANGO_SETTINGS_MODULE": "bench_settings", **extra}


@contextmanager
def started(argv: list[str], environ: dict[str, str]) -> Iterator[None]:
    proc = subprocess.Popen(argv, cwd=ROOT, env=environ, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        yield
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def worker_of(queue: str, concurrency: int) -> list[str]:
    return [sys.executable, "manage.py", "runworker", "--workers", "1", "--queues", queue,
            "--concurrency", str(concurrency)]


def chord_rounds(members: int, rounds: int, callback_queue: str) -> list[Round]:
    """The chord's rounds, its callback on `callback_queue` (its members on `default`)."""
    from benchapp import jobs

    from jobqueue import chord

    out: list[Round] = []
    callback = jobs.flow_callback.using(queue=callback_queue)
    for _ in range(rounds):
        t0 = time.time()
        ref = chord([jobs.flow_member.s(i) for i in range(members)], callback.s()).enqueue()
        got = ref.result(timeout=600)
        out.append((members / (got["started"] - t0), got["gap_ms"]))
    return out


def jobqueue_rounds(url: str, members: int, rounds: int, concurrency: int
                    ) -> tuple[list[Round], list[Round], list[float]]:
    """The chord's rounds, those of the chord whose callback is on another queue, then
    result()'s wake-up latencies (ms)."""
    os.environ.update(env(url))
    # (the mirror's database, the project's or DATABASE_URL's, migrated: a checkout compared
    # with another must write the same history, not fail to)
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env(url),
                   check=True)
    import django

    django.setup()
    from benchapp import jobs

    from jobqueue import get_job

    with started(worker_of("default", concurrency), env(url)):
        jobs.noop.enqueue().result(timeout=60)  # the worker is up
        out = chord_rounds(members, rounds, "default")
        with started(worker_of("report", concurrency), env(url)):
            jobs.noop.using(queue="report").enqueue().result(timeout=60)  # (and known)
            across = chord_rounds(members, rounds, "report")
        wakes = []
        for _ in range(200):
            ref = jobs.noop.enqueue()
            ref.result(timeout=60)
            woke = time.time()
            info = get_job(ref.id)
            if info is not None and info.finished_at is not None:
                wakes.append((woke - info.finished_at.timestamp()) * 1000)
    return out, across, wakes


def bullmq_rounds(url: str, members: int, rounds: int, concurrency: int) -> list[Round]:
    reply = subprocess.run(["node", str(HERE / "node" / "flows.js"), str(members), str(rounds),
                            str(concurrency)], env=env(url), capture_output=True, text=True,
                           timeout=1800, check=True)
    return [(members / r["seconds"], r["gap_ms"]) for r in json.loads(reply.stdout)["rounds"]]


def celery_rounds(url: str, members: int, rounds: int, concurrency: int) -> list[Round]:
    import peer_tasks
    from celery import chord as celery_chord

    app = peer_tasks.celery_flow_app(url)
    member, callback = app.tasks["flow_member"], app.tasks["flow_callback"]
    worker = [sys.executable, "-m", "celery", "-A", "peer_tasks", "worker", "-P", "threads",
              "-c", str(concurrency), "--without-gossip", "--without-mingle"]
    out: list[Round] = []
    with started(worker, env(url, PEER="celery-flows")):
        for _ in range(rounds):
            t0 = time.time()
            result = celery_chord(member.s(i) for i in range(members))(callback.s())
            got = result.get(timeout=600)
            out.append((members / (got["started"] - t0), got["gap_ms"]))
    return out


def show(name: str, rows: list[Round]) -> None:
    rates, gaps = [r for r, _ in rows], [g for _, g in rows]
    print(f"  {name:<26} {statistics.median(rates):>10,.0f} jobs/s   gap p50 "
          f"{statistics.median(gaps):>8.2f} ms   max {max(gaps):>8.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--members", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--no-peers", action="store_true")
    args = parser.parse_args()
    peers: list[tuple[str, Callable[[str, int, int, int], list[Round]]]] = []
    if not args.no_peers and shutil.which("node") and (HERE / "node" / "node_modules").exists():
        peers.append(("BullMQ FlowProducer", bullmq_rounds))
    if not args.no_peers:
        try:
            import celery  # noqa: F401
        except ImportError:
            pass
        else:
            peers.append(("Celery chord", celery_rounds))
    print(f"\nA chord of {args.members} members, {args.rounds} rounds, concurrency "
          f"{args.concurrency} (median over rounds)")
    with valkey() as url:
        rows, across, wakes = jobqueue_rounds(url, args.members, args.rounds, args.concurrency)
        show("jobqueue chord", rows)
        show("jobqueue chord, 2 queues", across)
    for name, run in peers:
        with valkey() as url:
            show(name, run(url, args.members, args.rounds, args.concurrency))
    wakes.sort()
    print(f"\njobqueue result() wake-up after the job's finish: p50 {statistics.median(wakes):.2f} ms, "
          f"p95 {wakes[int(0.95 * (len(wakes) - 1))]:.2f} ms ({len(wakes)} jobs)")


if __name__ == "__main__":
    main()
