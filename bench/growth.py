"""How costs grow: claim latency with 1k, 100k and 1M waiting jobs, with 1 and 10,000 lanes,
with payloads of 100 B and 100 KB, and an idle worker's CPU.

A claim here is one `dequeue(count=1)` then its `ack`, one at a time from one client, as an idle
worker's first job after a wake; p50/p99 are the client's wall time per claim + ack, and
"Valkey µs" the server's own time per script call (INFO commandstats). Flat columns mean the
cost does not grow with the backlog.

    .venv/bin/python bench/growth.py [--samples 2000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _common import ROOT, django_setup, valkey

BATCH = 10_000


def fill(queue: Any, n: int, payload: Any, lanes: int = 1) -> float:
    """Enqueue n waiting jobs in bulk (spread over `lanes` lanes); jobs/s."""
    from jobqueue.spec import JobSpec

    started = time.perf_counter()
    for start in range(0, n, BATCH):
        queue.enqueue_many([JobSpec(payload, lane=f"tenant-{i % lanes}" if lanes > 1 else None)
                            for i in range(start, min(start + BATCH, n))])
    return n / (time.perf_counter() - started)


def claims(queue: Any, samples: int) -> tuple[float, float, float]:
    """p50 and p99 µs of one claim + ack, and Valkey's µs per script call meanwhile."""
    client = queue.client
    client.config_resetstat()
    took = []
    for _ in range(samples):
        started = time.perf_counter()
        [lease] = queue.dequeue(count=1, worker="growth")
        queue.ack(lease)
        took.append((time.perf_counter() - started) * 1e6)
    stats = client.info("commandstats").get("cmdstat_evalsha", {})
    took.sort()
    return statistics.median(took), took[int(0.99 * (len(took) - 1))], stats.get("usec_per_call", 0.0)


def idle_cpu(url: str, seconds: float = 10.0) -> float:
    """Share of one core an idle `runworker` uses, measured after it settled."""
    env = {**os.environ, "VALKEY_URL": url, "DJANGO_SETTINGS_MODULE": "project.settings"}
    proc = subprocess.Popen([sys.executable, str(ROOT / "manage.py"), "runworker", "--workers", "1",
                             "--no-mirror", "--log-level", "WARNING"], env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(5)  # started and idle

        def cpu() -> float:
            fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

        before = cpu()
        time.sleep(seconds)
        return (cpu() - before) / seconds
    finally:
        proc.terminate()
        proc.wait(30)


def case(label: str, samples: int, waiting: int, payload: Any, lanes: int = 1) -> tuple[Any, ...]:
    """One row, on a Valkey of its own (what the previous case left cannot slow this one)."""
    from jobqueue import Queue
    from jobqueue.conf import client_for_url

    with valkey() as url:
        queue = Queue("growth", client=client_for_url(url))
        filled = fill(queue, waiting + samples, payload, lanes)
        return (label, filled, *claims(queue, samples))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=2000)
    args = parser.parse_args()
    n = args.samples
    small = {"handler": "bench.noop", "args": ["x" * 60]}  # ~100 bytes of JSON
    big = {"handler": "bench.noop", "args": ["x" * 100_000]}
    with valkey() as url:
        django_setup(url)
        rows = [case(f"{w:,} waiting, 1 lane", n, w, small) for w in (1_000, 100_000, 1_000_000)]
        rows.append(case("100,000 waiting, 10,000 lanes", n, 100_000, small, lanes=10_000))
        rows.append(case("1,000 waiting, payload 100 KB", n, 1_000, big))
        print(f"\nclaim + ack, one at a time ({n:,} samples each; payloads ~100 B unless said)")
        print(f"  {'case':<32} {'enqueue jobs/s':>14} {'p50 µs':>8} {'p99 µs':>8} {'Valkey µs/call':>15}")
        for label, filled, p50, p99, server in rows:
            print(f"  {label:<32} {filled:>14,.0f} {p50:>8,.0f} {p99:>8,.0f} {server:>15,.1f}")
        print(f"\nidle worker: {idle_cpu(url):.2%} of a core")


if __name__ == "__main__":
    main()
