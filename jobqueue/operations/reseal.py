"""Key rotation: every sealed value kept in Valkey and the database sealed again under the first
key of `ENCRYPTION_KEYS` (`manage.py jobqueue reseal`), and a count of those that still need
another key.

Owns the walk (`Resealer`, which keeps its `Report`), not the sealing (sealing.py). In Valkey it
reads job rows (`:job:<id>`: payload, result, checkpoint, progress, last error) and flows' result
slots (`:results:<id>`) key by key (SCAN), and writes a key's values back only where each is
still the one it read (reseal.lua, a compare-and-set: a job that moved on meanwhile keeps what it
has, and a row that went is never written again); in the database it reseals `Job` rows
(mirror and durable outbox rows) in chunks by id, each in a transaction with its rows locked. A
value already under the first key is left as it is, so a second run changes nothing and an
interrupted run is resumed by running it again. A value whose
key is no longer listed, or that does not open, is counted, never changed. Entries in streams
(the done stream the mirror reads, the relay's outcomes stream) are not resealed: they are read
and deleted within seconds.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .. import sealing
from ..engine.scripts import operator_calls
from ..exceptions import JobQueueError
from ..keys import shard_of

CHUNK = 500
ROW_FIELDS = ("payload", "result", "checkpoint", "progress", "last_error")
DATABASE_FIELDS = (
    ("payload", "args"),
    ("result", "result"),
    ("progress", "progress"),
    ("last_error", "error"),
)
"""A `Job` row's fields that may hold sealed values, each with the field its value is sealed for."""


@dataclass
class Report:
    resealed: int = 0
    """Values sealed again under the first key."""
    left: Counter[str] = field(default_factory=Counter)
    """Values that still need another key, by key id (their key is gone, or they do not open)."""

    @property
    def left_total(self) -> int:
        return sum(self.left.values())


def reseal(
    client: Any,
    *,
    chunk: int = CHUNK,
    database: bool = True,
    progress: Callable[[str, int], None] | None = None,
) -> Report:
    """Reseal what Valkey (and, with `database`, the database) holds; see the module's
    docstring."""
    sealing.keyring()  # (a malformed key list fails here, before anything is read)
    resealer = Resealer(client, chunk, progress)
    resealer.valkey()
    if database:
        resealer.database()
    return resealer.report


