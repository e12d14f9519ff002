"""Bulk operations: an operator's retry, cancel or delete of every job a search matches, run in
chunks by a `Runner` outside the request that confirmed it (a thread the console starts, or
`manage.py jobqueue bulk`), from a `BulkOperation` row.

`Bulk` is what an operation does on which jobs: the search's live or history jobs, in the
states its action applies to. `start` records one to count (or finds the same one under way), a
runner counts it, the operator confirms the count (`confirm`: its one LogEntry, however often it
is clicked) or drops it. A `Runner` takes an operation whose lease is free, saves each chunk before
it acts on it (`inflight`) and the cursor and counts after, renewing its lease each time: a
runner that dies is resumed from where it stood by the next, which acts on the chunk left in
flight again. Each job's transition carries a call id of the operation's (`Queue.retry`), so a
transition made again within a minute answers as the first one did.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import IntegrityError, close_old_connections, connection, transaction
from django.db.models import F, Q

from ..engine.store import Queue
from ..exceptions import InvalidOption, JobQueueError
from ..flows import relay
from ..models import BulkOperation, Job
from ..states import State
from . import actions, search
from .query import Query

log = logging.getLogger("jobqueue.console")
CHUNK = 500
"""Jobs a runner acts on between two saves of its cursor."""
LEASE = 10.0
"""Seconds a runner holds an operation past its last save: a runner silent longer is taken for
dead and another resumes the operation."""
FINISHED = frozenset({State.SUCCEEDED, State.DEAD, State.CANCELLED, State.EXPIRED})
VERBS = {"retry": "Retry", "cancel": "Cancel", "delete": "Delete"}
UNDER_WAY = (BulkOperation.Status.COUNTING, BulkOperation.Status.RUNNING)
"""The states in which a runner has work on an operation."""
type Place = tuple[str, str, int | None]
"""A job a bulk operation acts on: its queue, its id, its shard (None: unknown, a history row)."""


@dataclass(frozen=True)
class Bulk:
    """An action on every job a query matches: where ("live" or "history") is the query's."""

    action: str
    query: Query
    scope: frozenset[str] | None
    """The queues the operator may act on (None: every queue)."""

    STATES = {
        ("live", "retry"): actions.JOB_STATES["retry"],
        ("live", "cancel"): actions.JOB_STATES["cancel"],
        ("history", "retry"): actions.JOB_STATES["retry"],
        ("history", "delete"): FINISHED,
    }
    """The states each action applies to, live or in the history."""

    @classmethod
    def of(cls, action: str, query: Query, scope: frozenset[str] | None) -> Bulk:
        """InvalidOption when the action does not apply there, or to the query's state."""
        states = cls.STATES.get((query.where, action))
        if states is None:
            offered = [a for where, a in cls.STATES if where == query.where]
            raise InvalidOption(
                f"{action!r} does not apply to {query.where} jobs: {' or '.join(offered)} does"
            )
        if query.state and query.state not in states:
            raise InvalidOption(
                f"{action} applies to {', '.join(sorted(states))} jobs, not to {query.state} ones"
            )
        return cls(action, query, scope)

    @property
    def states(self) -> frozenset[str]:
        return self.STATES[(self.query.where, self.action)]

    @property
    def state_names(self) -> str:
        return ", ".join(sorted(self.states))

    def rows(self) -> Any:
        return search.history(self.query, self.scope).filter(state__in=sorted(self.states))

    def count(self) -> int:
        """How many jobs it would act on now (a live count reads every live job of the
        queues in scope, SCAN_CHUNK at a time)."""
        return sum(found for found, _ in self.counted(""))

    def counted(self, cursor: str) -> Iterator[tuple[int, str]]:
        """How many jobs it would act on, from `cursor` on, a step at a time (the history's in
        one), each with the cursor after it."""
        if self.query.where == "history":
            yield self.rows().order_by().count(), ""
            return
        for jobs, after in search.every_live(self.query, self.scope, self.states, cursor):
            yield len(jobs), after

    def chunks(self, cursor: str, size: int) -> Iterator[tuple[list[Place], str]]:
        """The matching jobs from `cursor` on, about `size` at a time ([queue, id, shard] each;
        a history row's shard is None: it may be in Valkey or not), each with the cursor after
        them."""
        if self.query.where == "live":
            for jobs, after in search.every_live(self.query, self.scope, self.states, cursor, size):
                yield [(job.queue, job.id, job.shard) for job in jobs], after
            return
        while True:
            rows = self.rows().order_by("pk")
            if cursor:
                rows = rows.filter(pk__gt=cursor)
            found: list[Place] = [(queue, pk, None) for pk, queue in rows.values_list("pk", "queue")[:size]]
            if not found:
                return
            cursor = found[-1][1]
            yield found, cursor

    def act(self, jobs: list[Place], call: str) -> tuple[int, int]:
        """Do it to each job: (done, skipped: the job had moved on). `call` prefixes each
        transition's call id. Live jobs of a queue that is not durable go a shard's worth in
        one round trip; others one at a time."""
        if self.action == "delete":
            ids = [job_id for _, job_id, _ in jobs]
            Job.objects.filter(pk__in=ids, state__in=sorted(self.states)).delete()
            return len(ids), 0
        answers: list[Any] = []
        grouped: dict[tuple[str, int], list[tuple[str, str]]] = defaultdict(list)
        for name, job_id, shard in jobs:
            queue = Queue(name)
            if shard is None or (self.action == "retry" and queue.options.durable):
                answers.append(self._one(queue, job_id, f"{call}:{job_id}"))
            else:
                grouped[name, shard].append((job_id, f"{call}:{job_id}"))
        for (name, shard), calls in grouped.items():
            queue = Queue(name)
            many = queue.retry_many if self.action == "retry" else queue.cancel_many
            answers += many(shard, calls)
            if self.action == "cancel":  # (what the cancels forwarded: applied now, actions.cancel)
                relay.relay_shard(queue, shard)
        skipped = sum(isinstance(answer, JobQueueError) for answer in answers)
        return len(answers) - skipped, skipped

    def _one(self, queue: Queue, job_id: str, call: str) -> Any:
        """One job's transition: its state after, or its refusal (not raised)."""
        try:
            if self.action == "retry":
                return actions.retry_job(queue, job_id, call)
            return actions.cancel(queue, job_id, call)
        except JobQueueError as exc:  # (moved on since it matched: not pending any more, gone, …)
            return exc

    def key(self) -> str:
        """What makes two operations the same: action, query, scope."""
        text = json.dumps(
            [
                self.action,
                dict(sorted(self.query.raw.items())),
                sorted(self.scope) if self.scope is not None else None,
            ]
        )
        return hashlib.sha256(text.encode()).hexdigest()

    def describe(self, count: int) -> str:
        return f"{VERBS[self.action]} {count} {self.query.where} job(s) matching {self.query.describe()}"

    def start(self, user: Any) -> BulkOperation:
        """Record the operation, to be counted (a runner counts it) and then confirmed; the same
        one already under way is counted again instead (what it matches may have changed)."""
        try:
            with transaction.atomic():
                return BulkOperation.objects.create(
                    action=self.action,
                    query=dict(self.query.raw),
                    running_key=self.key(),
                    scope=sorted(self.scope) if self.scope is not None else None,
                    status=BulkOperation.Status.COUNTING,
                    created_by=str(user)[:150],
                )
        except IntegrityError:
            same = BulkOperation.objects.filter(running_key=self.key())
            same.filter(status=BulkOperation.Status.COUNTED).update(
                status=BulkOperation.Status.COUNTING, total=0, cursor="", lease_until=None
            )
            found = same.first()
            return found if found is not None else self.start(user)  # (it ended meanwhile)

    @staticmethod
    def confirm(operation: BulkOperation, user: Any) -> bool:
        """The operator's confirmation of a counted operation: it runs, and its LogEntry (the
        filter and the count) is written, once however often it is confirmed (False then)."""
        with transaction.atomic():
            if not BulkOperation.objects.filter(pk=operation.pk, status=BulkOperation.Status.COUNTED).update(
                status=BulkOperation.Status.RUNNING, lease_until=None, cursor="", runner=""
            ):
                return False
            described = Bulk.of_record(operation).describe(operation.total)
            actions.log_action(user, operation, f"{described} (bulk operation #{operation.pk}).")
        return True

    @staticmethod
    def drop(operation: BulkOperation) -> bool:
        """The operator's "no": a counted (or counting) operation ends without running."""
        return bool(
            BulkOperation.objects.filter(
                pk=operation.pk, status__in=(BulkOperation.Status.COUNTED, BulkOperation.Status.COUNTING)
            ).update(
                status=BulkOperation.Status.DROPPED,
                running_key=None,
                lease_until=None,
                finished_at=datetime.now(UTC),
            )
        )

    @classmethod
    def of_record(cls, operation: BulkOperation) -> Bulk:
        scope = frozenset(operation.scope) if operation.scope is not None else None
        return cls(operation.action, Query.parse(operation.query), scope)


