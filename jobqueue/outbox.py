"""Durable queues: the database row first (a transactional outbox), Valkey second.

For a queue with `durable: True`, enqueue inserts each job's `Job` row — inside the caller's
transaction when there is one, so a rollback leaves neither row nor job — and pushes the job to
Valkey once the row is committed. Valkey is then a fast index of the work that can be rebuilt:

- `relay` (run by every worker's mirror, and by a `--burst` run before it decides it is
  done) sends the rows no relay pass has confirmed yet, so a job whose push failed (Valkey down
  at the commit) reaches Valkey once it answers;
- `restore` (`manage.py jobqueue restore`) re-creates every unfinished durable job Valkey lacks,
  after Valkey lost its data.

Both are idempotent: the id is minted before either write, and an enqueue with a known id is a
no-op while Valkey holds that job. The mirror makes the same rows terminal when jobs finish; an
operator's retry makes them unfinished again (durable.py, and `recreate` for a job whose Valkey
row has expired).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from .durable import reopened
from .records import JobRef
from .spec import JobSpec, Prepared
from .states import State

if TYPE_CHECKING:
    from .models import Job
    from .store import Queue

log = logging.getLogger("jobqueue.outbox")
UNFINISHED = (State.PENDING, State.SCHEDULED)
RELAY_GRACE = 5.0
"""Seconds a durable row is left to its own push before a relay pass sends it again."""


def write(queue: Queue, prepared: Sequence[Prepared]) -> None:
    """Insert the rows of durable jobs (one multi-row INSERT), in the current transaction."""
    from .layouts import last_read, place
    from .models import EncodedJSON, insert_jobs

    now = datetime.now(UTC)
    shards = last_read(queue.client, queue.name, queue.configured)  # Valkey may be down: a guess
    insert_jobs({
        "id": job.job_id, "queue": queue.name,
        "shard": place(job.job_id, job.lane, job.unique_key, shards), "lane": job.lane,
        "state": State.SCHEDULED if job.delay_ms else State.PENDING, "priority": job.priority,
        "attempts": 0, "max_attempts": job.max_attempts, "payload": EncodedJSON(job.payload),
        "result": None, "last_error": "", "unique_key": job.unique_key, "worker": "",
        "enqueued_at": now, "started_at": None, "finished_at": None, "mirrored_at": now,
        "durable": True, "relayed": False, "run_after": now + timedelta(milliseconds=job.delay_ms),
        "backoff_ms": job.backoff_ms, "lease_ms": job.lease_ms, "history": None,
    } for job in prepared)


def push(queue: Queue, specs: list[JobSpec]) -> None:
    """Send committed durable jobs to Valkey; if Valkey is down they wait for the relay."""
    from redis.exceptions import ConnectionError as ValkeyConnectionError
    from redis.exceptions import TimeoutError as ValkeyTimeoutError

    from .exceptions import NotReplicated

    try:
        refs = queue.enqueue_many(specs)
    except (ValkeyConnectionError, ValkeyTimeoutError) as exc:
        log.warning("queue=%s: Valkey unreachable (%s); %d durable job(s) wait in the database "
                    "for a worker's relay", queue.name, exc, len(specs))
        return
    except NotReplicated as exc:  # the rows are the durable copy: `jobqueue restore` has them
        log.warning("%s; the database holds them", exc)
        refs = exc.refs
    _cancel_duplicates(specs, refs)


def _cancel_duplicates(specs: Sequence[JobSpec], refs: Sequence[JobRef]) -> None:
    """A durable job whose unique_key a live job already held never runs: its row, written
    before Valkey could say so, becomes cancelled and names the job that holds the key."""
    from .models import Job

    for spec, ref in zip(specs, refs, strict=True):
        if spec.job_id is not None and ref.id != spec.job_id:
            Job.objects.filter(pk=spec.job_id, state__in=UNFINISHED).update(
                state=State.CANCELLED, finished_at=datetime.now(UTC),
                last_error=f"unique_key {spec.unique_key!r} is held by job {ref.id}")


def spec_of(row: Job) -> JobSpec:
    """The enqueue that creates a durable row's job again, with its own id."""
    due = row.run_after if row.run_after and row.run_after > datetime.now(UTC) else None
    return JobSpec(
        row.payload, job_id=row.id, lane=row.lane or None, priority=row.priority,
        run_after=due, max_attempts=row.max_attempts or None,
        backoff=None if row.backoff_ms is None else row.backoff_ms / 1000,
        lease=(row.lease_ms / 1000) if row.lease_ms else None, unique_key=row.unique_key or None,
    )


def recreate(queue: Queue, row: Job) -> None:
    """An operator's retry of a finished job that Valkey no longer holds: the job is created
    again from its row, same id and every option the row keeps (lane, priority, retry policy,
    lease, unique key). A durable row reopens in the same transaction (durable.py)."""
    from .exceptions import InvalidTransition

    spec = spec_of(row)._replace(run_after=None)  # due now, whenever it was first due
    with reopened(row.pk):
        [ref] = queue.enqueue_many([spec])
        if ref.id != row.pk:
            raise InvalidTransition(f"cannot retry job {row.pk}: its unique_key "
                                    f"{row.unique_key!r} is held by live job {ref.id}")


def _resend(queue: Queue, rows: Sequence[Job]) -> int:
    """Enqueue rows again by id; mark them relayed; how many Valkey did not have."""
    from .models import Job

    specs = [spec_of(row) for row in rows]
    refs = queue.enqueue_many(specs)
    Job.objects.filter(pk__in=[row.pk for row in rows], relayed=False).update(relayed=True)
    _cancel_duplicates(specs, refs)
    return sum(1 for ref in refs if ref.created)


def relay(queues: Iterable[Queue], grace: float = RELAY_GRACE, limit: int = 2000) -> int:
    """Send durable rows no relay pass has confirmed yet (older than `grace` seconds) to Valkey.
    Returns how many Valkey lacked (a push that had failed)."""
    from .models import Job

    cutoff = datetime.now(UTC) - timedelta(seconds=grace)
    sent = 0
    for queue in queues:
        if not queue.options.durable:
            continue
        rows = list(Job.objects.filter(relayed=False, enqueued_at__lte=cutoff, queue=queue.name,
                                       state__in=UNFINISHED).order_by("enqueued_at")[:limit])
        if rows:
            sent += _resend(queue, rows)
    if sent:
        log.warning("relayed %d durable job(s) that had not reached Valkey", sent)
    return sent


def restore(queues: Iterable[Queue], batch: int = 500,
            progress: Callable[[str, int, int], None] | None = None) -> int:
    """Re-create in Valkey every unfinished durable job it lacks; returns how many."""
    from .models import Job

    restored = 0
    for queue in queues:
        last, seen = "", 0
        while True:
            rows = list(Job.objects.filter(durable=True, queue=queue.name, state__in=UNFINISHED,
                                           pk__gt=last).order_by("pk")[:batch])
            if not rows:
                break
            restored += _resend(queue, rows)
            seen += len(rows)
            last = rows[-1].pk
            if progress:
                progress(queue.name, seen, restored)
    return restored
