"""Key rotation: every sealed value kept in Valkey and the database sealed again under the first
key of `ENCRYPTION_KEYS` (`manage.py jobqueue reseal`), and a count of those that still need
another key.

Owns the walk, not the sealing (sealing.py). In Valkey it reads job rows (`:job:<id>`: payload,
result, checkpoint, progress, last error) and flows' result slots (`:results:<id>`) key by key
(SCAN), and writes a value back only if it is still the one it read (a compare-and-set, one key:
a job that moved on meanwhile keeps what it has, and a row that went is never written again);
in the database it reseals `Job` rows (mirror and durable outbox rows) in chunks by id, each in
a transaction with its rows locked. A value already under the first key is left as it is, so a
second run changes nothing and an interrupted run is resumed by running it again. A value whose
key is no longer listed, or that does not open, is counted, never changed. Entries in streams
(the done stream the mirror reads, the relay's forward stream) are not resealed: they are read
and deleted within seconds.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from .. import sealing
from ..exceptions import JobQueueError

CHUNK = 500
ROW_FIELDS = ("payload", "result", "checkpoint", "progress", "last_error")
_CAS = """if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[3]) return 1 end return 0"""


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
    report = Report()
    cas = client.register_script(_CAS)
    for n, key in enumerate(client.scan_iter(match="emq:{*}:job:*", count=chunk), 1):
        job_id = key.rpartition(":job:")[2]
        for name, raw in zip(ROW_FIELDS, client.hmget(key, ROW_FIELDS), strict=True):
            new = _attempt(report, raw, _row_value, job_id, name) if raw else None
            if new is not None and cas(keys=[key], args=[name, raw, new]):
                report.resealed += 1
        if progress and n % chunk == 0:
            progress("valkey", n)
    for key in client.scan_iter(match="emq:{*}:results:*", count=chunk):
        for slot, raw in client.hgetall(key).items():
            new = _attempt(report, raw, _slot_value)
            if new is not None and cas(keys=[key], args=[slot, raw, new]):
                report.resealed += 1
    if database:
        _database(report, chunk, progress)
    return report


def _attempt(report: Report, raw: str, resealed: Callable[..., str | None], *args: str) -> str | None:
    """One stored value resealed by `resealed` (None: it needs no change); a value that does
    not open is counted under the key it names."""
    try:
        return resealed(raw, *args)
    except (JobQueueError, ValueError):
        kid = _kid(raw)
        if kid is not None:
            report.left[kid] += 1
        return None


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


def _database(report: Report, chunk: int, progress: Callable[[str, int], None] | None) -> None:
    from django.db import transaction

    from ..models import Job

    last, seen = "", 0
    while True:
        with transaction.atomic():
            rows = list(
                Job.objects.select_for_update()
                .filter(pk__gt=last)
                .order_by("pk")
                .only("id", "payload", "result", "progress", "last_error")[:chunk]
            )
            for row in rows:
                changed = [name for name, value in _row_fields(report, row) if value]
                if changed:
                    row.save(update_fields=changed)
        if not rows:
            return
        last, seen = rows[-1].pk, seen + len(rows)
        if progress:
            progress("database", seen)


def _row_fields(report: Report, row: Any) -> Iterator[tuple[str, bool]]:
    """Reseal a `Job` row's sealed fields in place; (field, whether it changed) for each."""
    for name, field_name in (
        ("payload", "args"),
        ("result", "result"),
        ("progress", "progress"),
        ("last_error", "error"),
    ):
        value = getattr(row, name)
        token = value.get(sealing.SEALED) if name == "payload" and isinstance(value, dict) else value
        if not isinstance(token, str) or not sealing.is_sealed(token):
            continue
        try:
            new = sealing.reseal(token, row.pk, field_name)
        except JobQueueError:
            report.left[sealing.split(token)[0]] += 1
            continue
        if new is not None:
            setattr(row, name, {**value, sealing.SEALED: new} if name == "payload" else new)
            report.resealed += 1
        yield name, new is not None
