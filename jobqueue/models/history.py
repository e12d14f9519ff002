"""The durable floor in the database (MySQL/MariaDB, PostgreSQL or SQLite): a mirror of finished
jobs (`Job`, and how its rows are written), and the shards of each queue (`Shard`).

A durable job's row is kept in step with the operator's retry that reopens it. outbox.py writes
a durable queue's rows and rebuilds Valkey from the unfinished ones (`jobqueue restore`); the
mirror makes them terminal as jobs finish. A retry makes a finished job unfinished again, so its
row must say so too (`reopened`), or a Valkey that loses its data loses the retried job. The
retried run's own `done` event may still wait in the stream: the row notes when that run ended,
and the mirror does not let an event of that run (or an older one) finish the reopened row again
(`stale_events`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from datetime import datetime
from functools import cache, lru_cache
from operator import itemgetter
from typing import Any

from django.db import connection, models, transaction
from django.db.models.fields.json import KT
from django.db.models.functions import Left

from ..records import BATCH_LENGTH, EncodedJSON, JobInfo, attempt_history
from ..states import State

UNFINISHED = (State.PENDING, State.SCHEDULED, State.WAITING)
"""The states of a durable row whose job is not over: `restore` sends these to Valkey again."""
HANDLER_LENGTH = 200
"""Characters of a handler's name that `Job.handler` keeps (an index on more would pass MySQL's
limit of 3,072 bytes a key); the console searches no longer text."""


class CaseSensitiveCharField(models.CharField):
    """A CharField compared byte for byte on MySQL too, whatever the table's default collation:
    branded ids are base62, so `JOB…a` and `JOB…A` are different jobs."""

    def db_parameters(self, connection: Any) -> dict[str, Any]:
        params = super().db_parameters(connection)
        if connection.vendor == "mysql":
            params["collation"] = "ascii_bin"
        return params

    def get_prep_value(self, value: Any) -> Any:
        """MySQL refuses to compare an ascii_bin column with text outside ASCII ("illegal mix
        of collations"). No id holds such text, so a lookup by it (typed into the admin's search,
        a URL, a bulk action) asks for `?` in its place, which no id holds either."""
        value = super().get_prep_value(value)
        if isinstance(value, str) and not value.isascii():
            return value.encode("ascii", "replace").decode("ascii")
        return value


class Job(models.Model):
    """One finished job, mirrored from its `done` event (idempotent upsert keyed by id)."""

    id = CaseSensitiveCharField(primary_key=True, max_length=14)
    queue = models.CharField(max_length=64)
    shard = models.PositiveSmallIntegerField(default=0)
    lane = models.CharField(max_length=128, blank=True, default="")
    state = models.CharField(max_length=16, choices=State.choices)
    priority = models.SmallIntegerField(default=0)
    attempts = models.PositiveIntegerField(default=0)
    max_attempts = models.PositiveIntegerField(default=0)
    payload = models.JSONField(null=True, blank=True)
    result = models.JSONField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    unique_key = models.CharField(max_length=200, blank=True, default="")
    worker = models.CharField(max_length=200, blank=True, default="")
    enqueued_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    """When its last run started (a cancelled waiting job has none)."""
    finished_at = models.DateTimeField(null=True, blank=True)
    changed_at = models.DateTimeField(null=True, blank=True, editable=False)
    """When Valkey recorded the event the row shows (on its clock): the job's finish, or its
    coming back to wait (a dependent a member's failure had cancelled, revived by a retry of
    that member). The mirror moves a row only to a newer event (`_insert_sql`); None on a row
    no event wrote (a durable row written at enqueue)."""
    mirrored_at = models.DateTimeField(auto_now=True)
    # A durable queue's job is written here when it is enqueued (the outbox: see outbox.py),
    # with what it takes to create it again in Valkey; the mirror later makes the row terminal.
    durable = models.BooleanField(default=False)
    relayed = models.BooleanField(default=True)
    """Whether the row's job reached Valkey (a push or a resend confirmed it): False from a
    durable enqueue until then. The name is older than the word "resend"; renaming a column of
    this table would need a migration."""
    run_after = models.DateTimeField(null=True, blank=True)
    backoff_ms = models.PositiveIntegerField(null=True, blank=True)
    lease_ms = models.PositiveIntegerField(null=True, blank=True)
    timeout_ms = models.PositiveIntegerField(null=True, blank=True)
    """A durable job's run time limit (its `timeout`; None: none), for a resend or a restore."""
    expires_at = models.DateTimeField(null=True, blank=True)
    """When a durable job ends `expired` unless it started by then (None: never); a resend or a
    restore that finds the row past it marks it expired instead of sending it."""
    reopened_after = models.DateTimeField(null=True, blank=True)
    """When the run an operator's retry reopened this durable row after had ended (its
    `finished_at`, on Valkey's clock): the mirror lets no event of that run finish the row again
    (`stale_events`)."""
    history = models.JSONField(null=True, blank=True)
    """Earlier attempts that failed (the last ten), as the job's row had them when it finished."""
    progress = models.JSONField(null=True, blank=True)
    """The last value its handler gave `ctx.progress`."""
    flow = models.JSONField(null=True, blank=True)
    """A durable flow's job: its place in the flow, to write it again (outbox.py): `flow` (the
    flow's id, '' for `depends_on` alone), `position`, `members` ([id, slot, policy] each),
    `takes` and `slots` (what their outcomes become). None for any other job."""
    batch = models.CharField(max_length=BATCH_LENGTH, null=True, blank=True)
    """Its last run's batch, when a batch handler ran it with others: '<n> <first job's id>'
    (None: it ran alone)."""
    handler = models.GeneratedField(
        expression=Left(KT("payload__handler"), HANDLER_LENGTH),
        output_field=models.CharField(max_length=HANDLER_LENGTH, null=True), db_persist=True)
    """Its payload's handler (the first HANDLER_LENGTH characters), written by the database
    itself: an indexed column the console's search finds a handler's jobs by."""

    class Meta:
        ordering = ["-finished_at"]
        indexes = [
            models.Index(fields=["queue", "state", "finished_at"], name="jq_job_queue_state"),
            models.Index(fields=["state", "finished_at"], name="jq_job_state_finished"),
            models.Index(fields=["finished_at"], name="jq_job_finished"),
            models.Index(fields=["lane", "finished_at"], name="jq_job_lane"),
            models.Index(fields=["relayed", "enqueued_at"], name="jq_job_relay"),
            models.Index(fields=["durable", "state"], name="jq_job_durable"),
            models.Index(fields=["unique_key", "finished_at"], name="jq_job_unique_key"),
            models.Index(fields=["handler", "finished_at"], name="jq_job_handler"),
        ]
        permissions = [
            ("retry_job", "Can retry jobs"),
            ("reprioritize_job", "Can reprioritize jobs"),
            ("cancel_job", "Can cancel jobs"),
            ("pause_queue", "Can pause and resume queues"),
            ("run_schedule", "Can run, pause and resume periodic jobs"),
            ("resize_queue", "Can change a queue's live shard count"),
            ("set_lane_concurrency", "Can change a lane's concurrency cap"),
            ("set_global_concurrency", "Can change a queue's global concurrency cap"),
            ("view_sealed", "Can read sealed job data (arguments, results, errors)"),
            ("delete_history", "Can delete finished jobs from the history"),
            ("view_hidden_args", "Can see hidden job arguments"),
            ("enqueue_job", "Can enqueue jobs from the console"),
        ]

    def __str__(self) -> str:
        return f"{self.id} ({self.queue}, {self.state})"

    def info(self) -> JobInfo:
        """This row as the JobInfo `get_job` answers once the Valkey row has expired."""
        return JobInfo(
            id=self.id, queue=self.queue, state=self.state, attempts=self.attempts,
            priority=self.priority, lane=self.lane or None, payload=self.payload,
            result=self.result, last_error=self.last_error, max_attempts=self.max_attempts,
            unique_key=self.unique_key or None, worker=self.worker, shard=self.shard,
            enqueued_at=self.enqueued_at, started_at=self.started_at,
            finished_at=self.finished_at, history=attempt_history(self.history),
            progress=self.progress, batch=self.batch, source="mirror",
        )


