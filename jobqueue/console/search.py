"""A console search (query.py) run: over the history in the database (`history`: the database's
own JSON operators, on PostgreSQL a GIN index's containment first) and over live jobs in Valkey
(`live`: a bounded scan, a page at a time, that says when it stopped short).

Every search is given the queues the user may see (`scope`: None for every queue), so that
per-queue access is applied in one place (`ConsoleSite.visible_queues`). Reads only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from django.db import connection
from django.db.models import Q, QuerySet
from django.db.models.fields.json import KeyTransform

from ..engine.store import JobInfo, Queue, known_queues
from ..models import HANDLER_LENGTH, Job
from ..records import enqueued_ms, json_field, ms_to_dt
from . import hidden
from .query import Query, Term
from .readmodels import LIST_FIELDS, rows_of

SCAN_CHUNK = 500
"""Job rows one SCAN (or index read) step asks for, read in one pipeline."""
SCAN_BUDGET = 5_000
"""Job rows a live search page looks at, at most, before it stops short and says so."""
LIVE_INDEX = {"scheduled": "schedule", "active": "active", "dead": "dead"}
"""The shard index that lists a state's jobs: a search by that state reads it, not the keyspace."""


def scoped(rows: QuerySet[Job], scope: frozenset[str] | None) -> QuerySet[Job]:
    return rows if scope is None else rows.filter(queue__in=sorted(scope))


def history(query: Query, scope: frozenset[str] | None, may_see: bool = True) -> QuerySet[Job]:
    """The history rows that match, newest first; `may_see`: whether plain text and
    contains-terms may match hidden arguments (if not, they look only into the arguments of
    queues that hide none). A page reads them through historyscan.py, a chunk at a time."""
    return matched(narrowed(query, scope), query, may_see).order_by("-finished_at", "-id")


def narrowed(query: Query, scope: frozenset[str] | None) -> QuerySet[Job]:
    """The rows the query's indexed columns allow (queue, state, handler, lane, finished_at):
    what a search reads the payloads of."""
    rows = scoped(Job.objects.all(), scope)
    for column, value in (
        ("queue", query.queue),
        ("state", query.state),
        ("handler", query.handler[:HANDLER_LENGTH]),
        ("lane", query.lane),
    ):
        if value:
            rows = rows.filter(**{column: value})
    if query.since:
        rows = rows.filter(finished_at__gte=query.since)
    if query.until:
        rows = rows.filter(finished_at__lt=query.until)
    return rows


def matched(rows: QuerySet[Job], query: Query, may_see: bool = True) -> QuerySet[Job]:
    """Those of `rows` whose payload matches the query's terms and plain text (the database's
    own JSON operators)."""
    for i, term in enumerate(query.terms):
        name = f"jq_arg{i}"
        found = _term_q(term, name)  # (text contained in a dict may be a hidden key's value)
        rows = rows.alias(**{name: _path(term)}).filter(
            found if may_see or term.op == "=" else found & _not_hiding()
        )
    if query.text:
        rows = rows.alias(
            jq_args=KeyTransform("args", "payload"), jq_kwargs=KeyTransform("kwargs", "payload")
        )
        for word in query.text:
            rows = rows.filter(_text_q(word, may_see))
    return rows


def _path(term: Term) -> Any:
    expression: Any = "payload"
    for key in term.path:
        expression = KeyTransform(str(key), expression)
    return expression


def _term_q(term: Term, name: str) -> Q:
    if term.op == "~":
        return Q(**{f"{name}__icontains": str(term.value)})
    exact = Q()
    for value in term.values:
        exact |= Q(**{name: value})
    if connection.vendor == "postgresql":  # the GIN index (jsonb_path_ops) finds the candidates
        nested = _contained(term)
        if nested is not None:
            inside = Q()
            for value in term.values:
                inside |= Q(payload__contains=nested(value))
            return inside & exact
    return exact


