"""The one row codec: what the store, the mirror and the console read back from Valkey.

Any field of any row may be corrupt (hand-edited, written by an old version, bit-rotted). The
client decodes replies with `surrogateescape`, so bytes that are not UTF-8 reach Python as lone
surrogates instead of raising; this module turns them into readable text (U+FFFD) and says which
field was bad, so a corrupt row is shown, mirrored and buried — never a crash.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NamedTuple

from . import ids
from .states import State

COUNT_FIELDS: tuple[str, ...] = (State.PENDING, State.SCHEDULED, State.ACTIVE, State.DEAD,
                                 State.SUCCEEDED, State.CANCELLED, State.EXPIRED, State.WAITING)
"""The states `Queue.counts()` reports."""
COUNTS_REPLY: tuple[str, ...] = (*COUNT_FIELDS[:7], "paused", "lanes", State.WAITING)
"""What the counts script answers, in its order."""


def text(raw: str) -> tuple[str, bool]:
    """`raw` as printable text, and whether it held bytes that are not UTF-8."""
    if raw.isascii():
        return raw, False
    try:
        raw.encode()
    except UnicodeEncodeError:
        return raw.encode("utf-8", "surrogateescape").decode("utf-8", "replace"), True
    return raw, False


_scan = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def json_field(raw: str | None, field: str) -> tuple[Any, str | None]:
    """Decode a stored JSON field: (value, None), or (the text as found, a problem naming it)."""
    if raw is None or raw == "":
        return None, None
    clean, corrupt = text(raw)
    if corrupt:
        return clean, f"corrupt field {field}: not valid UTF-8"
    try:  # json.loads' own C scanner, without its three Python frames (a job's payload is
        value, end = _scan(raw, 0)  # decoded before its handler starts)
        if end == len(raw):
            return value, None
    except (StopIteration, ValueError):
        pass
    except RecursionError:  # (arrays or objects nested deeper than Python's stack allows)
        return raw, f"corrupt field {field}: stored JSON nests too deep to read"
    try:  # (anything else, e.g. JSON with spaces around it, goes the usual way)
        return json.loads(raw), None
    except ValueError as exc:
        return raw, f"corrupt field {field}: stored JSON is corrupt ({exc})"
    except RecursionError:
        return raw, f"corrupt field {field}: stored JSON nests too deep to read"


def int_field(raw: str | None) -> int | None:
    """An integer field (Lua may have written it as a float); None when absent or corrupt."""
    if not raw:
        return None
    try:
        return int(float(raw))
    except (ValueError, OverflowError):
        return None


def enqueued_ms(job_id: str, raw: str | None) -> str | None:
    """A row's enqueue time: its own field, else (a minted id: the row leaves it out) the id's
    mint time."""
    if raw:
        return raw
    minted = ids.minted_ms(job_id)
    return None if minted is None else str(minted)


def ms_to_dt(raw: str | None) -> datetime | None:
    ms = int_field(raw)
    if not ms or ms <= 0:
        return None
    try:
        return datetime.fromtimestamp(ms / 1000, UTC)
    except (ValueError, OverflowError, OSError):
        return None


class Lease(NamedTuple):
    """A claimed job: whoever holds it may ack, nack, extend or checkpoint it with `token`. A
    named tuple: the worker makes one per claimed job, and a frozen dataclass costs 3× as much."""

    job_id: str
    token: int
    payload: Any
    checkpoint: Any
    lease: float
    queue: str
    shard: int
    problem: str | None = None
    """Why the row cannot run (a corrupt payload or checkpoint); the worker buries such a job."""
    timeout: float = 0.0
    """The run's time limit in seconds (0: none): the job's or its queue's `timeout`."""
    deadline: float = 0.0
    """When the run must end (`time.monotonic()` as the run started, plus `timeout`: `started`;
    0: not started yet, or no limit). The limit counts from the run's start, not from the
    claim: a prefetched job's wait costs it nothing. The heartbeat tells the server the time
    left (extend.lua), which writes its own deadline and ends the lease a second past it, the
    worker's margin to record the timeout itself."""

    def started(self) -> Lease:
        """This lease as its run starts now: its deadline counted from now (none without a
        time limit)."""
        return self._replace(deadline=time.monotonic() + self.timeout) if self.timeout else self

    @classmethod
    def from_claim(cls, queue: str, shard: int, job_id: str, token: str, raw_payload: str,
                   raw_checkpoint: str, lease_ms: str | int) -> Lease:
        payload, problem = json_field(raw_payload, "payload")
        if raw_payload == "":
            problem = "corrupt field payload: the row has none"
        checkpoint, checkpoint_problem = json_field(raw_checkpoint, "checkpoint")
        problem = problem or checkpoint_problem
        if problem:  # the job will be buried, not run: hand nothing half-decoded to a handler
            payload = checkpoint = None
        try:
            lease = int(lease_ms) / 1000
        except ValueError:  # '<lease ms>:<timeout ms>': a run with a time limit (claim.lua)
            lease_part, _, limit = str(lease_ms).partition(":")
            return cls(job_id, int(token), payload, checkpoint, int(lease_part) / 1000, queue,
                       shard, problem, int(limit) / 1000)
        return cls(job_id, int(token), payload, checkpoint, lease, queue, shard, problem)


