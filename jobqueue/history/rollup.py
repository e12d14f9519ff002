"""The history's rollup: finished jobs counted per minute, hour and day, queue and handler, with
a histogram of their wait and run times, so that charts over a month read a few thousand rows
however many jobs the history holds. Each queue's jobs are also counted under the handler
TOTAL ("*"), so that a chart of a queue, or of every queue, reads one row per point and queue.

The mirror adds each batch it writes (`add`, in the batch's transaction: one multi-row upsert
that adds to the counts); `backfill` builds the rollup again from the history rows; `prune`
drops rows older than KEEP_DAYS says for their resolution. A bucket's histogram has
BINS bins on a log scale, √2 apart (bin 0: under a millisecond; the last: everything from
about 37 hours), so a percentile read from it (`percentile`) is within a factor 2^(1/4) of the
true one. Wait time is from enqueue to the start of the job's last run; run time from that
start to its finish. A batch the mirror writes again (its process died between its commit and
Valkey's acknowledgement) is not counted again: the mirror leaves out the rows the history
already holds as they are (`models.counted_rows`).

May import: models (where the table is, `Rollup`) and the leaves.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any

from django.db import transaction

from ..models import ALL_COUNTS, BINS, HANDLER_LENGTH, OUTCOMES, RUN, WAIT, Job, Rollup

MINUTE, HOUR, DAY = 60, 3600, 86_400
KEEP_DAYS = {MINUTE: 2, HOUR: 35, DAY: 400}
"""How long rows of each resolution are kept (minutes: the hour chart; hours: the day and week
charts; days: the month chart)."""
TOTAL = "*"
"""The handler of a queue's totals (every handler's jobs): no `@job`'s dotted name."""
KEY = ("resolution", "start", "queue", "handler")


_HALF_SQRT2 = 2**-0.5


def bin_of(ms: float) -> int:
    """The histogram bin of a duration in milliseconds: 0 under 1 ms, then one per √2."""
    if ms < 1:
        return 0
    mantissa, exponent = math.frexp(ms)  # ms = mantissa × 2^exponent, mantissa in [0.5, 1)
    return min(2 * exponent - 1 + (mantissa >= _HALF_SQRT2), BINS - 1)


def bin_value(index: int) -> float:
    """The milliseconds a bin stands for: the geometric middle of its bounds."""
    return 0.5 if index == 0 else 2 ** ((index - 0.5) / 2)


def percentile(histogram: list[int], fraction: float) -> float | None:
    """The `fraction` percentile (0…1) of a histogram, in ms; None when it is empty."""
    total = sum(histogram)
    if not total:
        return None
    rank, seen = max(1, math.ceil(fraction * total)), 0
    for index, count in enumerate(histogram):
        seen += count
        if seen >= rank:
            return bin_value(index)
    return bin_value(BINS - 1)


def handler_of(payload: Any) -> str:
    """The handler a payload names (text as the mirror has it, or a dict), cut to the column."""
    if isinstance(payload, str):
        head = '{"handler":"'
        end = payload.find('"', len(head)) if payload.startswith(head) else -1
        if end > 0 and "\\" not in payload[len(head) : end]:
            return payload[len(head) : end][:HANDLER_LENGTH]
        try:
            payload = json.loads(payload)
        except ValueError:
            return ""
    name = payload.get("handler") if isinstance(payload, dict) else None
    return name[:HANDLER_LENGTH] if isinstance(name, str) else ""


def _floor(moment: datetime, resolution: int) -> datetime:
    seconds = int(moment.timestamp()) // resolution * resolution
    return datetime.fromtimestamp(seconds, moment.tzinfo)