def _contained(term: Term) -> Callable[[Any], Any] | None:
    """The JSON a payload holding the path's value contains (`@>`), when the path says what
    each step is (a position of args first, dict keys after it); else None."""
    steps = term.path[2:] if term.path[0] == "args" else term.path[1:]
    if any(isinstance(key, int) for key in steps):
        return None

    def build(value: Any) -> Any:
        for key in reversed(steps):
            value = {key: value}
        return {"args": [value]} if term.path[0] == "args" else {"kwargs": value}

    return build


def _text_q(word: str, may_see: bool) -> Q:
    found = Q(pk=word) | Q(lane=word) | Q(unique_key=word) | Q(handler__icontains=word)
    in_args = Q(jq_args__icontains=word) | Q(jq_kwargs__icontains=word)
    return found | (in_args if may_see else in_args & _not_hiding())


def _not_hiding() -> Q:
    """The rows of queues that hide no argument: where a user who may not see hidden arguments
    may look for text in them (a hidden value would answer a probe elsewhere)."""
    hiding, plain, others_hide = hidden.queues_hiding()
    if others_hide:
        return Q(queue__in=plain) if plain else Q(pk__in=[])
    return ~Q(queue__in=hiding) if hiding else Q()


# -- live jobs ------------------------------------------------------------------------------------


@dataclass
class LivePage:
    """What one step of a live search found, and where the next one starts."""

    jobs: list[Any]
    """The jobs found (JobInfo each; a bulk operation's scan: `Seen` each)."""
    next: str | None
    """The cursor of the next page; None when the scan went through every job."""
    looked_at: int
    """Job rows read for this page."""
    cut_short: bool
    """Whether it stopped at its budget before it filled the page."""


class Seen(NamedTuple):
    """What a live search reads of each job row to match it (a page's matches are then read
    whole: `readmodels.rows_of`)."""

    id: str
    queue: str
    shard: int
    state: str
    lane: str | None
    unique_key: str | None
    enqueued_at: datetime | None
    payload: Any


def live(
    query: Query,
    scope: frozenset[str] | None,
    cursor: str = "",
    per_page: int = 50,
    budget: int | None = None,
    states: frozenset[str] | None = None,
    shown: Callable[[Seen], Any] | None = None,
    indexed: bool = True,
) -> LivePage:
    """A page of live jobs that match (and are in one of `states`, when given), from `cursor`
    ("" at the start): the queues in turn, each shard in turn, read SCAN_CHUNK rows at a time
    (through the state's index when the query names one that has it, else a SCAN of the shard's
    job rows), stopped once the page is full or `budget` rows were read. `shown` gives a job's
    payload as the user may see it (plain text is looked for there). `indexed`: False always
    scans the job rows, whose cursor holds while the jobs change state under it (a bulk
    operation's; a position in a state's index shifts as jobs leave it), and takes every match of
    the last step read (a page may pass `per_page` by up to SCAN_CHUNK), so that a page never
    stops mid-step, where the matches skipped on the next would shift as well. The page's
    jobs are read whole when `indexed`; a bulk operation needs their place only."""
    seen = _scan(query, scope, cursor, per_page, budget, states, shown, indexed)
    if indexed:
        by_queue: dict[str, list[Seen]] = {}
        for job in seen.jobs:
            by_queue.setdefault(job.queue, []).append(job)
        read = {
            (info.queue, info.id): info
            for name, jobs in by_queue.items()
            for info in rows_of(
                Queue(name), [(job.shard, job.id) for job in jobs], (*LIST_FIELDS, "unique_key", "payload")
            )
        }
        seen.jobs = [read[job.queue, job.id] for job in seen.jobs if (job.queue, job.id) in read]
    return seen


