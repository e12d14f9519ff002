"""The console's read models: bounded, pipelined reads of a queue's live state.

Every read here is bounded (a page, the first N lanes, the last N minutes), so the console stays
fast at a million jobs. Writes go through `Queue`'s transitions, never through this module.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from .. import ids
from ..engine import backlog
from ..engine.store import JobInfo, Queue
from ..exceptions import JobQueueError
from ..flows.members import spots as flow_spots
from ..keys import ShardKeys
from ..options import rate as spec_rate
from ..states import State
from . import sealed

LIST_FIELDS = ("state", "attempts", "priority", "lane", "enqueued_at", "run_after", "started_at",
               "lease_until", "finished_at", "worker", "last_error", "max_attempts", "progress")
"""What a list of jobs shows of each: never its payload (up to MAX_PAYLOAD bytes; a list of a
thousand running jobs would pull a gigabyte), which only the job's own page shows."""
PAGE_STATES: dict[str, str] = {State.PENDING: "pending", State.SCHEDULED: "schedule",
                               State.ACTIVE: "active", State.DEAD: "dead"}
"""The shard index (sorted set) that lists the jobs of each state a page shows; pending jobs are
listed per lane, in the order they will be claimed."""
DEFAULT_LANE = "(default)"
"""How the console names the default lane (parentheses are not allowed in a lane name)."""
EPOCH = datetime.fromtimestamp(0, UTC)
MAX_LANES = 500
MAX_ACTIVE_SCAN = 1000


@dataclass
class Overview:
    """One queue's card on the dashboard."""

    name: str
    shards: int
    counts: dict[str, int]
    paused: bool
    oldest_wait: float | None
    succeeded: list[int]
    failed: list[int]
    backlog: list[int] = field(default_factory=list)
    """Waiting jobs (pending and scheduled) per minute, as the workers' summaries saw them."""
    oldest: list[int] = field(default_factory=list)
    """The oldest wait per minute, in seconds."""
    lanes: list[tuple[str, int]] = field(default_factory=list)
    rate: str | None = None
    """The queue's rate limit ("10/s"), if it has one."""
    bucket: float | None = None
    """Jobs its rate limit would admit now (the buckets of all its shards)."""

    @property
    def bucket_fill(self) -> float:
        """How full the rate limit's bucket is, 0…1."""
        limit = spec_rate(self.rate)
        return min((self.bucket or 0.0) / limit[0], 1.0) if limit else 0.0

    @property
    def succeeded_recently(self) -> int:
        return sum(self.succeeded)


