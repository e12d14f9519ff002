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

from ..api import JobFunction, handler_for
from ..exceptions import JobQueueError, UnknownHandler
from ..handler import JobCancelled, JobContext, RetryLater
from ..records import Lease
from ..spec import dumps


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
    return (handler_for(payload["handler"], lease), payload.get("args", []),
            payload.get("kwargs", {}))


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
