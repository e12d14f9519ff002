"""A durable job's database row, kept in step with the operator's retry that reopens it.

outbox.py writes a durable queue's rows and rebuilds Valkey from the unfinished ones (`jobqueue
restore`); the mirror makes them terminal as jobs finish. A retry makes a finished job unfinished
again, so its row must say so too, or a Valkey that loses its data loses the retried job.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from .states import State


@contextmanager
def reopened(job_id: str) -> Iterator[None]:
    """Run a retry's Valkey transition inside a transaction that first moves the job's durable
    row (if it has one) back to pending: a retry Valkey refuses leaves the row as it was, and
    the row's lock holds back a worker's mirror write of the retried run until the commit."""
    from django.db import transaction

    from .models import Job

    with transaction.atomic():
        Job.objects.filter(pk=job_id, durable=True).update(
            state=State.PENDING, finished_at=None, relayed=True)
        yield
