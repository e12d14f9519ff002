"""Periodic jobs kept in the database (`Schedule`, edited in the Django admin) beside those of
`JOBQUEUE["SCHEDULE"]`: the same entries (cron.py), fired the same way (schedule.py), each
tick once by any worker.

A saved or deleted row bumps a counter in Valkey (VERSION_KEY) once its transaction commits;
each worker reads the counter at every schedule turn (one GET, every `maintenance_every`
second) and reads the rows again only when it moved (`Loader`), so a change is seen within a
second and the database is not asked otherwise. The settings' entries never wait for the
database: a worker that cannot read the rows goes on firing them (and the rows it read last).
The admin's form (admin.py's `ScheduleForm`) checks a row as a settings' entry is checked and
refuses a settings' entry's name (the settings' entry wins if one appears later). Disabled rows
do not fire.

The model, `Schedule`, is in jobqueue/models/console.py, read here inside functions only: a
worker's pool process imports the worker's modules (and so this one) before Django is set up.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.db.models.signals import post_delete, post_save

from ..cron import Entry
from ..exceptions import JobQueueError

if TYPE_CHECKING:
    from ..models import Schedule

log = logging.getLogger("jobqueue.schedule")
VERSION_KEY = "emq:schedules:version"
"""STRING: bumped by every change of a `Schedule` row (workers reload the rows when it moves)."""
RETRY_EVERY = 30.0
"""Seconds between a worker's tries to read the rows after a failed one (a database down)."""


def enabled_entries() -> dict[str, Entry]:
    """The enabled rows as entries (a row no longer valid, say its handler removed, is logged
    and left out: the others still fire)."""
    from ..models import Schedule

    entries = {}
    for row in Schedule.objects.filter(enabled=True):
        try:
            entries[row.name] = row.entry()
        except JobQueueError as exc:
            log.error("periodic job %s (database): %s; it does not fire", row.name, exc)
    return entries


def listed() -> list[tuple[Entry, Schedule | None]]:
    """Every periodic job an operator sees: the settings' entries (None: not a row), then the
    valid rows, disabled ones too."""
    from ..conf import get_config
    from ..models import Schedule

    settings = get_config().schedule
    found: list[tuple[Entry, Schedule | None]] = [(entry, None) for entry in settings.values()]
    for row in Schedule.objects.exclude(name__in=list(settings)):
        try:
            found.append((row.entry(), row))
        except JobQueueError:
            continue
    return found


def find(name: str) -> Entry | None:
    """The settings' entry named `name`, else the row's (enabled or not), else None."""
    from ..conf import get_config
    from ..models import Schedule

    entry = get_config().schedule.get(name)
    if entry is not None:
        return entry
    row = Schedule.objects.filter(name=name).first()
    try:
        return row.entry() if row is not None else None
    except JobQueueError:
        return None


def bump(client: Any = None) -> None:
    """Tell the workers the rows changed (after the transaction commits)."""
    from ..conf import get_client

    def send() -> None:
        try:
            (client or get_client()).incr(VERSION_KEY)
        except Exception:  # Valkey down: no worker fires anything meanwhile; they reload later
            log.warning("could not tell the workers that a periodic job changed", exc_info=True)

    transaction.on_commit(send)


def _changed(sender: Any, **_: Any) -> None:
    bump()


post_save.connect(_changed, sender="jobqueue.Schedule", dispatch_uid="jobqueue.schedule.saved")
post_delete.connect(_changed, sender="jobqueue.Schedule", dispatch_uid="jobqueue.schedule.deleted")


class Loader:
    """A worker's copy of the enabled rows, read again when VERSION_KEY moves."""

    def __init__(self) -> None:
        self._version: Any = object()  # (never equal to what Valkey answers: the first read loads)
        self._entries: dict[str, Entry] = {}
        self._retry_at = 0.0

    def entries(self, client: Any, settings: Mapping[str, Entry]) -> dict[str, Entry]:
        """The settings' entries and the rows' (a settings' entry wins a name both use)."""
        version = client.get(VERSION_KEY)
        if version != self._version and time.monotonic() >= self._retry_at:
            try:
                self._entries = enabled_entries()
                self._version = version
            except Exception:  # the database is down: the settings' entries fire regardless
                log.warning(
                    "cannot read the periodic jobs in the database; firing those read "
                    "last and the settings' ones",
                    exc_info=True,
                )
                self._retry_at = time.monotonic() + RETRY_EVERY
                _close_db()
        return {**self._entries, **settings}


def _close_db() -> None:
    from django.db import connection

    try:
        connection.close()
    except Exception:  # (a broken connection)
        log.debug("closing a broken database connection failed", exc_info=True)
