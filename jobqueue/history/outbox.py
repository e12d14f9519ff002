"""Durable queues: the database row first (a transactional outbox), Valkey second.

For a queue with `durable: True`, enqueue inserts each job's `Job` row — inside the caller's
transaction when there is one, so a rollback leaves neither row nor job — and pushes the job to
Valkey once the row is committed. The rows are written on the default alias: inside a
transaction on another alias (`elsewhere`), which they could not roll back with, they are
written once it commits, and pushed then. Valkey is then a fast index of the work that can be rebuilt:

- `resend` (run by every worker's mirror, and by a `--burst` run before it decides it is
  done) sends again the rows no push or resend has confirmed yet, so a job whose push failed (Valkey down
  at the commit) reaches Valkey once it answers;
- `restore` (`manage.py jobqueue restore`) re-creates every unfinished durable job Valkey lacks,
  after Valkey lost its data.

Both are idempotent: the id is minted before either write, and an enqueue with a known id is a
no-op while Valkey holds that job.

A flow on a durable queue (a chain, group, chord, `depends_on`) writes each job's row with its
place in the flow (the `flow` column: the flow's id, its position, the jobs it waits for with
their slots and policies, what their outcomes become), each on its shard (graph.placement: a
flow may span the queue's shards). The push after the commit, a resend or a restore sends them
through the `flow` script (graph.write), members before the jobs waiting for them; a member that
Valkey no longer holds and whose row has finished gives the script its outcome (its result, or
its failure under the edge's policy), so a waiting job comes back waiting only for what has not
finished. A spread flow whose writer died between its calls is sent again the same way (its
rows are marked relayed, the column's name for "reached Valkey", once every call of its push
answered, or once a resend sent them);
a job Valkey holds already is left on its shard (graph.write, mode 'again').

The mirror makes the same rows terminal when jobs finish; an operator's retry makes them
unfinished again (models.reopened, and `recreate` for a job whose Valkey row has expired).
"""

from __future__ import annotations

import heapq
import json
import logging
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import DEFAULT_DB_ALIAS

from .._compat import open_transactions
from ..engine.refs import JobRef
from ..exceptions import InvalidFlow
from ..flows import graph
from ..spec import JobSpec, Prepared
from ..states import State

if TYPE_CHECKING:
    from ..engine.store import Queue
    from ..models import Job

log = logging.getLogger("jobqueue.outbox")
MIN_EXPIRY = timedelta(milliseconds=1)
"""The least time to expiry a resent job is given (a row that expires as it is being sent)."""
FINISHED = (State.SUCCEEDED, State.DEAD, State.CANCELLED, State.EXPIRED)
RESEND_GRACE = 5.0
"""Seconds a durable row is left to its own push before a resend sends it again."""


def elsewhere() -> bool:
    """Whether this thread has a transaction open on another database alias than the one the
    rows are written on (`insert_jobs`: the default one). Rows written now would commit on
    their own and outlive that transaction's rollback (a worker's resend would then run them):
    the caller writes them once every open transaction has committed."""
    return any(alias != DEFAULT_DB_ALIAS for alias in open_transactions())


def write(queue: Queue, prepared: Sequence[Prepared]) -> None:
    """Insert the rows of durable jobs (one multi-row INSERT), in the current transaction."""
    from ..engine.layouts import last_read, place
    from ..models import insert_jobs

    shards = last_read(queue.client, queue.name, queue.configured)  # Valkey may be down: a guess
    now = datetime.now(UTC)
    insert_jobs(_columns(queue, job, place(job.job_id, job.lane, job.unique_key, shards), now)
                for job in prepared)


def _columns(queue: Queue, job: Prepared, shard: int, now: datetime) -> dict[str, Any]:
    """A durable job's row as enqueued: every column."""
    from ..records import EncodedJSON

    return {
        "id": job.job_id, "queue": queue.name, "shard": shard, "lane": job.lane,
        "state": State.SCHEDULED if job.delay_ms else State.PENDING, "priority": job.priority,
        "attempts": 0, "max_attempts": job.max_attempts, "payload": EncodedJSON(job.payload),
        "result": None, "last_error": "", "unique_key": job.unique_key, "worker": "",
        "enqueued_at": now, "started_at": None, "finished_at": None, "changed_at": None, "mirrored_at": now,
        "durable": True, "relayed": False, "run_after": now + timedelta(milliseconds=job.delay_ms),
        "backoff_ms": job.backoff_ms, "lease_ms": job.lease_ms, "timeout_ms": job.timeout_ms or None,
        "expires_at": now + timedelta(milliseconds=job.expires_ms) if job.expires_ms else None,
        "reopened_after": None, "history": None, "progress": None, "flow": None, "batch": None,
    }