def overview(queue: Queue, minutes: int = 30, lanes: int = 5) -> Overview:
    """Counts, pause state, oldest wait, per-minute outcomes and deepest lanes of a queue."""
    total = queue.all_shards()
    now = backlog.server_ms(queue)
    buckets = [now // 60_000 - i for i in range(minutes - 1, -1, -1)]
    pipe = queue.client.pipeline(transaction=False)
    for index in range(total):
        shard = queue.shard(index)
        for minute in buckets:
            pipe.hmget(shard.key(f"m:{minute}"), "succeeded", "failed", "backlog", "oldest_ms")
    replies = pipe.execute()
    oldest = backlog.oldest_wait(queue, now, MAX_LANES)
    succeeded, failed = [0] * minutes, [0] * minutes
    for index in range(total):
        for i, (ok, bad, _, _) in enumerate(replies[index * minutes : (index + 1) * minutes]):
            succeeded[i] += int(ok or 0)
            failed[i] += int(bad or 0)
    samples = replies[:minutes]  # shard 0 holds the workers' backlog samples
    return Overview(queue.name, total, queue.counts(), queue.is_paused(), oldest, succeeded,
                    failed, [int(s[2] or 0) for s in samples],
                    [int(s[3] or 0) // 1000 for s in samples], deepest_lanes(queue, lanes),
                    queue.options.rate, backlog.bucket_level(queue, now))


def deepest_lanes(queue: Queue, limit: int = 20) -> list[tuple[str, int]]:
    """The lanes with the most ready jobs (among the first MAX_LANES of each shard's ring, and
    as many held back by their cap or rate)."""
    return [(lane or DEFAULT_LANE, depth) for lane, depth, _ in lane_depths(queue)[:limit]]


def opening(queue: Queue) -> tuple[str, int, str]:
    """Where a queue's page opens when its URL does not say: (state, shard, lane) of what is
    there, the deepest lane's pending jobs, else the first state (scheduled, active, dead)
    with jobs on some shard, else the default lane of shard 0."""
    deepest = lane_depths(queue)[:1]
    if deepest and deepest[0][1]:
        return State.PENDING, deepest[0][2], deepest[0][0]
    for index in range(queue.all_shards()):
        counts = queue.shard_counts(index)
        for state in PAGE_STATES:
            if state != State.PENDING and counts.get(state):
                return state, index, ""
    return State.PENDING, 0, ""


def lane_depths(queue: Queue) -> list[tuple[str, int, int]]:
    """(lane, ready jobs, shard) of the lanes with ready jobs, deepest first (see
    `deepest_lanes`); the default lane is ""."""
    depths: list[tuple[str, int, int]] = []
    for index in range(queue.all_shards()):
        shard = queue.shard(index)
        names = queue.client.lrange(shard.key("ring"), 0, MAX_LANES - 1)
        names += queue.client.srandmember(shard.key("capped"), MAX_LANES)
        names += queue.client.zrange(shard.key("rated"), 0, MAX_LANES - 1)
        pipe = queue.client.pipeline(transaction=False)
        for lane in names:
            pipe.zcard(shard.lane(lane))
        depths += ((lane, int(n), index) for lane, n in zip(names, pipe.execute(), strict=True))
    depths.sort(key=lambda item: -item[1])
    return depths


def lanes_in_flight(queue: Queue, index: int) -> Counter[str]:
    """Running jobs per lane on one shard (from the first MAX_ACTIVE_SCAN active jobs)."""
    shard = queue.shard(index)
    ids = queue.client.zrange(shard.key("active"), 0, MAX_ACTIVE_SCAN - 1)
    pipe = queue.client.pipeline(transaction=False)
    for job_id in ids:
        pipe.hget(shard.job(job_id), "lane")
    return Counter(lane or DEFAULT_LANE for lane in pipe.execute())


def _rows(queue: Queue, shard: ShardKeys, ids: list[str]) -> list[JobInfo]:
    return rows_of(queue, [(shard.index, job_id) for job_id in ids])


def rows_of(queue: Queue, placed: list[tuple[int, str]], fields: tuple[str, ...] = LIST_FIELDS
            ) -> list[JobInfo]:
    """The `fields` of the jobs at (shard, id), read in one pipeline, in that order; jobs whose
    row is gone are left out."""
    return rows_at(queue, [(queue, index, job_id) for index, job_id in placed], fields)


def rows_at(queue: Queue, placed: list[tuple[Queue, int, str]],
            fields: tuple[str, ...] = LIST_FIELDS) -> list[JobInfo]:
    """`rows_of` for jobs of any queue, at (queue, shard, id), read in one pipeline on
    `queue`'s client."""
    pipe = queue.client.pipeline(transaction=False)
    for q, index, job_id in placed:
        pipe.hmget(q.shard(index).job(job_id), fields)
    rows = []
    for (q, index, job_id), values in zip(placed, pipe.execute(), strict=True):
        row = {k: v for k, v in zip(fields, values, strict=True) if v is not None}
        if row:
            rows.append(sealed.masked(JobInfo.from_row(job_id, q.name, row, index,
                                                       q.options.max_attempts)))
    return rows


def page(queue: Queue, state: str, index: int, number: int, per_page: int = 50, lane: str = ""
         ) -> tuple[list[JobInfo], int]:
    """One page of a shard's jobs in a live state: pending ones of one lane in claim order,
    scheduled by due time, active by lease deadline, dead newest first."""
    shard = queue.shard(index)
    key = shard.lane(lane) if state == State.PENDING else shard.key(PAGE_STATES[state])
    total = int(queue.client.zcard(key))
    start = (number - 1) * per_page
    if state == State.DEAD:
        ids = queue.client.zrevrange(key, start, start + per_page - 1)
    else:
        ids = queue.client.zrange(key, start, start + per_page - 1)
    return _rows(queue, shard, ids), total


def run_times_by_handler(queue: str, sample: int = 1000) -> list[tuple[str, int, float, float, float]]:
    """(handler, runs, p50, p95, p99 seconds) over the queue's last `sample` successes in the
    mirror, slowest p95 first."""
    from ..models import Job

    rows = (Job.objects.filter(queue=queue, state=State.SUCCEEDED, started_at__isnull=False)
            .order_by("-finished_at")
            .values_list("payload__handler", "started_at", "finished_at")[:sample])
    runs: dict[str, list[float]] = {}
    for handler, started, finished in rows:
        if started and finished:
            runs.setdefault(str(handler or "?"), []).append((finished - started).total_seconds())

    def pct(values: list[float], p: float) -> float:
        return values[int(p * (len(values) - 1))]

    table = [(handler, len(v), pct(v, 0.5), pct(v, 0.95), pct(v, 0.99))
             for handler, v in ((h, sorted(d)) for h, d in runs.items())]
    return sorted(table, key=lambda row: -row[3])


def usual_run_time(queue: str, sample: int = 500) -> float | None:
    """The 95th percentile run time (seconds) of the queue's last `sample` successes in the
    mirror; None while it has fewer than 20."""
    from ..models import Job

    rows = (Job.objects.filter(queue=queue, state=State.SUCCEEDED, started_at__isnull=False)
            .order_by("-finished_at").values_list("started_at", "finished_at")[:sample])
    durations = sorted((finished - started).total_seconds() for started, finished in rows
                       if started and finished)
    if len(durations) < 20:
        return None
    return durations[int(0.95 * (len(durations) - 1))]


@dataclass
class Stuck:
    expired: list[JobInfo]
    long_running: list[JobInfo]
    old_pending: list[JobInfo]
    dead: list[JobInfo]
    usual: float | None = None
    """The queue's usual (p95) run time, when the mirror knows it."""
    running_over: float = 0.0
    """The run time beyond which an active job is listed: 3× usual, or the operator's limit."""


def stuck(queue: Queue, pending_over: float, running_over: float, limit: int = 50) -> Stuck:
    """Jobs an operator should look at: expired leases, jobs running far beyond the queue's
    usual time (or the given limit, whichever is shorter), old waits, dead jobs."""
    now = backlog.server_ms(queue)
    usual = usual_run_time(queue.name)
    if usual is not None:
        running_over = min(running_over, max(3 * usual, 1.0))
    found = Stuck([], [], [], [], usual, running_over)
    for index in range(queue.all_shards()):
        shard = queue.shard(index)
        client = queue.client
        expired = client.zrangebyscore(shard.key("active"), "-inf", now, start=0, num=limit)
        found.expired += _rows(queue, shard, expired)
        active = _rows(queue, shard, client.zrange(shard.key("active"), 0, MAX_ACTIVE_SCAN - 1))
        found.long_running += [job for job in active if job.started_at
                               and now / 1000 - job.started_at.timestamp() > running_over
                               and job.id not in expired][:limit]
        old = [job_id for _, job_id, ready in backlog.heads(queue, index, MAX_LANES)
               if ready < now - pending_over * 1000][:limit]
        found.old_pending += _rows(queue, shard, old)
        found.dead += _rows(queue, shard, client.zrevrange(shard.key("dead"), 0, limit - 1))
    return found


def search(text: str, limit: int = 50, visible: list[str] | None = None,
           history: Callable[[Any], Any] | None = None) -> list[JobInfo]:
    """Jobs whose lane, unique key or handler is `text`: live ones (lanes and unique keys of
    every queue, or of the `visible` ones, newest state from Valkey) first, then finished ones
    from the mirror (its rows narrowed by `history`: see `access.history`)."""
    from ..engine.store import known_queues
    from ..keys import validate_lane
    from ..models import HANDLER_LENGTH, Job

    found: dict[str, JobInfo] = {}
    try:
        lane = validate_lane(text)
    except JobQueueError:
        lane = None
    for name in known_queues() if visible is None else visible:
        queue = Queue(name)
        for index in range(queue.all_shards()):
            shard = queue.shard(index)
            ids = [queue.client.get(shard.key(f"uniq:{text}"))]
            if lane is not None:
                ids += queue.client.zrange(shard.lane(lane), 0, limit - 1)
            for info in _rows(queue, shard, [i for i in ids if i and i not in found]):
                found[info.id] = info
    if len(text) <= HANDLER_LENGTH:  # (no lane, unique key or handler kept is longer)
        # One query per column, each served by its index on (column, finished_at): an OR of
        # the three, or a handler read out of the payload, scans the table when nothing matches.
        narrowed = history or _all
        rows = [row for column in ("lane", "unique_key", "handler")
                for row in narrowed(Job.objects.filter(**{column: text}))
                .order_by("-finished_at")[:limit]]
        rows.sort(key=lambda row: row.finished_at or EPOCH, reverse=True)
        for row in rows:
            found.setdefault(row.id, sealed.masked(row.info()))
    return list(found.values())[:limit]


def _all(rows: Any) -> Any:
    return rows


FLOW_PAGE = 50
"""Jobs per page of a flow."""
WAITS_SHOWN = 20
"""Ids shown of the jobs a waiting job still waits for (a chord's callback may wait for
thousands), beside how many there are."""
MAX_FLOW_COUNTED = 50_000
"""The jobs of a flow whose states its page counts: the first ones, in the flow's order."""


@dataclass(frozen=True)
class Waits:
    """What a waiting job still waits for: how many jobs, and up to WAITS_SHOWN of their ids."""

    count: int = 0
    ids: tuple[str, ...] = ()
    queues: tuple[str, ...] = ()
    """The queue of each of `ids` (a flow may span queues)."""

    @property
    def shown(self) -> list[tuple[str, str]]:
        """(id, queue) of the jobs shown."""
        return list(zip(self.ids, self.queues, strict=True))

    @property
    def more(self) -> int:
        return self.count - len(self.ids)


@dataclass
class FlowPage:
    """One page of a flow: its jobs there (position in the flow, row, what it waits for), and
    the whole flow's counts by state."""

    jobs: list[tuple[int, JobInfo, Waits]]
    total: int
    by_state: dict[str, int]
    counted: int
    """How many of its jobs `by_state` counts (at most MAX_FLOW_COUNTED)."""
    callback: JobInfo | None
    """The job the flow ends with (the flow's id is its id), unless the flow ends in a group."""
    number: int
    last: int
    queues: frozenset[str] = frozenset()
    """The queues holding some of the flow's jobs."""


def flow_page(queue: Queue, flow_id: str, number: int, per_page: int = FLOW_PAGE) -> FlowPage:
    """Page `number` of a flow, its jobs in the flow's order (positions 1…n, over every shard
    that holds some, of `queue` and of every other queue a flow may span: `flows.members.spots`),
    read in a handful of pipelines whatever the flow's size. A page of the flow's jobs shows
    each one's handler, so it reads their payloads (a page's worth only)."""
    ids.validate_job_id(flow_id)
    spots = flow_spots(queue)
    keys = [q.shard(index).key(f"flow:{flow_id}") for q, index in spots]
    pipe = queue.client.pipeline(transaction=False)
    for key in keys:
        pipe.zcard(key).zrevrange(key, 0, 0, withscores=True).zscore(key, flow_id)
    replies = pipe.execute()
    sizes, tops, callback_at = replies[0::3], replies[1::3], replies[2::3]
    held = [n for n, size in enumerate(sizes) if size]
    highest = max((int(top[0][1]) for top in tops if top), default=0)
    last = max((highest + per_page - 1) // per_page, 1)
    number = min(max(number, 1), last)
    placed = _by_position(queue, keys, held, (number - 1) * per_page + 1, number * per_page)
    where = {job_id: position for position, _, job_id in placed}
    rows = rows_at(queue, [(*spots[n], job_id) for _, n, job_id in placed],
                   (*LIST_FIELDS, "payload"))
    counted = _by_position(queue, keys, held, 1, MAX_FLOW_COUNTED)
    waits = waits_of(queue, [row for row in rows if row.state == State.WAITING],
                     {job_id: spots[n][0].name for _, n, job_id in counted})
    pipe = queue.client.pipeline(transaction=False)
    for _, n, job_id in counted:
        q, index = spots[n]
        pipe.hget(q.shard(index).job(job_id), "state")
    by_state = Counter(state for state in pipe.execute() if state)
    callback = [(*spots[n], flow_id) for n in held if callback_at[n] is not None]
    return FlowPage([(where[row.id], row, waits.get(row.id, Waits())) for row in rows],
                    sum(sizes), dict(by_state), len(counted),
                    next(iter(rows_at(queue, callback[:1])), None), number, last,
                    frozenset(spots[n][0].name for n in held))


def _by_position(queue: Queue, keys: list[str], held: list[int], low: int, high: int
                 ) -> list[tuple[int, int, str]]:
    """(position, spot, id) of a flow's jobs at positions low…high, in order (`held`: the
    spots, indexes into `keys`, that hold some)."""
    pipe = queue.client.pipeline(transaction=False)
    for n in held:
        pipe.zrangebyscore(keys[n], low, high, withscores=True)
    return sorted((int(position), n, job_id) for n, found in zip(held, pipe.execute(),
                                                                 strict=True)
                  for job_id, position in found)


def waits_of(queue: Queue, jobs: list[JobInfo], where: Mapping[str, str] | None = None
             ) -> dict[str, Waits]:
    """What each of these waiting jobs still waits for (how many, and up to WAITS_SHOWN ids,
    each with its queue: `where`'s, else the one whose shard holds it, the waiting job's or any
    other a flow may span; '' for one found nowhere), in two pipelines."""
    pipe = queue.client.pipeline(transaction=False)
    for job in jobs:
        key = ShardKeys(job.queue, job.shard).key(f"deps:{job.id}")
        pipe.scard(key).srandmember(key, WAITS_SHOWN)
    replies = pipe.execute()
    shown = {job.id: tuple(sorted(ids)) for job, ids in zip(jobs, replies[1::2], strict=True)}
    where = dict(where or {})
    unplaced = {member for job in jobs for member in shown[job.id] if member not in where}
    if unplaced:
        asked = [(q.name, index, member) for q, index in flow_spots(queue) for member in unplaced]
        pipe = queue.client.pipeline(transaction=False)
        for name, index, member in asked:
            pipe.exists(ShardKeys(name, index).job(member))
        for (name, _, member), there in zip(asked, pipe.execute(), strict=True):
            if there:
                where.setdefault(member, name)
    return {job.id: Waits(int(count), shown[job.id], tuple(where.get(i, "") for i in shown[job.id]))
            for job, count in zip(jobs, replies[0::2], strict=True)}