def buckets(rows: Iterable[Mapping[str, Any]]) -> dict[tuple[Any, ...], dict[str, int]]:
    """The rollup's additions for `Job` rows (dicts of its columns): by key, the counts. Rows
    are counted per minute first, and the minutes summed into hours (a batch spans few)."""
    minutes: dict[tuple[int, str, str], dict[str, int]] = {}
    terminal = frozenset(OUTCOMES)
    for row in rows:
        state, finished = row["state"], row["finished_at"]
        if state not in terminal or finished is None:
            continue
        handler = row["handler"] if "handler" in row else handler_of(row["payload"])
        end = finished.timestamp()
        key = (int(end) // MINUTE, row["queue"], handler or "")
        counts = minutes.get(key)
        if counts is None:
            counts = minutes[key] = {}
        counts[state] = counts.get(state, 0) + 1
        if row["attempts"] > 1:
            counts["retried"] = counts.get("retried", 0) + row["attempts"] - 1
        if (started := row["started_at"]) is not None:
            begin = started.timestamp()
            run = RUN[bin_of((end - begin) * 1000)]
            counts[run] = counts.get(run, 0) + 1
            if (enqueued := row["enqueued_at"]) is not None:
                wait = WAIT[bin_of((begin - enqueued.timestamp()) * 1000)]
                counts[wait] = counts.get(wait, 0) + 1
    added: dict[tuple[Any, ...], dict[str, int]] = {}
    for (minute, queue, handler), counts in minutes.items():
        for resolution in (MINUTE, HOUR, DAY):
            start = datetime.fromtimestamp(minute * MINUTE // resolution * resolution, UTC)
            for name in (handler, TOTAL):
                into = added.setdefault((resolution, start, queue, name), {})
                for column, count in counts.items():
                    into[column] = into.get(column, 0) + count
    return added


def add(rows: Iterable[Mapping[str, Any]], now: datetime | None = None) -> int:
    """Add finished `Job` rows to the rollup: one upsert of the buckets they touch, in key
    order (two mirrors writing at once wait for each other, never deadlock). Call it in the
    transaction that writes the rows. `now`: leave out the buckets `prune` would drop then (a
    backfill's old jobs). Returns the buckets written."""
    added = buckets(rows)
    if now is not None:
        added = {
            key: counts for key, counts in added.items() if key[1] >= now - timedelta(days=KEEP_DAYS[key[0]])
        }
    return write(added)


def write(added: Mapping[tuple[Any, ...], Mapping[str, int]]) -> int:
    """Add counts to the rollup's buckets (by key: resolution, start, queue, handler)."""
    if not added:
        return 0
    db = transaction.get_connection()
    adapt = db.ops.adapt_datetimefield_value
    used = {column for counts in added.values() for column in counts}
    columns = (*KEY, *(c for c in ALL_COUNTS if c in used))  # (only those some bucket adds to)
    head, row, tail = _upsert_sql(db.vendor, columns)
    values = [
        [key[0], adapt(key[1]), key[2], key[3], *(counts.get(c, 0) for c in columns[4:])]
        for key, counts in sorted(added.items())
    ]
    per = max(1, 900 // len(columns)) if db.vendor == "sqlite" else 200  # (999 bound at most)
    with db.cursor() as cursor:
        for at in range(0, len(values), per):
            chunk = values[at : at + per]
            cursor.execute(head + ", ".join([row] * len(chunk)) + tail, [v for one in chunk for v in one])
    return len(values)


@lru_cache(maxsize=512)
def _upsert_sql(vendor: str, columns: tuple[str, ...]) -> tuple[str, str, str]:
    """The upsert's head, one row's placeholders and its tail (the counts added)."""
    from django.db import connection

    quote = connection.ops.quote_name
    table = quote(Rollup._meta.db_table)
    head = f"INSERT INTO {table} ({', '.join(quote(c) for c in columns)}) VALUES "
    summed = [quote(c) for c in columns if c not in KEY] or [quote("succeeded")]
    row = "(" + ", ".join(["%s"] * len(columns)) + ")"
    if vendor == "mysql":
        return head, row, " ON DUPLICATE KEY UPDATE " + ", ".join(f"{c} = {c} + VALUES({c})" for c in summed)
    conflict = ", ".join(quote(c) for c in KEY)
    return (
        head,
        row,
        f" ON CONFLICT ({conflict}) DO UPDATE SET "
        + ", ".join(f"{c} = {table}.{c} + excluded.{c}" for c in summed),
    )


def prune(now: datetime) -> int:
    """Drop the rows older than KEEP_DAYS says for their resolution."""
    deleted = 0
    for resolution, days in KEEP_DAYS.items():
        deleted += Rollup.objects.filter(
            resolution=resolution, start__lt=now - timedelta(days=days)
        ).delete()[0]
    return deleted


BACKFILL_FIELDS = ("queue", "handler", "state", "attempts", "enqueued_at", "started_at", "finished_at")


def backfill(since: datetime | None = None, chunk: int = 20_000, progress: Any = None) -> int:
    """Build the rollup again from the history rows finished since `since` (None: all), from
    the start of its day: the rollup's rows from then on are replaced, in one transaction (a
    mirror's batch meanwhile waits for it, then adds to it). Returns the history rows read."""
    with transaction.atomic():
        drop = Rollup.objects.all()
        if since is not None:
            drop = drop.filter(start__gte=_floor(since, DAY))
            since = _floor(since, DAY)
        drop.delete()
        rows = Job.objects.filter(state__in=OUTCOMES, finished_at__isnull=False)
        if since is not None:
            rows = rows.filter(finished_at__gte=since)
        read, batch, now = 0, [], datetime.now(UTC)
        for row in rows.order_by().values(*BACKFILL_FIELDS).iterator(chunk_size=chunk):
            row["handler"] = row["handler"] or ""
            batch.append(row)
            if len(batch) >= chunk:
                read += _add_batch(batch, progress, read, now)
                batch = []
        read += _add_batch(batch, progress, read, now)
    return read


def _add_batch(batch: list[dict[str, Any]], progress: Any, read: int, now: datetime) -> int:
    add(batch, now)
    if progress is not None and batch:
        progress(read + len(batch))
    return len(batch)