def write_flow(queue: Queue, nodes: Sequence[graph.Node], prepared: Sequence[Prepared],
               flow: str) -> dict[str, int]:
    """Insert the rows of a durable flow's jobs, in the current transaction, each with its
    place in the flow, each on its shard (`graph.placement`, the durable jobs it waits for
    located by their rows); the shards by id. InvalidFlow: it waits for a job with no row
    here."""
    from ..engine.layouts import last_read
    from ..models import Job, insert_jobs

    away = graph.outside(nodes)
    rows = dict(Job.objects.filter(pk__in=away, queue=queue.name, durable=True)
                .values_list("pk", "shard"))
    missing = sorted(away - set(rows))
    if missing:
        raise InvalidFlow(f"no job {missing[0]} in durable queue {queue.name!r} to depend on")
    shards = last_read(queue.client, queue.name, queue.configured)
    where = graph.placement(list(zip(nodes, prepared, strict=True)), {queue.name: shards}, {},
                            lambda m: graph.Place(queue.name, rows[m]) if m in rows else None,
                            home=queue.name)
    now = datetime.now(UTC)
    written, placed = [], {}
    for position, (node, job) in enumerate(zip(nodes, prepared, strict=True), 1):
        at = where[job.job_id]
        placed[job.job_id] = index = 0 if at is None else at.shard
        row = _columns(queue, job, index, now)
        if node.members:
            row["state"] = State.WAITING
        row["flow"] = {"flow": flow, "position": position, "takes": node.takes,
                       "slots": node.slots, "members": [list(m) for m in node.members]}
        written.append(row)
    insert_jobs(written)
    return placed


def push_flow(queue: Queue, nodes: Sequence[graph.Node], prepared: list[Prepared], flow: str,
              shards: dict[str, int]) -> None:
    """Send a committed durable flow to Valkey (each job on `shards`, its row's shard, unless
    its lane's is another now); if Valkey is down (or a job it waits for has not reached Valkey
    yet) its rows wait for a worker's resend."""
    from redis.exceptions import ConnectionError as ValkeyConnectionError
    from redis.exceptions import TimeoutError as ValkeyTimeoutError

    from ..models import Job

    try:
        _send(queue, nodes, prepared, flow, shards)
    except (ValkeyConnectionError, ValkeyTimeoutError, InvalidFlow) as exc:
        log.warning("queue=%s: flow %s not sent (%s); its %d durable job(s) wait in the "
                    "database for a worker's resend", queue.name, flow or "-", exc, len(nodes))
        return
    # (every call answered: a resend has nothing to send again; a writer that died before
    # this line leaves its rows to the resend, which sends what Valkey lacks)
    Job.objects.filter(pk__in=list(shards), relayed=False).update(relayed=True)
    graph.announced([JobRef(job.job_id, queue.name) for job in prepared])


def _send(queue: Queue, nodes: Sequence[graph.Node], prepared: list[Prepared], flow: str,
          shards: dict[str, int], again: bool = True) -> int:
    """Write durable flow jobs through the flow script, the outcomes of the finished jobs they
    wait for (per their rows) given along; how many Valkey did not have. Rows that name
    another shard than the one written to are told."""
    from ..models import Job

    where, written = graph.write(queue, nodes, prepared, flow,
                               outcomes=_outcomes(graph.outside(nodes)), again=again, prefer=shards)
    for job_id, (_, index) in where.items():
        if shards.get(job_id) != index:  # (the layout changed since the row was written)
            Job.objects.filter(pk=job_id).update(shard=index)
    return written