class Shard(models.Model):
    """One Valkey partition of a queue: active, or draining before it is retired."""

    class Status(models.TextChoices):
        ACTIVE = "active", "Active"
        """Takes new jobs and is claimed from."""
        DRAINING = "draining", "Draining"
        """Beyond the live shard count: claimed from until empty, takes no new jobs."""
        RETIRED = "retired", "Retired"
        """Drained after a shrink: takes no new jobs and is not claimed from."""

    queue = models.CharField(max_length=64)
    index = models.PositiveSmallIntegerField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.ACTIVE)
    pending = models.PositiveIntegerField(default=0)
    scheduled = models.PositiveIntegerField(default=0)
    active = models.PositiveIntegerField(default=0)
    dead = models.PositiveIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["queue", "index"], name="jq_shard_unique")]
        ordering = ["queue", "index"]

    def __str__(self) -> str:
        return f"{self.queue}#{self.index}"


def insert_jobs(rows: Iterable[dict[str, Any]], update: Collection[str] = ()) -> int:
    """Write `Job` rows (dicts with every column) as one multi-row INSERT; rows whose id exists
    get the `update` columns overwritten, only by a row that is not older (none: the INSERT
    fails on a duplicate id; see `_insert_sql`). Raw SQL
    because the ORM's bulk_create spends several times the database's own time compiling the
    statement. The values are the columns' own types (str, int, bool, aware datetime, JSON
    data or EncodedJSON); only datetimes and JSON need adapting, and a batch's datetimes repeat."""
    db = transaction.get_connection()  # the wrapper itself: the proxy costs a lookup per use
    adapt_datetime = lru_cache(maxsize=256)(db.ops.adapt_datetimefield_value)

    def adapt_json(value: Any) -> Any:
        return value if isinstance(value, EncodedJSON) else db.ops.adapt_json_value(value, None)

    adapters: dict[type, Callable[[Any], Any]] = {models.DateTimeField: adapt_datetime,
                                                  models.JSONField: adapt_json}
    if db.vendor == "postgresql":  # it stores no NUL character, in text or in jsonb
        adapters.update({models.CharField: _text_without_nul, models.TextField: _text_without_nul,
                         models.JSONField: _json_without_nul})
    fields = written_fields()
    take = itemgetter(*(f.attname for f in fields))
    adapted = [(i, adapt) for i, f in enumerate(fields) if (adapt := adapters.get(type(f)))]
    values = []
    for row in rows:
        value = list(take(row))
        for i, adapt in adapted:
            if value[i] is not None:  # (None is NULL whatever the column)
                value[i] = adapt(value[i])
        values.append(value)
    head, tail = _insert_sql(db.vendor, tuple(sorted(update)))
    if db.vendor == "mysql" and _quotes_values(db):
        _execute_mysql(db, head, tail, values)
    elif len(values) == 1:  # one statement is atomic by itself: no BEGIN/COMMIT round trips
        with db.cursor() as cursor:
            cursor.execute(head + _placeholders() + tail, values[0])
    elif values:  # the driver may split a long batch into several statements
        with transaction.atomic(savepoint=False), db.cursor() as cursor:
            cursor.executemany(head + _placeholders() + tail, values)
    return len(values)