class Resealer:
    """One run of the walk: what it resealed and what it left, counted as it goes (`report`)."""

    def __init__(
        self, client: Any, chunk: int = CHUNK, progress: Callable[[str, int], None] | None = None
    ) -> None:
        self.client, self.chunk, self.progress = client, chunk, progress
        self.report = Report()

    # -- Valkey -----------------------------------------------------------------------------

    def valkey(self) -> None:
        """Job rows, then flows' result slots."""
        client = self.client
        for n, key in enumerate(client.scan_iter(match="emq:{*}:job:*", count=self.chunk), 1):
            job_id = key.rpartition(":job:")[2]
            raws = zip(ROW_FIELDS, client.hmget(key, ROW_FIELDS), strict=True)
            self._write(
                key,
                "job",
                job_id,
                [(name, raw, self._attempt(raw, _row_value, job_id, name)) for name, raw in raws if raw],
            )
            if self.progress and n % self.chunk == 0:
                self.progress("valkey", n)
        for key in client.scan_iter(match="emq:{*}:results:*", count=self.chunk):
            self._write(
                key,
                "results",
                key.rpartition(":results:")[2],
                [(slot, raw, self._attempt(raw, _slot_value)) for slot, raw in client.hgetall(key).items()],
            )

    def _write(self, key: str, row: str, job_id: str, values: list[tuple[str, str, str | None]]) -> None:
        """The values resealed of one key written back where still the ones read."""
        changed = [(name, raw, new) for name, raw, new in values if new is not None]
        if changed:
            self.report.resealed += operator_calls.reseal(self.client, shard_of(key), row, job_id, changed)

    def _attempt(self, raw: str, resealed: Callable[..., str | None], *args: str) -> str | None:
        """One stored value resealed by `resealed` (None: it needs no change); a value that
        does not open is counted under the key it names."""
        try:
            return resealed(raw, *args)
        except (JobQueueError, ValueError):
            kid = _kid(raw)
            if kid is not None:
                self.report.left[kid] += 1
            return None

    # -- the database -----------------------------------------------------------------------

    def database(self) -> None:
        """`Job` rows in chunks by id, each chunk in a transaction with its rows locked."""
        from django.db import transaction

        from ..models import Job

        last, seen = "", 0
        while True:
            with transaction.atomic():
                rows = list(
                    Job.objects.select_for_update()
                    .filter(pk__gt=last)
                    .order_by("pk")
                    .only("id", "payload", "result", "progress", "last_error")[: self.chunk]
                )
                for row in rows:
                    if changed := self._row_changes(row):
                        Job.objects.filter(pk=row.pk).update(**changed)
            if not rows:
                return
            last, seen = rows[-1].pk, seen + len(rows)
            if self.progress:
                self.progress("database", seen)

    def _row_changes(self, row: Any) -> dict[str, Any]:
        """A `Job` row's sealed fields resealed: {field: its new value} for those that changed."""
        changed: dict[str, Any] = {}
        for name, sealed_as in DATABASE_FIELDS:
            value = getattr(row, name)
            token = value.get(sealing.SEALED) if name == "payload" and isinstance(value, dict) else value
            if not isinstance(token, str) or not sealing.is_sealed(token):
                continue
            try:
                new = sealing.reseal(token, row.pk, sealed_as)
            except JobQueueError:
                self.report.left[sealing.split(token)[0]] += 1
                continue
            if new is not None:
                changed[name] = {**value, sealing.SEALED: new} if name == "payload" else new
                self.report.resealed += 1
        return changed


def _kid(raw: str) -> str | None:
    """The key id a stored value (JSON text or plain text) names, if it is sealed."""
    for part in (raw, raw.strip('"')):
        if sealing.is_sealed(part):
            return sealing.split(part)[0]
    marker = raw.find('"' + sealing.PREFIX)
    return sealing.split(raw[marker + 1 :])[0] if marker >= 0 else None


def _row_value(raw: str, job_id: str, name: str) -> str | None:
    """A job row's field resealed (JSON text; last_error is plain text)."""
    if name == "last_error":
        if not sealing.is_sealed(raw):
            return None
        return sealing.reseal(raw, job_id, "error")
    if sealing.PREFIX not in raw:
        return None
    value = json.loads(raw)
    if name == "payload":
        if not sealing.is_sealed_payload(value):
            return None
        new = sealing.reseal(value[sealing.SEALED], job_id, "args")
        given = [_given(item) for item in value.get("args", ())]  # (a flow's results spliced in)
        if new is None and given == value.get("args", []):
            return None
        resealed = {**value, sealing.SEALED: new or value[sealing.SEALED]}
        return json.dumps({**resealed, "args": given} if "args" in value else resealed, separators=(",", ":"))
    if not sealing.is_sealed(value):
        return None
    new = sealing.reseal(value, job_id, name)
    return None if new is None else json.dumps(new)


def _given(value: Any) -> Any:
    """A value a flow spliced into a sealed job's args, its sealed results resealed."""
    if sealing.is_sealed(value):
        return sealing.reseal(value, None, "result") or value
    return [_given(item) for item in value] if isinstance(value, list) else value


def _slot_value(raw: str) -> str | None:
    """A flow's result slot: a member's sealed result (opened under the id it names)."""
    if sealing.PREFIX not in raw or not raw.startswith('"'):
        return None
    new = sealing.reseal(json.loads(raw), None, "result")
    return None if new is None else json.dumps(new)