def _outcomes(members: Iterable[str]) -> dict[str, graph.Outcome]:
    """The outcomes of the finished jobs among `members`, as their rows hold them."""
    from ..models import Job

    found: dict[str, graph.Outcome] = {}
    rows = Job.objects.filter(pk__in=list(members), state__in=FINISHED).values_list(
        "pk", "state", "result", "last_error")
    for pk, state, result, error in rows:
        ok = state == State.SUCCEEDED
        found[pk] = (state, json.dumps(result, separators=(",", ":")) if ok else error)
    return found


def push(queue: Queue, specs: list[JobSpec]) -> None:
    """Send committed durable jobs to Valkey; if Valkey is down they wait for a worker's resend."""
    from redis.exceptions import ConnectionError as ValkeyConnectionError
    from redis.exceptions import TimeoutError as ValkeyTimeoutError

    from ..conf import get_config
    from ..exceptions import NotReplicated
    from ..spec import prepare

    limit = get_config().max_payload
    try:  # (fresh: the rows were just written, so no shard holds their ids yet)
        refs = queue.enqueue_prepared([prepare(spec, queue.options, limit) for spec in specs],
                                      fresh=True)
    except (ValkeyConnectionError, ValkeyTimeoutError) as exc:
        log.warning("queue=%s: Valkey unreachable (%s); %d durable job(s) wait in the database "
                    "for a worker's resend", queue.name, exc, len(specs))
        return
    except NotReplicated as exc:  # the rows are the durable copy: `jobqueue restore` has them
        log.warning("%s; the database holds them", exc)
        refs = exc.refs
    _cancel_duplicates(specs, refs)


def _cancel_duplicates(specs: Sequence[JobSpec], refs: Sequence[JobRef]) -> None:
    """A durable job whose unique_key a live job already held never runs: its row, written
    before Valkey could say so, becomes cancelled and names the job that holds the key."""
    from ..models import UNFINISHED, Job

    for spec, ref in zip(specs, refs, strict=True):
        if spec.job_id is not None and ref.id != spec.job_id:
            Job.objects.filter(pk=spec.job_id, state__in=UNFINISHED).update(
                state=State.CANCELLED, finished_at=datetime.now(UTC),
                last_error=f"unique_key {spec.unique_key!r} is held by job {ref.id}")


def spec_of(row: Job) -> JobSpec:
    """The enqueue that creates a durable row's job again, with its own id (and what is left
    of its time to expiry: `_resend` sends no row past it)."""
    now = datetime.now(UTC)
    due = row.run_after if row.run_after and row.run_after > now else None
    expires = None if row.expires_at is None else max(row.expires_at - now, MIN_EXPIRY)
    return JobSpec(
        row.payload, job_id=row.id, lane=row.lane or None, priority=row.priority,
        run_after=due, max_attempts=row.max_attempts or None,
        backoff=None if row.backoff_ms is None else row.backoff_ms / 1000,
        lease=(row.lease_ms / 1000) if row.lease_ms else None, unique_key=row.unique_key or None,
        expires=expires, timeout=(row.timeout_ms / 1000) if row.timeout_ms else None,
    )


def _sendable(queue: Queue, rows: Sequence[Job]) -> list[Job]:
    """The rows whose job an enqueue accepts. A row written otherwise (by hand, or by another
    program: an option out of range, a payload past MAX_PAYLOAD) ends dead with the reason,
    rather than holding back the rows sent with it."""
    from ..conf import get_config
    from ..exceptions import JobQueueError
    from ..models import UNFINISHED, Job
    from ..spec import prepare

    sendable = []
    for row in rows:
        try:
            prepare(spec_of(row), queue.options, get_config().max_payload)
        except JobQueueError as exc:
            log.warning("queue=%s job=%s: its durable row cannot be sent to Valkey (%s): dead",
                        queue.name, row.pk, exc)
            Job.objects.filter(pk=row.pk, state__in=UNFINISHED).update(
                state=State.DEAD, finished_at=datetime.now(UTC), relayed=True,
                last_error=f"cannot be sent to Valkey: {exc}")
        else:
            sendable.append(row)
    return sendable