@dataclass(frozen=True)
class JobInfo:
    """A snapshot of one job, live from Valkey or from its mirror row."""

    id: str
    queue: str
    state: str
    attempts: int = 0
    priority: int = 0
    lane: str | None = None
    payload: Any = None
    result: Any = None
    last_error: str = ""
    checkpoint: Any = None
    max_attempts: int = 0
    unique_key: str | None = None
    worker: str = ""
    shard: int = 0
    enqueued_at: datetime | None = None
    run_after: datetime | None = None
    started_at: datetime | None = None
    lease_until: datetime | None = None
    finished_at: datetime | None = None
    expires_at: datetime | None = None
    """When it expires unless started by then (None: never)."""
    cancel_requested: bool = False
    timeout: float | None = None
    """Seconds one run may take (its `timeout`; None: no limit)."""
    history: tuple[Any, ...] = ()
    """Earlier attempts that failed (the last ten): attempt, worker, started, ended (ms), error."""
    progress: Any = None
    """The last value its handler gave `ctx.progress` (kept after the job ends)."""
    flow: str | None = None
    """The flow it belongs to (a chain, group or chord: `jobqueue.flows`), if any."""
    batch: str | None = None
    """Its last run's batch, when a batch handler ran it with others: '<n> <first job's id>'."""
    source: str = "valkey"
    corrupt: tuple[str, ...] = ()
    """Fields of the row that could not be read (shown as found, bad bytes replaced)."""

    @property
    def batch_of(self) -> tuple[int, str] | None:
        """(how many jobs its last run's batch held, the first one's id), if it ran in one."""
        size, _, first = (self.batch or "").partition(" ")
        return (int(size), first) if size.isdecimal() and first else None

    @property
    def sealed(self) -> bool:
        """Whether its data is sealed (sealing.py): its payload says so."""
        return isinstance(self.payload, dict) and "sealed" in self.payload

    @classmethod
    def from_row(cls, job_id: str, queue: str, row: Mapping[str, str], shard: int = 0,
                 max_attempts: int = 0) -> JobInfo:
        """Decode a Valkey job row; never raises, whatever the row holds. A row holds only what
        differs from a default: `max_attempts` is the queue's when it holds none, `run_after`
        its enqueue time."""
        fields = RowFields(row)
        return cls(
            id=job_id, queue=queue, state=fields.text("state") or State.DEAD,
            attempts=fields.int("attempts"), priority=fields.int("priority"),
            lane=fields.text("lane") or None, payload=fields.json("payload"),
            result=fields.json("result"), last_error=fields.text("last_error"),
            checkpoint=fields.json("checkpoint"),
            max_attempts=fields.int("max_attempts") or max_attempts,
            unique_key=fields.text("unique_key") or None, worker=fields.text("worker"),
            shard=shard, enqueued_at=(enqueued := fields.time("enqueued_at", job_id)),
            run_after=fields.time("run_after") or enqueued, started_at=fields.time("started_at"),
            lease_until=fields.time("lease_until"), finished_at=fields.time("finished_at"),
            expires_at=fields.time("expires_at"), cancel_requested=row.get("cancel") == "1",
            timeout=run_timeout(row.get("lease_ms")),
            history=attempt_history(fields.json("history")),
            progress=fields.json("progress"), flow=fields.text("flow") or None,
            batch=fields.text("batch") or None, corrupt=tuple(fields.corrupt),
        )


