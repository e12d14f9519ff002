"""A page of a history search that answers within its budget however large the history is.

The rows the query's indexed columns allow (`search.narrowed`: queue, state, handler, lane, time
range) are read newest first in keyset chunks: first the unfinished rows (a durable queue's, no
`finished_at`) by id, then the finished ones by (`finished_at`, id). A chunk's far edge is found
on the index alone (the chunk's last row: `LIMIT 1 OFFSET size - 1`), then the database's own
JSON operators (`search.matched`) look at the payloads inside the chunk only. Chunks grow from
CHUNK_FIRST to CHUNK_MAX rows. The page stops once it holds `per_page` matches, or once it has
read ROW_BUDGET rows or spent TIME_BUDGET seconds (always one chunk at least; a chunk is cut to
the time left at the last one's pace): then it says so,
how far back it searched, and its `next` cursor (in the URL: shareable) searches older rows.

A cursor is the place the page stopped: `u.<id>` (after that unfinished row), `f` (the finished
rows from the newest), `f.<microseconds since the epoch>.<id>` (after that finished row).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.db.models import Q, QuerySet

from ..exceptions import InvalidOption
from ..models import Job
from . import search
from .query import Query

CHUNK_FIRST = 1_000
"""Rows the first chunk of a page reads (a common match answers at once)."""
CHUNK_MAX = 10_000
"""Rows a chunk reads at most (each chunk doubles the last, unless the time left at the last
chunk's pace allows fewer rows)."""
CHUNK_LEAST = 100
"""Rows a chunk reads at least, however little time is left (one after the first, cut to the time
left, costs that much more than the budget at most)."""
ROW_BUDGET = 500_000
"""Rows a page reads at most before it stops short and says so."""
TIME_BUDGET = 0.25
"""Seconds a page spends at most before it stops short (checked after each chunk)."""
CURSOR = re.compile(r"(?P<phase>[uf])(?:\.(?P<micros>\d{1,17}))?(?:\.(?P<id>[A-Za-z0-9]{14}))?")
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Cursor:
    """Where a scan stands: after an unfinished row (`finished` False), or at the newest
    finished row (`at` None) or after one."""

    finished: bool
    at: datetime | None = None
    id: str = ""

    @classmethod
    def parse(cls, text: str) -> Cursor:
        """The place a cursor names ("": the start); InvalidOption when it is malformed."""
        if not text:
            return cls(False)
        found = CURSOR.fullmatch(text)
        if found is None or (
            (found["micros"] is not None or found["id"] is None)
            if found["phase"] == "u"
            else (found["micros"] is None) != (found["id"] is None)
        ):
            raise InvalidOption(f"malformed history cursor {text[:60]!r}: start the search again")
        if found["phase"] == "u":
            return cls(False, None, found["id"])
        if found["micros"] is None:
            return cls(True)
        try:
            at = EPOCH + timedelta(microseconds=int(found["micros"]))
        except OverflowError:
            raise InvalidOption(f"malformed history cursor {text[:60]!r}: start the search again") from None
        return cls(True, at, found["id"])

    def token(self) -> str:
        if not self.finished:
            return f"u.{self.id}"
        if self.at is None:
            return "f"
        at = self.at if self.at.tzinfo else self.at.replace(tzinfo=UTC)
        return f"f.{(at - EPOCH) // timedelta(microseconds=1)}.{self.id}"


@dataclass
class HistoryPage:
    """What one page of a history search found, and where the next one starts."""

    jobs: list[Job]
    next: str | None
    """The cursor of the next page; None when no older row is left to read."""
    looked_at: int
    """Rows the page read (those its indexed columns allowed)."""
    cut_short: bool
    """Whether it stopped at its budget before it filled the page."""
    reached: datetime | None
    """The oldest `finished_at` it read (None: it read unfinished rows only)."""
    since: datetime | None
    """Where it started: the `finished_at` of the row its cursor names (None: the newest)."""


def page(
    query: Query, scope: frozenset[str] | None, may_see: bool = True, cursor: str = "", per_page: int = 50
) -> HistoryPage:
    """A page of the history rows that match `query`, newest first, from `cursor` on."""
    place = Cursor.parse(cursor)
    if not place.finished and (query.since or query.until):
        place = Cursor(True)  # (a time range holds finished rows only)
    rows = search.narrowed(query, scope)
    jobs: list[Job] = []
    size, looked, reached = CHUNK_FIRST, 0, None
    started = time.monotonic()
    while True:
        began = time.monotonic()
        read, after, found = _chunk(rows, query, may_see, place, size, per_page - len(jobs))
        jobs += found
        looked += read
        if after is None or len(jobs) >= per_page:
            break
        place = after
        if read and place.at is not None:
            reached = place.at
        now = time.monotonic()
        if looked >= ROW_BUDGET or now - started >= TIME_BUDGET:
            return HistoryPage(jobs, place.token(), looked, True, reached, _since(cursor))
        size = min(size * 2, CHUNK_MAX, ROW_BUDGET - looked)
        if read:  # (no larger than the time left allows, at the pace of the last chunk)
            pace = read / max(now - began, 1e-6)
            size = min(size, max(int((TIME_BUDGET - (now - started)) * pace), CHUNK_LEAST))
    return HistoryPage(jobs, after.token() if after else None, looked, False, reached, _since(cursor))


def _since(cursor: str) -> datetime | None:
    return Cursor.parse(cursor).at


def _after(job: Job) -> Cursor:
    return Cursor(job.finished_at is not None, job.finished_at, job.pk)


def _chunk(
    rows: QuerySet[Job], query: Query, may_see: bool, place: Cursor, size: int, wanted: int
) -> tuple[int, Cursor | None, list[Job]]:
    """Read one chunk after `place`: (rows read, the place after what it took (None: no row
    left), up to `wanted` matches: the page fills inside the chunk when more match)."""
    if place.finished:
        order: tuple[str, ...] = ("-finished_at", "-id")
        after = rows.filter(finished_at__isnull=False)
        if place.at is not None:
            after = after.filter(
                Q(finished_at__lt=place.at) | Q(finished_at=place.at, id__lt=place.id),
                finished_at__lte=place.at,
            )
    else:
        order = ("-id",)
        after = rows.filter(finished_at__isnull=True)
        if place.id:
            after = after.filter(id__lt=place.id)
    edge = list(after.order_by(*order).values_list("finished_at", "id")[size - 1 : size])
    end: Cursor | None
    if edge:
        at, last = edge[0]
        chunk = after.filter(id__gte=last) if not place.finished else after.filter(
            Q(finished_at__gt=at) | Q(finished_at=at, id__gte=last), finished_at__gte=at
        )
        read, end = size, Cursor(place.finished, at, last)
    else:
        chunk, read = after, after.count()
        end = Cursor(True) if not place.finished else None
    found = list(search.matched(chunk, query, may_see).order_by(*order)[: wanted + 1])
    if len(found) > wanted:  # (the page is full inside this chunk: the next starts after it)
        return read, _after(found[wanted - 1]), found[:wanted]
    return read, end, found
