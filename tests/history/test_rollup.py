"""The history charts' rollup: the mirror's batches counted per minute and hour, queue and
handler, percentiles read from the histograms within a bin, the same counts built again from the
history rows (`manage.py jobqueue rollup`), old rows pruned."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.core.management import call_command

from jobqueue.console import history
from jobqueue.history import rollup
from jobqueue.history.mirror import upsert
from jobqueue.models import ALL_COUNTS, Job, Rollup
from tests.jobapp import jobs
from tests.workers import run_burst

pytestmark = pytest.mark.django_db(transaction=True)
NOW = datetime.now(UTC).replace(second=30, microsecond=0)
PRECISION = 2**0.25
"""A histogram's percentile is within this factor of the exact one (bins √2 apart)."""


def ms(moment: datetime) -> str:
    return str(int(moment.timestamp() * 1000))


def event(
    n: int, handler: str, state: str, wait_ms: float, run_ms: float, finished: datetime, attempts: int = 1
) -> dict[str, str]:
    started = finished - timedelta(milliseconds=run_ms)
    return {
        "id": f"JOB{n:011d}",
        "state": state,
        "attempts": str(attempts),
        "payload": f'{{"handler":"{handler}","args":[{n}]}}',
        "enqueued_at": ms(started - timedelta(milliseconds=wait_ms)),
        "started_at": ms(started),
        "finished_at": ms(finished),
    }


def exact(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(fraction * len(ordered))) - 1]


def test_known_events_give_their_counts_and_percentiles_within_a_bin() -> None:
    runs = [5.0 + i * 7.3 for i in range(200)]  # 5 ms … 1.46 s
    waits = [1.0 + (i * 37) % 400 for i in range(200)]
    batch = [
        event(i, "app.jobs.send", "succeeded", waits[i], runs[i], NOW - timedelta(minutes=i % 3))
        for i in range(200)
    ]
    batch += [event(1000 + i, "app.jobs.send", "dead", 10, 10, NOW, attempts=3) for i in range(4)]
    batch += [event(2000, "app.jobs.other", "cancelled", 10, 10, NOW)]
    assert upsert(batch[:100], "default") == 100 and upsert(batch[100:], "default") == 105
    waiting = {**event(3000, "app.jobs.send", "succeeded", 1, 1, NOW), "state": "waiting"}
    upsert([waiting], "default")  # a dependent revived to wait: not a finish

    hour = Rollup.objects.filter(resolution=rollup.HOUR).exclude(handler=rollup.TOTAL)
    totals = Rollup.objects.filter(resolution=rollup.DAY, handler=rollup.TOTAL)
    assert sum(r.succeeded for r in totals) == 200 and sum(r.dead for r in totals) == 4
    assert sum(r.succeeded for r in hour) == 200 and sum(r.dead for r in hour) == 4
    assert sum(r.retried for r in hour) == 8 and sum(r.cancelled for r in hour) == 1
    minutes = Rollup.objects.filter(resolution=rollup.MINUTE, handler="app.jobs.send")
    assert sorted(r.start for r in minutes)[-1] == NOW.replace(second=0)
    assert sum(r.succeeded for r in minutes) == 200

    points = history.series(history.RANGES["hour"], NOW, handler="app.jobs.send")
    assert points.counts["succeeded"][-3:] == [66, 67, 67] and points.counts["dead"][-1] == 4
    rows = {r["handler"]: r for r in history.totals(history.RANGES["day"], NOW)}
    send = rows["app.jobs.send"]
    assert (send["succeeded"], send["dead"], send["retried"]) == (200, 4, 8)
    run_times, wait_times = [*runs, *[10.0] * 4], [*waits, *[10.0] * 4]
    for name, fraction in history.QUANTILES:
        for got, values in ((send[f"run_{name}"], run_times), (send[f"wait_{name}"], wait_times)):
            want = exact(values, fraction)
            assert want / PRECISION <= got <= want * PRECISION, (name, got, want)
    assert rows["app.jobs.other"]["cancelled"] == 1


