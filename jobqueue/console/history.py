"""The history charts' numbers, read from the rollup (history/rollup.py): per point of a range
(an hour by the minute, a day or a week by the hour, 30 days by the day) the jobs that
succeeded and failed and the wait and run times' p50, p95 and p99, from the queues' totals
rows (or one handler's); and per queue and handler, the range's totals, from coarser rows (an
hour's and a day's from hour rows, a week's and a month's from day rows: they start at the
first whole hour or day of the range: `table_since`). Every read takes the queues the
user may see (None: all). A page reads some hundreds of rows per queue, whatever the history
holds.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.models import QuerySet, Sum

from ..history.rollup import DAY, HOUR, MINUTE, TOTAL, percentile
from ..models import COUNTS, RUN, WAIT, Rollup

QUANTILES = (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))


@dataclass(frozen=True)
class Range:
    name: str
    label: str
    resolution: int
    """The rollup rows its charts read (their seconds: a point's)."""
    span: int
    """Seconds it covers."""
    table: int
    """The rollup rows its table by queue and handler reads."""

    @property
    def step(self) -> int:
        return self.resolution

    @property
    def points(self) -> int:
        return self.span // self.step


RANGES = {
    r.name: r
    for r in (
        Range("hour", "last hour", MINUTE, 3600, HOUR),
        Range("day", "last day", HOUR, 86_400, HOUR),
        Range("week", "last 7 days", HOUR, 7 * 86_400, DAY),
        Range("month", "last 30 days", DAY, 30 * 86_400, DAY),
    )
}


@dataclass
class Series:
    """A range's points, oldest first (the last one is the current, partial, step)."""

    starts: list[datetime]
    counts: dict[str, list[int]] = field(default_factory=dict)
    """succeeded, dead, cancelled, expired, retried: per point."""
    wait: dict[str, list[float | None]] = field(default_factory=dict)
    run: dict[str, list[float | None]] = field(default_factory=dict)
    """p50, p95, p99 in ms per point (None where no job finished)."""

    @property
    def total(self) -> int:
        return sum(sum(self.counts[c]) for c in COUNTS if c != "retried")


def _rows(resolution: int, since: datetime, queues: Collection[str] | None, queue: str) -> QuerySet[Rollup]:
    rows = Rollup.objects.filter(resolution=resolution, start__gte=since)
    if queues is not None:
        rows = rows.filter(queue__in=list(queues))
    return rows.filter(queue=queue) if queue else rows


def _since(span: Range, now: datetime) -> datetime:
    last = int(now.timestamp()) // span.step * span.step
    return datetime.fromtimestamp(last - (span.points - 1) * span.step, now.tzinfo)


def table_since(span: Range, now: datetime) -> datetime:
    """Where the range's table starts: the first whole `table` bucket of the range."""
    first = int(now.timestamp()) - span.span
    return datetime.fromtimestamp(first // span.table * span.table, now.tzinfo)


def series(
    span: Range, now: datetime, queues: Collection[str] | None = None, queue: str = "", handler: str = ""
) -> Series:
    """The range's points for the queues given (or one queue, or one handler)."""
    since = _since(span, now)
    out = Series([since + timedelta(seconds=i * span.step) for i in range(span.points)])
    out.counts = {c: [0] * span.points for c in COUNTS}
    waits = [[0] * len(WAIT) for _ in range(span.points)]
    runs = [[0] * len(RUN) for _ in range(span.points)]
    sums = {c: Sum(c) for c in (*COUNTS, *WAIT, *RUN)}
    found: Iterable[Mapping[str, Any]] = (
        _rows(span.resolution, since, queues, queue)
        .filter(handler=handler or TOTAL)
        .values("start")
        .annotate(**sums)
        .order_by()
    )
    for row in found:
        at = int((row["start"] - since).total_seconds()) // span.step
        if not 0 <= at < span.points:
            continue
        for c in COUNTS:
            out.counts[c][at] += row[c] or 0
        for i, c in enumerate(WAIT):
            waits[at][i] += row[c] or 0
        for i, c in enumerate(RUN):
            runs[at][i] += row[c] or 0
    out.wait = {name: [percentile(h, q) for h in waits] for name, q in QUANTILES}
    out.run = {name: [percentile(h, q) for h in runs] for name, q in QUANTILES}
    return out


def totals(
    span: Range, now: datetime, queues: Collection[str] | None = None, queue: str = "", limit: int = 200
) -> list[dict[str, Any]]:
    """Per queue and handler since `table_since`, busiest first: counts and the run and wait
    times' percentiles."""
    sums = {c: Sum(c) for c in (*COUNTS, *WAIT, *RUN)}
    found: list[dict[str, Any]] = []
    rows: Iterable[Mapping[str, Any]] = (
        _rows(span.table, table_since(span, now), queues, queue)
        .exclude(handler=TOTAL)
        .values("queue", "handler")
        .annotate(**sums)
        .order_by()
    )
    for row in rows:
        waits, runs = [row[c] or 0 for c in WAIT], [row[c] or 0 for c in RUN]
        found.append(
            {
                "queue": row["queue"],
                "handler": row["handler"],
                **{c: row[c] or 0 for c in COUNTS},
                "finished": sum(row[c] or 0 for c in COUNTS if c != "retried"),
                **{f"wait_{n}": percentile(waits, q) for n, q in QUANTILES},
                **{f"run_{n}": percentile(runs, q) for n, q in QUANTILES},
            }
        )
    found.sort(key=lambda r: (-r["finished"], r["queue"], r["handler"]))
    return found[:limit]
