"""Running one claimed job: resolve its handler, run it, and say which transition records it.

`execute` never raises: whatever the job does, the worker gets an `Outcome` (the worker never
dies of a job). It is a module-level function so a process pool can run it too.
"""

from __future__ import annotations

import asyncio
import inspect
import time
import traceback
from dataclasses import dataclass
from typing import Any

from ..api import JobFunction, lookup
from ..exceptions import JobQueueError, UnknownHandler
from ..records import Lease
from ..spec import dumps
from ..store import Queue


class RetryLater(Exception):
    """Raise from a handler to retry after `retry_in` seconds without a traceback."""

    def __init__(self, reason: str = "retry requested", retry_in: float | None = None) -> None:
        super().__init__(reason)
        self.retry_in = retry_in


class JobCancelled(Exception):
    """Raised by `ctx.raise_if_cancelled()`: the job is recorded as cancelled."""


@dataclass(frozen=True)
class Outcome:
    """What the run came to: `ok` with a result, or an error to nack with."""

    ok: bool
    result: str = "null"
    """The handler's return value as JSON (encoded once, in the runner thread)."""
    error: str = ""
    retry_in: float | None = None
    fatal: bool = False
    """No retry can help (unknown handler, corrupt payload, unencodable result)."""
    duration: float = 0.0


class JobContext:
    """What a `takes_context=True` handler gets as `ctx`."""

    def __init__(self, lease: Lease) -> None:
        self.job_id = lease.job_id
        self.attempt = lease.token
        self.queue = lease.queue
        self.checkpoint = lease.checkpoint
        self._lease = lease
        self._cancelled = False
        self._next_check = 0.0

    @property
    def cancelled(self) -> bool:
        """True once an operator asked to cancel this job (Cancel on its page, or
        `Queue.cancel`). Read from Valkey at most once a second, so a loop may ask often."""
        now = time.monotonic()
        if not self._cancelled and now >= self._next_check:
            self._next_check = now + 1.0
            self._cancelled = Queue(self.queue).cancel_requested(self._lease)
        return self._cancelled

    def raise_if_cancelled(self) -> None:
        """Stop here if an operator cancelled the job: it is recorded as cancelled."""
        if self.cancelled:
            raise JobCancelled(f"job {self.job_id} was cancelled while it ran")

    def save_checkpoint(self, data: Any) -> bool:
        """Store progress so a re-run (after a crash) starts from it; False if the lease was lost."""
        saved = Queue(self._lease.queue).checkpoint(self._lease, data)
        if saved:
            self.checkpoint = data
        return saved


def resolve(lease: Lease) -> tuple[JobFunction, list[Any], dict[str, Any]]:
    """The handler and arguments a payload names; JobQueueError says what is wrong."""
    if lease.problem:
        raise JobQueueError(lease.problem)
    payload = lease.payload
    if not (isinstance(payload, dict) and isinstance(payload.get("handler"), str)
            and isinstance(payload.get("args", []), list)
            and isinstance(payload.get("kwargs", {}), dict)):
        raise JobQueueError(
            "payload must be {\"handler\": str, \"args\": list, \"kwargs\": dict}, "
            f"got {str(payload)[:200]!r}"
        )
    return _handler(payload["handler"], lease), payload.get("args", []), payload.get("kwargs", {})


def _handler(name: str, lease: Lease) -> JobFunction:
    """`@job` handlers by dotted name; Django tasks and Celery tasks by their prefix."""
    if name.startswith("django.tasks:"):
        from .. import tasks

        return tasks.handler_for(name, lease)
    if name.startswith("celery:"):
        from ..contrib import celery

        return celery.handler_for(name, lease)
    return lookup(name)


def run(handler: JobFunction, lease: Lease, args: list[Any], kwargs: dict[str, Any]) -> Any:
    if handler.options.takes_context:
        args = [JobContext(lease), *args]
    result = handler.func(*args, **kwargs)
    if inspect.iscoroutine(result):
        result = asyncio.run(result)
    return result


def execute(lease: Lease) -> Outcome:
    """resolve → run → encode; exactly one Outcome, whatever happens."""
    started = time.monotonic()

    def took() -> float:
        return time.monotonic() - started

    try:
        handler, args, kwargs = resolve(lease)
    except UnknownHandler as exc:
        return Outcome(False, error=f"{exc}: the job can never run", fatal=True, duration=took())
    except JobQueueError as exc:
        return Outcome(False, error=str(exc), fatal=True, duration=took())
    try:
        result = run(handler, lease, args, kwargs)
    except RetryLater as exc:
        return Outcome(False, error=str(exc), retry_in=exc.retry_in, duration=took())
    except JobCancelled as exc:  # the row's cancel flag makes the nack record it cancelled
        return Outcome(False, error=str(exc), fatal=True, duration=took())
    except Exception:  # noqa: BLE001 - whatever a handler raises is its job's failure
        return Outcome(False, error=traceback.format_exc(limit=20)[-8000:], duration=took())
    try:
        encoded = dumps(result, "result")
    except JobQueueError as exc:
        return Outcome(False, error=str(exc), fatal=True, duration=took())
    return Outcome(True, result=encoded, duration=took())
