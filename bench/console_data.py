"""What bench/console.py measures the console over: the history (1,000,000 rows, written as
multi-row INSERTs, and added to the charts' rollup as the mirror adds them), the live jobs
(20 queues × 5,000 waiting, a chord of 20,000, 1,000 running jobs of 64 KB, the dead jobs a
bulk retry retries) and the charts' full rollup (what 10,000,000 jobs or more would fill)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

QUEUES, HANDLERS, LANES = 5, 50, 1_000
SPAN = 30 * 86_400
"""Seconds the history covers (the newest row finished a second ago)."""
DEAD_EVERY = 50
"""Every 50th history row is dead (the others succeeded)."""
FLOW_JOBS = 20_000
STUCK_JOBS, STUCK_PAYLOAD = 1_000, 64 * 1024
CHART_PAIRS = 100
"""Queue × handler pairs the full rollup fills (5 queues × 20 handlers)."""


def history_row(n: int, count: int, now: datetime, fields: list[Any]) -> dict[str, Any]:
    """History row `n` of `count` (n = 0 the newest), spread evenly over SPAN."""
    finished = now - timedelta(seconds=1 + n * SPAN / count)
    run, wait = timedelta(milliseconds=5 + n % 997), timedelta(milliseconds=1 + n % 89)
    row: dict[str, Any] = dict.fromkeys(fields)
    row.update(
        id=f"JOB0{n:010d}", queue=f"q{n % QUEUES}", shard=0, lane=f"tenant-{n % LANES}",
        state="dead" if n % DEAD_EVERY == 0 else "succeeded", priority=0, attempts=1,
        max_attempts=3, last_error="boom" if n % DEAD_EVERY == 0 else "", unique_key=f"order-{n}",
        worker="w", durable=False, relayed=True, mirrored_at=finished, finished_at=finished,
        started_at=finished - run, enqueued_at=finished - run - wait,
        payload={"handler": f"app.jobs.h{n % HANDLERS}", "args": [n, "x"],
                 "kwargs": {"order": {"id": n, "city": f"city-{n % 300}"}, "email": f"user{n}@example.com"}},
    )
    return row


def build_history(count: int, now: datetime, batch: int = 5_000) -> float:
    """`count` history rows, `batch` to an INSERT, each batch added to the rollup as the mirror
    adds it (in the same transaction). Returns the seconds it took."""
    from django.db import transaction

    from jobqueue.history import rollup
    from jobqueue.models import insert_jobs, written_fields

    fields = [f.attname for f in written_fields()]
    started = time.perf_counter()
    for start in range(0, count, batch):
        rows = [history_row(n, count, now, fields) for n in range(start, min(count, start + batch))]
        with transaction.atomic():
            insert_jobs(rows)
            rollup.add(rows, now)
        if start and start % 200_000 == 0:
            print(f"  … {start:,} history rows ({time.perf_counter() - started:.0f} s)", flush=True)
    return time.perf_counter() - started


def build_waiting(queues: int = 20, each: int = 5_000) -> str:
    """`queues` queues of `each` waiting jobs, 50 lanes each; the id of the middle one of the
    8th queue."""
    from jobqueue import Queue
    from jobqueue.spec import JobSpec

    ids = []
    for n in range(queues):
        refs = Queue(f"queue-{n:02d}").enqueue_many(
            [JobSpec({"handler": "x", "args": [i], "kwargs": {}}, lane=f"t{i % 50}") for i in range(each)]
        )
        ids.append(refs[each // 2].id)
    return ids[7]


def build_flow() -> str:
    """A chord of FLOW_JOBS jobs and its callback; the callback's id."""
    from jobqueue import chord
    from project.demo.jobs import send_welcome_email

    return chord([send_welcome_email.s(i) for i in range(FLOW_JOBS)], send_welcome_email.s()).enqueue().id


def build_stuck() -> None:
    """STUCK_JOBS running jobs of STUCK_PAYLOAD bytes on one shard."""
    from jobqueue import Queue
    from jobqueue.spec import JobSpec

    queue = Queue("stuck")
    blob = "x" * STUCK_PAYLOAD
    for start in range(0, STUCK_JOBS, 100):
        queue.enqueue_many([JobSpec({"handler": "x", "args": [blob, i]}) for i in range(start, start + 100)])
    assert len(queue.dequeue(count=STUCK_JOBS, lease=3600)) == STUCK_JOBS


def build_dead(count: int) -> None:
    """`count` dead jobs in queue `bulk` (each failed once, fatally)."""
    from jobqueue import Queue
    from jobqueue.spec import JobSpec

    queue = Queue("bulk")
    for start in range(0, count, 5_000):
        queue.enqueue_many([JobSpec({"handler": "x", "args": [i], "kwargs": {"tenant": "a"}}, max_attempts=1)
                            for i in range(start, min(count, start + 5_000))])
    while leases := queue.dequeue(count=2_000, lease=3600):
        queue.leases.nack_many([(lease, "boom", None, True) for lease in leases])
    assert queue.counts()["dead"] == count, queue.counts()


def filled_rollup(now: datetime) -> int:
    """Every minute of 2 days, hour of 35 days and day of 30 days, for each of CHART_PAIRS
    queue × handler pairs and each queue's totals, with counts in a few bins each: the rollup
    of a history of 10,000,000 jobs or more (each bucket of each pair holds some)."""
    from jobqueue.history import rollup

    written = 0
    for resolution, count in ((rollup.MINUTE, 2 * 1440), (rollup.HOUR, 35 * 24), (rollup.DAY, 31)):
        last = int(now.timestamp()) // resolution * resolution
        for step in range(0, count, 100):
            added: dict[tuple[Any, ...], dict[str, int]] = {}
            for i in range(step, min(step + 100, count)):
                start = datetime.fromtimestamp(last - i * resolution, UTC)
                for pair, counts in _pair_counts(i):
                    queue = f"q{pair % QUEUES}"
                    added[resolution, start, queue, f"app.jobs.h{pair}"] = counts
                    total = added.setdefault((resolution, start, queue, rollup.TOTAL), {})
                    for column, n in counts.items():
                        total[column] = total.get(column, 0) + n
            rollup.write(added)
            written += len(added)
    return written


def _pair_counts(i: int) -> Iterator[tuple[int, dict[str, int]]]:
    for pair in range(CHART_PAIRS):
        yield pair, {"succeeded": 20 + pair, "dead": pair % 3, "retried": pair % 5, f"w{3 + pair % 9}": 15,
                     f"w{9 + i % 7}": 5, f"r{10 + pair % 11}": 17, f"r{20 + i % 9}": 3}
