"""The mirror's CPU per row, in isolation: a queue's `done` stream filled with real terminal
events (jobs enqueued, claimed and acknowledged through the store, no mirror running), then
`Mirror.step()` timed in-process (`time.process_time`, the least of `--repeat` times) into
MariaDB, whose own CPU (its `/proc` stat) is counted beside it (other clients of the same server
count too). Each time puts the same events back into the stream and empties the table, so every
time inserts the same rows.

    .venv/bin/python bench/mirror_rows.py [--rows 20000] [--batches 1000,50] [--rounds 3]
                                          [--repeat 3] [--roots ../other-checkout,.] [--profile 50]

`--roots`: checkouts measured in turn, alternating, each round (each in a process of its own).
`--profile B`: instead, a cProfile of one round at batch B in this checkout.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _common import ROOT, prepare_database, valkey
from c1 import mariadb_cpu

HERE = Path(__file__).resolve().parent
DATABASE_URL = "mysql://root@127.0.0.1:3306/jq_mirror"
QUEUE = "mirrorbench"


def fill(rows: int) -> list[tuple[str, dict[str, str]]]:
    """Run `rows` jobs through enqueue, claim and ack; the done stream's entries they left."""
    from jobqueue import Queue
    from jobqueue.spec import JobSpec

    queue = Queue(QUEUE)
    queue.client.flushall()
    for start in range(0, rows, 1000):
        queue.enqueue_many([JobSpec({"handler": "bench.jobs.h", "args": [n, "it's \\ \"quoted\" é"],
                                     "kwargs": {}})
                            for n in range(start, min(start + 1000, rows))])
    while leases := queue.dequeue(count=500, worker="bench"):
        queue.ack_many([(lease, {"ok": lease.job_id}) for lease in leases])
    stream = queue.shard(0).key("done")
    return list(queue.client.xrange(stream))


def one_round(entries: list[tuple[str, dict[str, str]]], batch: int,
              profiler: Any = None) -> tuple[float, float]:
    """Client and MariaDB CPU seconds to mirror `entries` at `batch` rows a read (under
    `profiler`, a cProfile.Profile, when given)."""
    from django.db import connection

    try:
        from jobqueue.history.mirror import Mirror
    except ImportError:  # a checkout from before the rooms (--baseline, --roots)
        from jobqueue.mirror import Mirror
    from jobqueue import Queue

    queue = Queue(QUEUE)
    stream = queue.shard(0).key("done")
    queue.client.delete(stream)
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM jobqueue_job")
    mirror = Mirror([queue], consumer="bench", batch=batch)
    mirror.step()  # (an empty stream: the group is made, and the first pass's takeover is done)
    pipe = queue.client.pipeline(transaction=False)
    for _, fields in entries:
        pipe.xadd(stream, fields)
    pipe.execute()
    db0, cpu0 = mariadb_cpu(), time.process_time()
    written = profiler.runcall(mirror.step) if profiler else mirror.step()
    cpu, db = time.process_time() - cpu0, mariadb_cpu() - db0
    assert written == len(entries), (written, len(entries))
    return cpu, db


def inner(args: argparse.Namespace) -> None:
    """In one checkout's process: fill once, then time each batch size (JSON on stdout)."""
    sys.path.insert(0, args.root)  # (before _common's: this run measures that checkout)
    import django

    os.environ.update(DJANGO_SETTINGS_MODULE="project.settings", DATABASE_URL=DATABASE_URL)
    django.setup()
    entries = fill(args.rows)
    out = {}
    for batch in args.batches:  # (the least of a few: other processes' load only adds)
        cpu, db = map(min, zip(*(one_round(entries, batch) for _ in range(args.repeat)),
                               strict=True))
        out[batch] = (cpu * 1e6 / len(entries), db * 1e6 / len(entries))
    import jobqueue

    assert Path(jobqueue.__file__).is_relative_to(args.root), jobqueue.__file__
    print(json.dumps(out))


def profile(args: argparse.Namespace) -> None:
    import cProfile
    import pstats

    import django

    os.environ.update(DJANGO_SETTINGS_MODULE="project.settings", DATABASE_URL=DATABASE_URL)
    django.setup()
    entries = fill(args.rows)
    profiler = cProfile.Profile(time.process_time)  # (CPU: a query's wait is not its cost)
    one_round(entries, args.profile, profiler)
    pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--batches", default="1000,50")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--roots", default=str(ROOT))
    parser.add_argument("--profile", type=int, default=0)
    parser.add_argument("--inner", action="store_true")
    parser.add_argument("--root", default=str(ROOT))
    args = parser.parse_args()
    args.batches = [int(b) for b in args.batches.split(",")]
    if args.inner:
        return inner(args)
    roots = [Path(r).resolve() for r in args.roots.split(",")]
    with valkey() as url:
        os.environ.update(VALKEY_URL=url, DATABASE_URL=DATABASE_URL,
                          DJANGO_SETTINGS_MODULE="project.settings")
        prepare_database(DATABASE_URL, roots[0])
        if args.profile:
            return profile(args)
        results: dict[str, list[dict[str, list[float]]]] = {str(r): [] for r in roots}
        for _ in range(args.rounds):
            for root in roots:
                env = {**os.environ, "PYTHONPATH": f"{root}"}
                argv = [sys.executable, str(HERE / "mirror_rows.py"), "--inner", "--root",
                        str(root), "--repeat", str(args.repeat), "--rows", str(args.rows),
                        "--batches", ",".join(map(str, args.batches))]
                out = subprocess.run(argv, env=env, cwd=root, capture_output=True, text=True)
                if out.returncode:
                    sys.exit(out.stderr)
                results[str(root)].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"\nmirror CPU per row, {args.rows:,} rows, µs (client / MariaDB), each round")
    for root, rounds in results.items():
        for batch in args.batches:
            cells = "  ".join(f"{r[str(batch)][0]:5.1f} / {r[str(batch)][1]:4.1f}" for r in rounds)
            print(f"  {root:<24} batch {batch:>5}:  {cells}")


if __name__ == "__main__":
    main()