def test_the_rollup_built_again_from_the_history_is_the_same() -> None:
    batch = [
        event(
            i,
            f"app.jobs.h{i % 3}",
            "succeeded" if i % 5 else "dead",
            i * 3.0,
            i * 11.0,
            NOW - timedelta(minutes=i * 7),
        )
        for i in range(300)
    ]
    upsert(batch, "default")
    upsert([event(5000 + i, "app.jobs.h0", "succeeded", 1, 2, NOW) for i in range(10)], "emails")
    before = _snapshot()
    Rollup.objects.all().delete()
    call_command("jobqueue", "rollup")
    assert _snapshot() == before
    call_command("jobqueue", "rollup", "--days", "1")  # the last day only: the same again
    assert _snapshot() == before


def _snapshot() -> dict[tuple[Any, ...], tuple[int, ...]]:
    columns = ALL_COUNTS
    return {
        (r["resolution"], r["start"], r["queue"], r["handler"]): tuple(r[c] for c in columns)
        for r in Rollup.objects.values()
    }


def test_old_rows_are_pruned_minutes_before_hours() -> None:
    upsert(
        [
            event(1, "h", "succeeded", 1, 1, NOW - timedelta(days=3)),
            event(2, "h", "succeeded", 1, 1, NOW - timedelta(days=100)),
        ],
        "default",
    )
    assert Rollup.objects.count() == 12  # (minute, hour, day) × (handler, queue's total) × 2
    assert rollup.prune(NOW) == 6  # the minutes of both, the hours of the 100 days old one
    kept = {(r.resolution, r.start.date()) for r in Rollup.objects.all()}
    assert kept == {
        (rollup.HOUR, (NOW - timedelta(days=3)).date()),
        (rollup.DAY, (NOW - timedelta(days=3)).date()),
        (rollup.DAY, (NOW - timedelta(days=100)).date()),
    }


def test_jobs_a_worker_runs_are_counted_as_its_mirror_writes_them(valkey_server: Any) -> None:
    jobs.add.enqueue_many([(i, i) for i in range(20)])
    jobs.always_fails.enqueue("no")
    assert run_burst(valkey_server.url) == 0
    assert Job.objects.count() == 21
    rows = {r["handler"]: r for r in history.totals(history.RANGES["hour"], datetime.now(UTC))}
    assert rows["tests.jobapp.jobs.add"]["succeeded"] == 20
    failed = rows["tests.jobapp.jobs.always_fails"]
    assert (failed["dead"], failed["retried"]) == (1, 1)  # max_attempts=2: one retried run
    assert rows["tests.jobapp.jobs.add"]["run_p50"] is not None


def test_a_batch_written_again_after_a_crash_is_counted_once(valkey_server: Any) -> None:
    """A mirror that died between its commit and its XACK leaves its entries pending: the mirror
    that takes them over writes the same rows again (the history converges), and the charts'
    counts must not add them a second time."""
    from jobqueue import Queue
    from jobqueue.history.mirror import GROUP, Mirror

    queue = Queue("default")
    stream = queue.shard(0).key("done")
    batch = [event(i, "app.jobs.send", "succeeded", 5, 5, NOW) for i in range(30)]
    batch.append(event(99, "app.jobs.send", "dead", 5, 5, NOW, attempts=2))
    for fields in batch:
        queue.client.xadd(stream, fields)
    dead = Mirror([queue], consumer="dead-one")
    dead._ensure_group(queue.client, stream)
    entries = queue.client.xreadgroup(GROUP, "dead-one", {stream: ">"}, count=100)[0][1]
    upsert([fields for _, fields in entries], "default")  # committed; then killed before XACK
    later = {**event(99, "app.jobs.send", "succeeded", 5, 5, NOW, attempts=3)}
    queue.client.xadd(stream, later)  # an operator's retry ran it again: a new finish to count

    Mirror([queue], consumer="heir").step(take_over_all=True)
    assert queue.client.xlen(stream) == 0 and Job.objects.count() == 31
    totals = Rollup.objects.filter(resolution=rollup.DAY, handler=rollup.TOTAL, queue="default")
    assert sum(r.succeeded for r in totals) == 31 and sum(r.dead for r in totals) == 1