STATEMENT_BYTES = 512 * 1024
"""The longest multi-row INSERT sent to MySQL (more rows go in more statements, in one
transaction): below every server's default `max_allowed_packet`."""


def _quotes_values(db: Any) -> bool:
    """Whether a MySQL connection's driver quotes values itself (mysqlclient's `string_literal`;
    not PyMySQL's, installed as MySQLdb): `_execute_mysql` then builds the statements."""
    db.ensure_connection()
    return hasattr(db.connection, "string_literal")


def _execute_mysql(db: Any, head: str, tail: str, values: list[list[Any]]) -> None:
    """The rows as few INSERT statements as fit STATEMENT_BYTES, each value quoted by the
    driver's own `string_literal` (what its `executemany` calls too, through a Python function
    per value that costs more than the quoting). A batch in one statement needs no transaction."""
    if not values:
        return
    with db.cursor() as cursor:
        raw = db.connection  # (mysqlclient's connection)
        quote, encoding, literal = raw.string_literal, raw.encoding, raw.literal
        rows = [b"(" + b",".join([
            quote(v.encode(encoding)) if isinstance(v, str) else b"NULL" if v is None
            else b"%d" % v if type(v) is int or type(v) is bool else literal(v) for v in row
        ]) + b")" for row in values]
        statements, start, size = [], 0, 0
        for end, row in enumerate(rows):
            if size and size + len(row) > STATEMENT_BYTES:
                statements.append(rows[start:end])
                start, size = end, 0
            size += len(row) + 1
        statements.append(rows[start:])
        with transaction.atomic(savepoint=False) if len(statements) > 1 else nullcontext():
            for chunk in statements:  # (as text, no parameters: what SQL wrappers expect)
                cursor.execute(head + b",".join(chunk).decode(encoding) + tail)


def _text_without_nul(value: Any) -> Any:
    """Text PostgreSQL accepts: a NUL character (which MySQL and SQLite keep) becomes U+FFFD, so
    that a handler's error holding one cannot fail its batch, and the mirror, for ever."""
    return value.replace("\x00", "\ufffd") if isinstance(value, str) else value


def _json_without_nul(value: Any) -> Any:
    """JSON text PostgreSQL's jsonb accepts: a `\\u0000` in any string becomes U+FFFD."""
    if value is None:
        return None
    text = value if isinstance(value, EncodedJSON) else json.dumps(value)
    if "\\u0000" not in text:
        return text
    return json.dumps(_strings_without_nul(json.loads(text)))