def recreate(queue: Queue, row: Job) -> None:
    """An operator's retry of a finished job that Valkey no longer holds: the job is created
    again from its row, same id and every option the row keeps (lane, priority, retry policy,
    lease, unique key; a durable flow's job waits again for what it waits for, as far as their
    rows say it has to), its attempts going on from the row's (a token never repeats, and the
    mirror takes the new run's outcome as the newer one). A durable row reopens in the same
    transaction (models.reopened)."""
    from ..conf import get_config
    from ..exceptions import InvalidTransition
    from ..models import reopened
    from ..spec import prepare

    # Due now, whenever it was first due, and without its expiry (as retry.lua drops it).
    spec = spec_of(row)._replace(run_after=None, expires=None)
    with reopened(row.pk, after=row.finished_at):
        if row.durable and row.flow is not None:
            node = _node(row)._replace(spec=spec)
            [job] = graph.checked(queue, [node])
            _send(queue, [node], [job._replace(spent=row.attempts)], row.flow.get("flow", ""),
                  {row.pk: row.shard}, again=False)
            return
        job = prepare(spec, queue.options, get_config().max_payload)._replace(spent=row.attempts)
        [ref] = queue.enqueue_prepared([job])
        if ref.id != row.pk:
            raise InvalidTransition(f"cannot retry job {row.pk}: its unique_key "
                                    f"{row.unique_key!r} is held by live job {ref.id}")


def _resend(queue: Queue, rows: Sequence[Job], *, lost: bool = False) -> int:
    """Enqueue rows again by id (a job a shard holds, whichever, is left as it is:
    `sending.send`); mark them relayed; how many Valkey did not have. A row past its expiry
    that no shard holds is not sent but marked expired, as a claim would have ended its job
    (one a shard holds is Valkey's to end: it may have started in time). `lost`: Valkey lost
    its data (a restore), so the job's runs before may have spent tokens the row never saw:
    its attempts go past them (`Prepared.spent`)."""
    from ..conf import get_config
    from ..engine.sending import held
    from ..models import UNFINISHED, Job
    from ..spec import prepare

    now = datetime.now(UTC)
    past = [row.pk for row in rows if row.expires_at is not None and row.expires_at <= now]
    if past:
        there = held(queue.client, queue.name, queue.layout(fresh=True).widest, past)
        expired = [pk for pk in past if pk not in there]
        Job.objects.filter(pk__in=expired, state__in=UNFINISHED).update(
            state=State.EXPIRED, finished_at=now, relayed=True,
            last_error="expired before it started")
        rows = [row for row in rows if row.pk not in expired]
        if not rows:
            return 0
    specs = [spec_of(row) for row in rows]
    limit = get_config().max_payload
    jobs = [prepare(spec, queue.options, limit)._replace(spent=_spent(row) if lost else 0)
            for spec, row in zip(specs, rows, strict=True)]
    refs = queue.enqueue_prepared(jobs)
    Job.objects.filter(pk__in=[row.pk for row in rows], relayed=False).update(relayed=True)
    _cancel_duplicates(specs, refs)
    return sum(1 for ref in refs if ref.created)


def _spent(row: Job) -> int:
    """The tokens a durable job's runs may have used before Valkey lost its data: the row's
    attempts (what the mirror saw last), plus as many runs as its budget allows since (the
    mirror writes only finished runs; a run in flight when the data went held the next)."""
    return row.attempts + max(row.max_attempts, 1)


def _node(row: Job) -> graph.Node:
    """A durable flow row as a job of its flow. One that has run already (an operator retried
    it) took its members' outcomes into its payload then: it waits for nothing again."""
    record = row.flow or {}
    spec = spec_of(row)
    if row.attempts:
        return graph.Node(spec, position=int(record.get("position", 0)))
    return graph.Node(spec, tuple((str(m), int(slot), str(policy))
                                for m, slot, policy in record.get("members", [])),
                    str(record.get("takes", "")), int(record.get("slots", 0)),
                    int(record.get("position", 0)))


def _members_first(rows: Sequence[Job]) -> list[Job]:
    """Durable flow rows ordered so that each comes after the rows it waits for (by flow and
    shard otherwise, so that a flow's jobs of one shard go in one call, then by id: ids are
    minted in order)."""
    by_id = {row.pk: row for row in rows}
    key = {row.pk: ((row.flow or {}).get("flow", ""), row.shard, row.pk) for row in rows}
    waits = {row.pk: {m[0] for m in (row.flow or {}).get("members", []) if m[0] in by_id}
             for row in rows}
    after: dict[str, list[str]] = {}
    for pk, members in waits.items():
        for member in members:
            after.setdefault(member, []).append(pk)
    ready = sorted(key[pk] for pk, members in waits.items() if not members)
    ordered: list[Job] = []
    while ready:
        pk = heapq.heappop(ready)[2]
        ordered.append(by_id[pk])
        for dependent in after.get(pk, ()):
            waits[dependent].discard(pk)
            if not waits[dependent]:
                heapq.heappush(ready, key[dependent])
    return ordered