def _scan(
    query: Query,
    scope: frozenset[str] | None,
    cursor: str,
    per_page: int,
    budget: int | None,
    states: frozenset[str] | None,
    shown: Callable[[Seen], Any] | None,
    indexed: bool,
) -> LivePage:
    budget = SCAN_BUDGET if budget is None else budget
    names = sorted(
        set(known_queues())
        & ({query.queue} if query.queue else set(known_queues()))
        & (scope if scope is not None else set(known_queues()))
    )
    at, shard, position, skip = _cursor(cursor)
    found: list[Any] = []
    looked = 0
    while at < len(names):
        queue = Queue(names[at])
        while shard < queue.all_shards():
            while True:
                if len(found) >= per_page or looked >= budget:
                    return LivePage(found, f"{at}.{shard}.{position}.{skip}", looked, len(found) < per_page)
                ids, after = _step(queue, shard, query, position, indexed)
                rows = _read(queue, shard, ids, query.needs_payload)
                looked += len(ids)
                matched = [row for row in rows if query.matches(row, states, shown(row) if shown else None)][
                    skip:
                ]
                room = per_page - len(found) if indexed else len(matched)
                found += matched[:room]
                if len(matched) > room:  # the rest of this step: the next page, from here
                    skip += room
                    return LivePage(found, f"{at}.{shard}.{position}.{skip}", looked, False)
                skip = 0
                position = after
                if position == 0:
                    break
            shard, position = shard + 1, 0
        at, shard = at + 1, 0
    return LivePage(found, None, looked, False)


def every_live(
    query: Query,
    scope: frozenset[str] | None,
    states: frozenset[str] | None,
    cursor: str = "",
    chunk: int = SCAN_CHUNK,
) -> Iterator[tuple[list[JobInfo], str]]:
    """Every live job that matches, `chunk` at a time, each with the cursor after it."""
    while True:
        page = live(
            query, scope, cursor, per_page=chunk, budget=10 * chunk + SCAN_CHUNK, states=states, indexed=False
        )
        yield page.jobs, page.next or ""
        if page.next is None:
            return
        cursor = page.next


def _cursor(text: str) -> tuple[int, int, int, int]:
    parts = text.split(".")
    if len(parts) == 4 and all(part.isdecimal() and len(part) < 20 for part in parts):
        at, shard, position, skip = map(int, parts)
        return at, shard, position, skip
    return 0, 0, 0, 0


def _step(queue: Queue, shard: int, query: Query, position: int, indexed: bool) -> tuple[list[str], int]:
    """Up to SCAN_CHUNK job ids of the shard from `position`, and the position after them (0:
    the shard is done)."""
    keys = queue.shard(shard)
    index = LIVE_INDEX.get(query.state) if indexed else None
    if indexed and query.state == "pending" and query.lane:
        index_key = keys.lane(query.lane)
    elif index is not None:
        index_key = keys.key(index)
    else:
        client = queue.client
        target = client
        if hasattr(client, "get_node_from_key"):  # (a cluster: the shard's node)
            target = client.get_redis_connection(client.get_node_from_key(keys.job("x")))
        after, found = target.scan(position, match=keys.job("*"), count=SCAN_CHUNK)
        prefix = len(keys.job(""))
        return [key[prefix:] for key in found], int(after)
    ids = queue.client.zrange(index_key, position, position + SCAN_CHUNK - 1)
    return ids, position + len(ids) if len(ids) == SCAN_CHUNK else 0


def _read(queue: Queue, shard: int, ids: list[str], payload: bool) -> list[Seen]:
    """What a search matches of these jobs, read in one pipeline (their payloads when it looks
    at them); rows gone meanwhile are left out."""
    if not ids:
        return []
    fields = ("state", "lane", "unique_key", "enqueued_at", "payload")[: 5 if payload else 4]
    pipe = queue.client.pipeline(transaction=False)
    key = queue.shard(shard)
    for job_id in ids:
        pipe.hmget(key.job(job_id), fields)
    rows = []
    for job_id, values in zip(ids, pipe.execute(), strict=True):
        if values[0] is None:
            continue
        body = json_field(values[4], "payload")[0] if payload else None
        rows.append(
            Seen(
                job_id,
                queue.name,
                shard,
                values[0],
                values[1] or None,
                values[2] or None,
                ms_to_dt(enqueued_ms(job_id, values[3])),
                body,
            )
        )
    return rows