def _strings_without_nul(value: Any) -> Any:
    if isinstance(value, str):
        return _text_without_nul(value)
    if isinstance(value, list):
        return [_strings_without_nul(item) for item in value]
    if isinstance(value, dict):
        return {_text_without_nul(key): _strings_without_nul(item) for key, item in value.items()}
    return value


def written_fields() -> list[Any]:
    """The `Job` columns a row is written with: every one but those the database computes."""
    return [f for f in Job._meta.concrete_fields if not f.generated]


def _placeholders() -> str:
    return f"({', '.join(['%s'] * len(written_fields()))})"


@cache
def _insert_sql(vendor: str, update: tuple[str, ...]) -> tuple[str, str]:
    """The INSERT of `Job` rows before its VALUES' rows and after them (the upsert's clause
    overwriting the `update` columns). A row only moves forward: an existing one is overwritten
    when no event wrote it (a durable row, written at enqueue or reopened by a retry), or by a
    new one with more `attempts` (the fencing token, which never goes back), or as many and a
    `changed_at` no earlier (Valkey's clock, the job's own shard's: a finish, or a dependent's
    coming back to wait); so an event that waited (a batch that failed and was written again, a
    dead consumer's entries taken over) cannot overwrite what a later run wrote meanwhile."""
    quote = connection.ops.quote_name
    table = quote(Job._meta.db_table)
    columns = [quote(str(f.column)) for f in written_fields()]
    head = f"INSERT INTO {table} ({', '.join(columns)}) VALUES "
    if not update:
        return head, ""
    attempts, finished = quote("attempts"), quote("changed_at")
    # (MySQL's assignments see the values set before them: the columns the test reads come last,
    # changed_at before attempts, so each is tested against the row as it was)
    last = {finished: 1, attempts: 2}
    changed = sorted((quote(name) for name in update), key=lambda c: last.get(c, 0))
    if vendor == "mysql":
        newer = (f"{finished} IS NULL OR VALUES({attempts}) > {attempts} OR "
                 f"(VALUES({attempts}) = {attempts} AND VALUES({finished}) >= {finished})")
        return head, " ON DUPLICATE KEY UPDATE " + ", ".join(
            f"{c} = IF({newer}, VALUES({c}), {c})" for c in changed)
    newer = (f"{table}.{finished} IS NULL OR excluded.{attempts} > {table}.{attempts} OR "
             f"(excluded.{attempts} = {table}.{attempts} AND "
             f"excluded.{finished} >= {table}.{finished})")
    return head, f" ON CONFLICT ({quote('id')}) DO UPDATE SET " + ", ".join(
        f"{c} = excluded.{c}" for c in changed) + f" WHERE {newer}"


# -- a durable row reopened by a retry -------------------------------------------------------


@contextmanager
def reopened(job_id: str, after: datetime | None) -> Iterator[None]:
    """Run a retry's Valkey transition inside a transaction that first moves the job's durable
    row (if it has one) back to pending: a retry Valkey refuses leaves the row as it was, and
    the row's lock holds back a worker's mirror write of the retried run until the commit.
    `after`: when the retried run ended, on Valkey's clock (its `finished_at`); the expiry goes,
    as retry.lua drops it."""
    with transaction.atomic():
        Job.objects.filter(pk=job_id, durable=True).update(
            state=State.PENDING, finished_at=None, relayed=True, expires_at=None,
            reopened_after=after)
        yield


def counted_rows(rows: Iterable[Mapping[str, Any]]) -> frozenset[str]:
    """The ids among a replayed mirror batch (`Job` columns each) whose history row already
    holds that very finish (its state, attempts and finish time): the batch was written before,
    and its jobs counted in the charts' rollup then."""
    wanted = {row["id"]: (row["state"], row["attempts"], row["finished_at"]) for row in rows}
    held = Job.objects.filter(pk__in=list(wanted)).values_list(
        "pk", "state", "attempts", "finished_at")
    return frozenset(pk for pk, *now in held if tuple(now) == wanted[pk])


def stale_events(rows: Mapping[str, Mapping[str, Any]]) -> set[str]:
    """The ids among a mirror batch (`Job` columns by id) whose event belongs to a run an
    operator retried since: the durable row is unfinished again and the event ended no later
    than that run. Both times are Valkey's, so no clock skew can misorder them; a replayed event
    is judged the same way each time. Locks the rows it reads: call it in the transaction that
    writes the batch, so a retry committing meanwhile waits for it."""
    reopened = Job.objects.select_for_update().filter(
        pk__in=list(rows), durable=True, state__in=UNFINISHED, reopened_after__isnull=False,
    ).values_list("pk", "reopened_after")
    return {pk for pk, after in reopened
            if (ended := rows[pk]["finished_at"]) is None or ended <= after}