def run_timeout(lease_ms: str | None) -> float | None:
    """A row's run time limit in seconds, from its `lease_ms` ('<lease>:<timeout>'), or None."""
    limit = (lease_ms or "").partition(":")[2]
    return int(limit) / 1000 if limit.isdecimal() and int(limit) > 0 else None


def attempt_history(value: Any) -> tuple[Any, ...]:
    """The attempts a `history` field lists, with times as datetimes; () when it is not a list."""
    if not isinstance(value, list):
        return ()
    return tuple({**item, "started": ms_to_dt(str(item.get("started") or "")),
                  "ended": ms_to_dt(str(item.get("ended") or ""))}
                 for item in value if isinstance(item, dict))


class EncodedJSON(str):
    """JSON text already encoded (a payload as enqueued): written to a JSON column as it is."""


class RowFields:
    """Reads the fields of one row or event, noting each that is corrupt."""

    def __init__(self, row: Mapping[str, str]) -> None:
        self.row = row
        self.corrupt: list[str] = []

    def text(self, name: str) -> str:
        clean, bad = text(self.row.get(name) or "")
        if bad:
            self.corrupt.append(name)
        return clean

    def int(self, name: str) -> int:
        raw = self.row.get(name)
        value = int_field(raw)
        if value is None and raw:
            self.corrupt.append(name)
        return value or 0

    def time(self, name: str, job_id: str | None = None) -> datetime | None:
        """A timestamp field; `enqueued_at` falls back to the mint time of `job_id`."""
        raw = self.row.get(name)
        if job_id is not None:
            raw = enqueued_ms(job_id, raw)
        value = ms_to_dt(raw)
        if value is None and raw and raw != "0":
            self.corrupt.append(name)
        return value

    def json(self, name: str) -> Any:
        value, problem = json_field(self.row.get(name), name)
        if problem:
            self.corrupt.append(name)
        return value

    def encoded_json(self, name: str) -> Any:
        """A JSON field for a JSON column: its text as stored when it is valid (a database
        takes it without its being decoded and encoded again), else what `json` reads."""
        raw = self.row.get(name)
        value, problem = json_field(raw, name)
        if problem:
            self.corrupt.append(name)
            return value
        return None if value is None else EncodedJSON(raw)


INT_MAX = 2**31 - 1
BATCH_LENGTH = 32
"""The longest batch note kept in the history ('<n> <first job's id>' is at most 19)."""


def _clamp(value: int, low: int, high: int) -> int:
    return max(low, min(value, high))


def mirror_columns(event: Mapping[str, str], queue: str, shard: int,
                   max_attempts: int) -> dict[str, Any]:
    """The `Job` columns a terminal event describes, with the queue and shard of the stream it
    came from (rows do not repeat them) and the queue's max_attempts for a row that kept the
    default."""
    fields = RowFields(event)
    columns = {
        "id": event["id"], "queue": queue, "shard": shard,
        "lane": fields.text("lane")[:128],
        "state": fields.text("state")[:16], "priority": _clamp(fields.int("priority"), -100, 100),
        "attempts": _clamp(fields.int("attempts"), 0, INT_MAX),
        "max_attempts": _clamp(fields.int("max_attempts") or max_attempts, 0, INT_MAX),
        "payload": fields.encoded_json("payload"), "result": fields.encoded_json("result"),
        "last_error": fields.text("last_error"), "unique_key": fields.text("unique_key")[:200],
        "worker": fields.text("worker")[:200],
        "enqueued_at": fields.time("enqueued_at", str(event["id"])),
        "started_at": fields.time("started_at"), "finished_at": fields.time("finished_at"),
        "changed_at": fields.time("finished_at") or fields.time("revived_at"),
        "history": fields.encoded_json("history"), "progress": fields.encoded_json("progress"),
        "batch": fields.text("batch")[:BATCH_LENGTH] or None,
    }
    if fields.corrupt:
        note = f"corrupt field(s) in the row: {', '.join(fields.corrupt)}"
        columns["last_error"] = f"{columns['last_error']}\n{note}".strip()
    return columns