def _resend_flows(queue: Queue, rows: Sequence[Job], chunk: int = 500, *,
                  lost: bool = False) -> int:
    """Send durable flow rows again, members first, one flow script call per run of rows of
    one flow on one shard; mark the rows sent relayed; how many Valkey did not have. A run
    whose member has neither reached Valkey nor finished is left to a later pass. `lost`: as
    `_resend`'s (a restore: each job's attempts go past the tokens its runs may have used)."""
    from ..models import Job

    ordered, sent, start = _members_first(rows), 0, 0
    while start < len(ordered):
        first = ordered[start]
        key = ((first.flow or {}).get("flow", ""), first.shard)
        end = start + 1
        while (end < len(ordered) and end - start < chunk
               and ((ordered[end].flow or {}).get("flow", ""), ordered[end].shard) == key):
            end += 1
        run = ordered[start:end]
        start = end
        nodes = [_node(row) for row in run]
        try:
            prepared = [job._replace(spent=_spent(row) if lost else 0)
                        for job, row in zip(graph.checked(queue, nodes), run, strict=True)]
            sent += _send(queue, nodes, prepared, key[0], {row.pk: row.shard for row in run})
        except InvalidFlow as exc:
            log.warning("queue=%s: flow %s not sent again yet (%s)", queue.name, key[0] or "-", exc)
            continue
        Job.objects.filter(pk__in=[row.pk for row in run], relayed=False).update(relayed=True)
    return sent


def resend(queues: Iterable[Queue], grace: float = RESEND_GRACE, limit: int = 2000) -> int:
    """Send durable rows that no push or resend has confirmed in Valkey yet (older than `grace`
    seconds) again; returns how many Valkey lacked (a push that had failed). Relaying is another
    thing: flows' outcomes carried across shards (flows/relay.py)."""
    from ..models import UNFINISHED, Job

    cutoff = datetime.now(UTC) - timedelta(seconds=grace)
    sent = 0
    for queue in queues:
        if not queue.options.durable:
            continue
        rows = list(Job.objects.filter(relayed=False, enqueued_at__lte=cutoff, queue=queue.name,
                                       state__in=UNFINISHED).order_by("enqueued_at", "pk")[:limit])
        plain = [row for row in rows if row.flow is None]
        if plain:  # first: a flow's job may wait for them
            sent += _resend(queue, _sendable(queue, plain))
        if len(plain) < len(rows):
            sent += _resend_flows(queue, [row for row in rows if row.flow is not None])
    if sent:
        log.warning("resent %d durable job(s) that had not reached Valkey", sent)
    return sent


def restore(queues: Iterable[Queue], batch: int = 500,
            progress: Callable[[str, int, int], None] | None = None) -> int:
    """Re-create in Valkey every unfinished durable job it lacks; returns how many. Jobs of
    flows come after the others (they may wait for them), members before what waits for them."""
    from ..models import UNFINISHED, Job

    restored = 0
    for queue in queues:
        last, seen = "", 0
        unfinished = Job.objects.filter(durable=True, queue=queue.name, state__in=UNFINISHED)
        while True:
            rows = list(unfinished.filter(flow__isnull=True, pk__gt=last).order_by("pk")[:batch])
            if not rows:
                break
            restored += _resend(queue, _sendable(queue, rows), lost=True)
            seen += len(rows)
            last = rows[-1].pk
            if progress:
                progress(queue.name, seen, restored)
        order = [row.pk for row in _members_first(list(
            unfinished.filter(flow__isnull=False).only("id", "flow", "shard")))]
        for start in range(0, len(order), batch):
            found = Job.objects.in_bulk(order[start:start + batch])
            restored += _resend_flows(queue, [found[pk] for pk in order[start:start + batch]
                                              if pk in found], lost=True)
            seen += min(batch, len(order) - start)
            if progress:
                progress(queue.name, seen, restored)
    return restored
