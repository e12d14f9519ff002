"""The history charts' numbers, read from the rollup (history/rollup.py): per point of a range
(an hour by the minute, a day by the quarter hour, a week by the hour, 30 days by six hours)
the jobs that succeeded and failed and the wait and run times' p50, p95 and p99; and per queue
and handler, the range's totals. Every read takes the queues the user may see (None: all).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.models import QuerySet, Sum

from ..history.rollup import COUNTS, HOUR, MINUTE, RUN, WAIT, Rollup, percentile

QUANTILES = (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))


@dataclass(frozen=True)
class Range:
    name: str
    label: str
    resolution: int
    """The rollup rows it reads: minute or hour ones."""
    span: int
    step: int
    """Seconds it covers, and a point's seconds."""

    @property
    def points(self) -> int:
        return self.span // self.step


RANGES = {r.name: r for r in (
    Range("hour", "last hour", MINUTE, 3600, 60),
    Range("day", "last day", MINUTE, 86_400, 900),
    Range("week", "last 7 days", HOUR, 7 * 86_400, 3600),
    Range("month", "last 30 days", HOUR, 30 * 86_400, 6 * 3600),
)}


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


def _rows(span: Range, since: datetime, queues: Collection[str] | None, queue: str, handler: str
          ) -> QuerySet[Rollup]:
    rows = Rollup.objects.filter(resolution=span.resolution, start__gte=since)
    if queues is not None:
        rows = rows.filter(queue__in=list(queues))
    if queue:
        rows = rows.filter(queue=queue)
    if handler:
        rows = rows.filter(handler=handler)
    return rows


def _since(span: Range, now: datetime) -> datetime:
    last = int(now.timestamp()) // span.step * span.step
    return datetime.fromtimestamp(last - (span.points - 1) * span.step, now.tzinfo)


def series(span: Range, now: datetime, queues: Collection[str] | None = None, queue: str = "",
           handler: str = "") -> Series:
    """The range's points for the queues given (or one queue, or one handler)."""
    since = _since(span, now)
    out = Series([since + timedelta(seconds=i * span.step) for i in range(span.points)])
    out.counts = {c: [0] * span.points for c in COUNTS}
    waits = [[0] * len(WAIT) for _ in range(span.points)]
    runs = [[0] * len(RUN) for _ in range(span.points)]
    sums = {c: Sum(c) for c in (*COUNTS, *WAIT, *RUN)}
    found: Iterable[Mapping[str, Any]] = _rows(span, since, queues, queue, handler).values(
        "start").annotate(**sums).order_by()
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


def totals(span: Range, now: datetime, queues: Collection[str] | None = None, queue: str = "",
           limit: int = 200) -> list[dict[str, Any]]:
    """Per queue and handler over the range, busiest first: counts and the run and wait
    times' percentiles."""
    since = _since(span, now)
    sums = {c: Sum(c) for c in (*COUNTS, *WAIT, *RUN)}
    found: list[dict[str, Any]] = []
    rows: Iterable[Mapping[str, Any]] = _rows(span, since, queues, queue, "").values(
        "queue", "handler").annotate(**sums).order_by()
    for row in rows:
        waits, runs = [row[c] or 0 for c in WAIT], [row[c] or 0 for c in RUN]
        found.append({
            "queue": row["queue"], "handler": row["handler"],
            **{c: row[c] or 0 for c in COUNTS},
            "finished": sum(row[c] or 0 for c in COUNTS if c != "retried"),
            **{f"wait_{n}": percentile(waits, q) for n, q in QUANTILES},
            **{f"run_{n}": percentile(runs, q) for n, q in QUANTILES},
        })
    found.sort(key=lambda r: (-r["finished"], r["queue"], r["handler"]))
    return found[:limit]