class Runner:
    """Runs bulk operations, one chunk at a time, each under this runner's lease."""

    def __init__(self, name: str = "", chunk: int = CHUNK) -> None:
        self.name = (name or f"{socket.gethostname()[:30]}:{os.getpid()}:{threading.get_ident()}")[:64]
        self.chunk = chunk

    def run(self, wait: bool = False) -> int:
        """Run every operation a free lease lets it take until none is left; `wait`: also wait
        for the leases other runners hold to lapse (a dead runner's), and take those. How many
        operations it finished."""
        finished = 0
        while True:
            operation = self.claim()
            if operation is not None:
                finished += self.advance(operation)
                continue
            held = BulkOperation.objects.filter(status__in=UNDER_WAY)
            if not wait or not held.exists():
                return finished
            time.sleep(0.2)

    def claim(self) -> BulkOperation | None:
        """An operation to count or run whose lease is free, now held by this runner."""
        now = datetime.now(UTC)
        free = BulkOperation.objects.filter(status__in=UNDER_WAY).filter(
            Q(lease_until__isnull=True) | Q(lease_until__lt=now)
        )
        for pk in free.order_by("pk").values_list("pk", flat=True)[:10]:
            if free.filter(pk=pk).update(runner=self.name, lease_until=self._lease()):
                return BulkOperation.objects.get(pk=pk)
        return None

    def advance(self, operation: BulkOperation) -> bool:
        """Count the operation, or work it to its end (True), or until its lease is lost
        (False)."""
        bulk = Bulk.of_record(operation)
        call = f"bulk{operation.pk}"
        try:
            if operation.status == BulkOperation.Status.COUNTING:
                return self._count(operation, bulk)
            if operation.inflight and not self._act(operation, bulk, call, operation.inflight):
                return False
            for jobs, after in bulk.chunks(operation.cursor, self.chunk):
                if not self._save(operation, inflight=jobs, cursor=after):
                    return False
                if not self._act(operation, bulk, call, jobs):
                    return False
        except (JobQueueError, ValueError) as exc:  # (a record no longer valid: say why)
            self._save(
                operation,
                status=BulkOperation.Status.FAILED,
                error=str(exc)[:2000],
                running_key=None,
                finished_at=datetime.now(UTC),
                lease_until=None,
            )
            return False
        return self._save(
            operation,
            status=BulkOperation.Status.DONE,
            running_key=None,
            finished_at=datetime.now(UTC),
            lease_until=None,
        )

    def _count(self, operation: BulkOperation, bulk: Bulk) -> bool:
        """Count what the operation matches, saving the count so far with its cursor; then it
        waits for the operator's confirmation."""
        for found, after in bulk.counted(operation.cursor):
            if not self._save(operation, total=F("total") + found, cursor=after):
                return False
        return self._save(operation, status=BulkOperation.Status.COUNTED, cursor="", lease_until=None)

    def _act(self, operation: BulkOperation, bulk: Bulk, call: str, jobs: list[Any]) -> bool:
        """Act on the chunk saved in flight (the cursor already past it), then count it."""
        done, skipped = bulk.act([(queue, job_id, shard) for queue, job_id, shard in jobs], call)
        return self._save(operation, inflight=[], done=F("done") + done, skipped=F("skipped") + skipped)

    def _save(self, operation: BulkOperation, **values: Any) -> bool:
        """Write `values` while this runner holds the lease (renewed): False once lost."""
        values.setdefault("lease_until", self._lease())
        return bool(
            BulkOperation.objects.filter(pk=operation.pk, runner=self.name).update(
                updated_at=datetime.now(UTC), **values
            )
        )

    @staticmethod
    def _lease() -> datetime:
        return datetime.now(UTC) + timedelta(seconds=LEASE)


def run_in_thread() -> threading.Thread:
    """Run the operations there are in a thread of this process (the console's, after a
    confirmation or when a page finds an operation nobody runs): its own database connection,
    closed at the end."""

    def work() -> None:
        try:
            Runner().run()
        except Exception:  # (logged: another runner resumes the operation once its lease lapses)
            log.exception("a bulk operation's runner stopped")
        finally:
            close_old_connections()
            connection.close()

    thread = threading.Thread(target=work, name="jobqueue-bulk", daemon=True)
    thread.start()
    return thread


def stalled(operation: BulkOperation) -> bool:
    """Whether an operation to count or run has no runner now (its lease lapsed, or it never
    had one)."""
    return operation.status in UNDER_WAY and (
        operation.lease_until is None or operation.lease_until < datetime.now(UTC)
    )
