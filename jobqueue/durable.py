"""A durable job's database row, kept in step with the operator's retry that reopens it.

outbox.py writes a durable queue's rows and rebuilds Valkey from the unfinished ones (`jobqueue
restore`); the mirror makes them terminal as jobs finish. A retry makes a finished job unfinished
again, so its row must say so too, or a Valkey that loses its data loses the retried job. The
retried run's own `done` event may still wait in the stream: the row notes when that run ended,
and the mirror does not let an event of that run (or an older one) finish the reopened row again
(`stale_events`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from .states import State

UNFINISHED = (State.PENDING, State.SCHEDULED, State.WAITING)


@contextmanager
def reopened(job_id: str, after: datetime | None) -> Iterator[None]:
    """Run a retry's Valkey transition inside a transaction that first moves the job's durable
    row (if it has one) back to pending: a retry Valkey refuses leaves the row as it was, and
    the row's lock holds back a worker's mirror write of the retried run until the commit.
    `after`: when the retried run ended, on Valkey's clock (its `finished_at`); the expiry goes,
    as retry.lua drops it."""
    from django.db import transaction

    from .models import Job

    with transaction.atomic():
        Job.objects.filter(pk=job_id, durable=True).update(
            state=State.PENDING, finished_at=None, relayed=True, expires_at=None,
            reopened_after=after)
        yield


def stale_events(rows: Mapping[str, Mapping[str, Any]]) -> set[str]:
    """The ids among a mirror batch (`Job` columns by id) whose event belongs to a run an
    operator retried since: the durable row is unfinished again and the event ended no later
    than that run. Both times are Valkey's, so no clock skew can misorder them; a replayed event
    is judged the same way each time. Locks the rows it reads: call it in the transaction that
    writes the batch, so a retry committing meanwhile waits for it."""
    from .models import Job

    reopened = Job.objects.select_for_update().filter(
        pk__in=list(rows), durable=True, state__in=UNFINISHED, reopened_after__isnull=False,
    ).values_list("pk", "reopened_after")
    return {pk for pk, after in reopened
            if (ended := rows[pk]["finished_at"]) is None or ended <= after}
