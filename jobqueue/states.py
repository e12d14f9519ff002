"""The job states, shared by the store, the mirror models and the admin."""

from __future__ import annotations

from django.db import models


class State(models.TextChoices):
    """Where a job is in its life. Terminal: succeeded, dead, cancelled, expired."""

    PENDING = "pending", "Pending"
    """Ready on its lane, waiting for a worker."""
    SCHEDULED = "scheduled", "Scheduled"
    """Waiting for its run_after time (a delay, or a retry's backoff)."""
    WAITING = "waiting", "Waiting"
    """Waiting for the jobs it depends on (a flow's later step, a chord's callback, a job
    enqueued with `depends_on`); released to pending once they are done."""
    ACTIVE = "active", "Active"
    """Leased by a worker until its lease deadline."""
    SUCCEEDED = "succeeded", "Succeeded"
    """Its handler returned; the result is stored."""
    DEAD = "dead", "Dead"
    """Its retry budget is spent, or it can never run; last_error says why."""
    CANCELLED = "cancelled", "Cancelled"
    """An operator cancelled it."""
    EXPIRED = "expired", "Expired"
    """It was not started before its `expires` time, so it never ran (or never ran again)."""
