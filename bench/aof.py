"""What an append-only file keeps when Valkey is SIGKILLed mid-enqueue: `appendfsync always`
against `everysec`. Enqueues run from a thread; Valkey is killed while they run, restarted from
its AOF, and every enqueue it had acknowledged is looked up.

    .venv/bin/python bench/aof.py [--seconds 3] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from _common import ROOT, django_setup


def one_round(fsync: str, seconds: float) -> tuple[int, int, float]:
    """(acknowledged, lost, enqueues/s) for one kill of a server running with `fsync`."""
    from django.conf import settings

    from jobqueue import Queue, conf
    from jobqueue.embedded import free_port, server_args, wait_until_up

    port = free_port()
    with tempfile.TemporaryDirectory() as data:
        args = server_args(port, Path(data), "--appendonly", "yes", "--appendfsync", fsync)
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL)
        wait_until_up(port)
        url = f"redis://127.0.0.1:{port}/0"
        settings.JOBQUEUE = {**settings.JOBQUEUE, "URL": url}
        conf.reset()
        queue = Queue("default")
        acknowledged: list[str] = []
        stop = threading.Event()

        def enqueue() -> None:
            while not stop.is_set():
                try:
                    acknowledged.append(queue.enqueue({"n": len(acknowledged)}).id)
                except Exception:  # the server died: what it acknowledged is counted
                    if not acknowledged:
                        raise
                    return

        thread = threading.Thread(target=enqueue)
        started = time.perf_counter()
        thread.start()
        time.sleep(seconds)
        proc.kill()  # SIGKILL: no shutdown, no final fsync
        proc.wait()
        elapsed = time.perf_counter() - started
        stop.set()
        thread.join()
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL)
        try:
            wait_until_up(port, timeout=60)
            conf.reset()
            queue = Queue("default")
            present = sum(1 for job_id in acknowledged if queue.locate(job_id) is not None)
        finally:
            proc.terminate()
            proc.wait(10)
        return len(acknowledged), len(acknowledged) - present, len(acknowledged) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    django_setup("redis://127.0.0.1:1/0")
    print(f"SIGKILL of Valkey while one thread enqueues, {args.rounds} rounds of {args.seconds} s")
    for fsync in ("always", "everysec"):
        for n in range(args.rounds):
            acked, lost, per_second = one_round(fsync, args.seconds)
            print(f"  appendfsync {fsync:<8} round {n + 1}: {acked:>7,} acknowledged, "
                  f"{lost} lost, {per_second:>7,.0f} enqueues/s")


if __name__ == "__main__":
    os.chdir(ROOT)
    main()
