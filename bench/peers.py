"""jobqueue and its peers on the same Valkey, in one run: enqueue rate and processing rate.

Every system runs the same no-op job (INCR one counter) with one worker process of 8 threads
(RQ: its one-job-at-a-time SimpleWorker; BullMQ: concurrency 8 in Node). Processing is timed
from the first finished job to the last, so worker start-up does not count.

    .venv/bin/pip install -r bench/requirements.txt && (cd bench/node && npm install)
    .venv/bin/python bench/peers.py [--jobs 10000]
    JQ_BENCH_ARGS="--prefetch 24" .venv/bin/python bench/peers.py --only jobqueue   # tune jobqueue
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from _common import ROOT, valkey

HERE = Path(__file__).resolve().parent
PY = sys.executable


def env(url: str, **extra: str) -> dict[str, str]:
    return dict(os.environ, BENCH_URL=url, VALKEY_URL=url, PYTHONPATH=f"{HERE}:{ROOT}",
                DJANGO_SETTINGS_MODULE="bench_settings", **extra)


class Peer:
    """One system under test: how to enqueue N jobs, and how to start its worker."""

    name = ""
    bulk = False

    def __init__(self, url: str) -> None:
        self.url = url

    def enqueue(self, n: int, single: bool) -> None:
        raise NotImplementedError

    def worker(self) -> list[str]:
        raise NotImplementedError

    def worker_env(self) -> dict[str, str]:
        return env(self.url)


class JobQueuePeer(Peer):
    name, bulk = "jobqueue", True

    def enqueue(self, n: int, single: bool) -> None:
        from benchapp.jobs import tick

        if single:
            for _ in range(n):
                tick.enqueue()
        else:
            tick.enqueue_many([() for _ in range(n)])

    def worker(self) -> list[str]:
        return [PY, str(ROOT / "manage.py"), "runworker", "--concurrency", "8", "--no-mirror",
                "--log-level", "WARNING", *os.environ.get("JQ_BENCH_ARGS", "").split()]


class CeleryPeer(Peer):
    name = "celery"

    def enqueue(self, n: int, single: bool) -> None:
        import peer_tasks

        app = peer_tasks.celery_app()
        task = app.tasks["tick"]
        for _ in range(n):
            task.delay()

    def worker(self) -> list[str]:
        return [PY, "-m", "celery", "-A", "peer_tasks", "worker", "-P", "threads", "-c", "8",
                "--without-heartbeat", "--without-gossip", "--without-mingle", "-l", "WARNING"]

    def worker_env(self) -> dict[str, str]:
        return env(self.url, PEER="celery")


class RQPeer(Peer):
    name, bulk = "rq", True

    def enqueue(self, n: int, single: bool) -> None:
        import peer_tasks
        from redis import Redis
        from rq import Queue

        queue = Queue("bench", connection=Redis.from_url(self.url))
        if single:
            for _ in range(n):
                queue.enqueue(peer_tasks.tick)
        else:
            for start in range(0, n, 1000):
                queue.enqueue_many([Queue.prepare_data(peer_tasks.tick)
                                    for _ in range(min(1000, n - start))])

    def worker(self) -> list[str]:
        return [PY, "-m", "rq.cli", "worker", "-w", "rq.worker.SimpleWorker", "--url", self.url,
                "--logging_level", "WARNING", "bench"]


class DramatiqPeer(Peer):
    name = "dramatiq"

    def enqueue(self, n: int, single: bool) -> None:
        import peer_tasks

        actor = peer_tasks.dramatiq_actor()
        for _ in range(n):
            actor.send()

    def worker(self) -> list[str]:
        return [PY, "-m", "dramatiq", "peer_tasks", "--processes", "1", "--threads", "8"]

    def worker_env(self) -> dict[str, str]:
        return env(self.url, PEER="dramatiq")


class HueyPeer(Peer):
    name = "huey"

    def enqueue(self, n: int, single: bool) -> None:
        import peer_tasks

        _, task = peer_tasks.huey_app()
        for _ in range(n):
            task()

    def worker(self) -> list[str]:
        return [PY, "-m", "huey.bin.huey_consumer", "peer_tasks.huey", "-w", "8", "-k", "thread",
                "-q"]

    def worker_env(self) -> dict[str, str]:
        return env(self.url, PEER="huey")


class BullMQPeer(Peer):
    name, bulk = "bullmq", True

    def enqueue(self, n: int, single: bool) -> None:
        args = ["node", str(HERE / "node" / "peer.js"), "enqueue", str(n)]
        subprocess.run(args + (["single"] if single else []), env=env(self.url), check=True,
                       capture_output=True)

    def worker(self) -> list[str]:
        return ["node", str(HERE / "node" / "peer.js"), "work", "8"]


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def measure(peer: Peer, n: int) -> dict[str, float]:
    import redis

    client = redis.Redis.from_url(peer.url)
    out: dict[str, float] = {}
    client.flushall()
    out["enqueue_single"] = n / timed(lambda: peer.enqueue(n, single=True))
    if peer.bulk:
        client.flushall()
        out["enqueue_bulk"] = n / timed(lambda: peer.enqueue(n, single=False))
    client.set("bench:done", 0)
    proc = subprocess.Popen(peer.worker(), env=peer.worker_env(), cwd=HERE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 600
        while int(client.get("bench:done") or 0) < 1:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"{peer.name}: worker never ran a job")
            time.sleep(0.001)
        first, done = time.perf_counter(), 1
        while done < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{peer.name}: {done}/{n} after 600 s")
            time.sleep(0.005)
            done = int(client.get("bench:done") or 0)
        out["process"] = (n - 1) / (time.perf_counter() - first)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--only", help="comma-separated peer names")
    args = parser.parse_args()
    peers = [JobQueuePeer, CeleryPeer, RQPeer, DramatiqPeer, HueyPeer, BullMQPeer]
    if args.only:
        peers = [p for p in peers if p.name in args.only.split(",")]
    with valkey() as url:
        for key, value in env(url).items():
            os.environ.setdefault(key, value)
        os.environ["BENCH_URL"] = os.environ["VALKEY_URL"] = url
        sys.path[:0] = [str(HERE), str(ROOT)]
        import django

        django.setup()
        results = {p.name: measure(p(url), args.jobs) for p in peers}
    base = results.get("jobqueue", {})
    print(f"\n{args.jobs:,} no-op jobs, one valkey-server, one worker process (8 threads)")
    print(f"  {'system':<10} {'enqueue 1/call':>15} {'enqueue bulk':>13} {'process':>10}"
          f"   jobqueue ÷ system (process)")
    for name, r in results.items():
        ratio = base.get("process", 0) / r["process"] if r.get("process") else 0
        bulk = f"{r['enqueue_bulk']:>13,.0f}" if "enqueue_bulk" in r else f"{'—':>13}"
        print(f"  {name:<10} {r['enqueue_single']:>15,.0f} {bulk} {r['process']:>10,.0f}"
              f"   {ratio:5.2f}×")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
