"""What the console and its operators keep in the database: bulk operations on everything a
search matches (console/bulk.py runs them), the rollup the history charts read (written by the
mirror: history/rollup.py), and periodic jobs edited in the admin (operations/stored_schedules.py
fires them)."""

from __future__ import annotations

from typing import Any

from django.db import models

from .. import cron
from ..cron import Entry
from .history import HANDLER_LENGTH


class BulkOperation(models.Model):
    """An operator's action on every job a search matches (console/bulk.py runs it): what, on
    which jobs (the search's GET parameters, the queues the operator could act on), how far
    (`cursor`, saved with the counts after each chunk: a runner that dies is resumed from it),
    and who runs it now (`runner`, until `lease_until`): counted, confirmed, run."""

    class Status(models.TextChoices):
        COUNTING = "counting", "Counting"
        """Counting the jobs that match, for the operator to confirm."""
        COUNTED = "counted", "Counted"
        """Waiting for the operator to confirm the count."""
        RUNNING = "running", "Running"
        DONE = "done", "Done"
        FAILED = "failed", "Failed"
        DROPPED = "dropped", "Dropped"
        """The operator did not confirm it."""

    action = models.CharField(max_length=16)
    query = models.JSONField(default=dict)
    scope = models.JSONField(null=True, blank=True)
    """The queues the operator could act on (None: every queue)."""
    total = models.PositiveIntegerField(default=0)
    """How many jobs matched (counted before the operator confirmed)."""
    done = models.PositiveIntegerField(default=0)
    skipped = models.PositiveIntegerField(default=0)
    """Jobs that matched but had moved on when their turn came (a retry of a pending job)."""
    cursor = models.CharField(max_length=200, blank=True, default="")
    inflight = models.JSONField(default=list, blank=True)
    """The chunk being acted on ([queue, job id] each), saved before it is: a runner that dies
    mid-chunk leaves it here, and the next acts on it again (each job's transition carries a
    call id of the operation's, so a job it reached answers as it did, and no job of the chunk
    is left out)."""
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.RUNNING)
    running_key = models.CharField(max_length=64, null=True, blank=True, unique=True)
    """The action, query and scope hashed until it ends (None after): the same operation asked
    for or confirmed twice finds this one instead of starting a second."""
    created_by = models.CharField(max_length=150, blank=True, default="")
    runner = models.CharField(max_length=64, blank=True, default="")
    lease_until = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["status", "lease_until"], name="jq_bulk_status")]

    def __str__(self) -> str:
        return f"bulk {self.action} #{self.pk} ({self.status})"


BINS = 56
"""The bins of a rollup bucket's wait and run time histograms (history/rollup.py)."""
OUTCOMES = ("succeeded", "dead", "cancelled", "expired")
COUNTS = (*OUTCOMES, "retried")
"""Per bucket: jobs that ended in each terminal state, and the failed runs retried before
their last (`attempts` − 1 of each)."""
WAIT = tuple(f"w{i}" for i in range(BINS))
RUN = tuple(f"r{i}" for i in range(BINS))
ALL_COUNTS = (*COUNTS, *WAIT, *RUN)


class Rollup(models.Model):
    """Finished jobs of one queue and handler (or of all its handlers: `rollup.TOTAL`) in one
    minute, hour or day (`resolution` seconds): counts by outcome and histograms of wait and
    run times. Written by the mirror (history/rollup.py), read by the console's charts."""

    resolution = models.PositiveIntegerField()
    start = models.DateTimeField()
    queue = models.CharField(max_length=64)
    handler = models.CharField(max_length=HANDLER_LENGTH)
    locals().update({name: models.BigIntegerField(default=0, db_default=0) for name in ALL_COUNTS})

    class Meta:
        constraints = [models.UniqueConstraint(fields=["resolution", "start", "queue", "handler"],
                                               name="jq_rollup_key")]
        indexes = [models.Index(fields=["resolution", "handler", "start"], name="jq_rollup_handler")]

    def __str__(self) -> str:
        return f"{self.queue} {self.handler} {self.start:%Y-%m-%d %H:%M} ({self.resolution}s)"


class Schedule(models.Model):
    """One periodic job edited in the admin (the fields of a `JOBQUEUE["SCHEDULE"]` entry)."""

    name = models.CharField(max_length=100, unique=True)
    job = models.CharField(max_length=200, help_text="The dotted path of an @job handler.")
    cron = models.CharField(
        max_length=100,
        blank=True,
        help_text=("Five fields: minute hour day-of-month month day-of-week (or give 'every')."),
    )
    every = models.FloatField(null=True, blank=True, help_text="Seconds between ticks (or give 'cron').")
    timezone = models.CharField(max_length=64, default="UTC", help_text="The cron's timezone.")
    args = models.JSONField(default=list, blank=True, help_text="A JSON list.")
    kwargs = models.JSONField(default=dict, blank=True, help_text="A JSON object.")
    queue = models.CharField(max_length=64, blank=True, help_text="Blank: the handler's queue.")
    lane = models.CharField(max_length=128, blank=True)
    priority = models.SmallIntegerField(null=True, blank=True, help_text="−100…100; blank: the handler's.")
    enabled = models.BooleanField(default=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        app_label = "jobqueue"
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def spec(self) -> dict[str, Any]:
        """The row as a `JOBQUEUE["SCHEDULE"]` entry."""
        spec: dict[str, Any] = {
            "job": self.job,
            "timezone": self.timezone or "UTC",
            "args": self.args,
            "kwargs": self.kwargs,
        }
        if self.cron:
            spec["cron"] = self.cron
        if self.every is not None:
            spec["every"] = self.every
        for name in ("queue", "lane", "priority"):
            if getattr(self, name) not in (None, ""):
                spec[name] = getattr(self, name)
        return spec

    def entry(self) -> Entry:
        """The row as an `Entry` (ConfigurationError when it is not a valid one)."""
        return cron.parse({self.name: self.spec()})[self.name]
