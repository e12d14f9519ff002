"""Running one claimed job: resolve its handler, run it, and say which transition records it.

`execute` (and `execute_async`, for an `async def` handler) never raises: whatever the job does,
the worker gets an `Outcome` (the worker never dies of a job). A `BaseException` is the job's
failure too, as in Django's database backend: `SystemExit`, a `KeyboardInterrupt` or a
`CancelledError` that the handler's own code raised fails its run, and only a cancel that the
worker itself made ends a run without an outcome (runners.py tells them apart). It is a
module-level function so a pool process can run it too.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
import traceback
from typing import Any, NamedTuple, TypeGuard

from redis.exceptions import RedisError

from .. import sealing, tracing
from ..api.handler import JobCancelled, JobContext, RetryLater, Unretryable, timeout_error
from ..api.registry import JobFunction, handler_for
from ..conf import loop_factory
from ..exceptions import JobQueueError, JobTimeout, UnknownHandler
from ..records import Lease
from ..sealing import SEALED
from ..spec import dumps

log = logging.getLogger("jobqueue.worker")


class Outcome(NamedTuple):
    """What the run came to: `ok` with a result, or an error to nack with (one per job: a named
    tuple costs a third of a frozen dataclass)."""

    ok: bool
    result: str = "null"
    """The handler's return value as JSON (encoded once, in the runner thread)."""
    error: str = ""
    retry_in: float | None = None
    fatal: bool = False
    """No retry can help (unknown handler, corrupt payload, unencodable result)."""
    duration: float = 0.0


Resolved = tuple[JobFunction, list[Any], dict[str, Any]]
"""A claimed job's handler and arguments, as its payload names them."""


def _looked_up(lease: Lease) -> Resolved:
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
    handler = handler_for(payload["handler"], lease)
    if SEALED in payload:  # (SealError: a key no longer listed, a value tampered with)
        return (handler, *sealing.open_payload(payload, lease.job_id))
    return handler, payload.get("args", []), payload.get("kwargs", {})


def resolve(lease: Lease) -> Resolved | Outcome:
    """The handler and arguments of a claimed job, or the fatal Outcome of a job that can
    never run (an unknown handler, a corrupt payload, a handler whose lookup failed)."""
    try:
        return _looked_up(lease)
    except UnknownHandler as exc:
        return Outcome(False, error=f"{exc}: the job can never run", fatal=True)
    except JobQueueError as exc:
        return Outcome(False, error=str(exc), fatal=True)
    except Exception as exc:  # noqa: BLE001 - a payload's handler name is data: whatever its
        # lookup raises (a bridge's import, an app's tasks module) ends that job, never the
        # thread that claimed it
        name = lease.payload.get("handler") if isinstance(lease.payload, dict) else None
        return Outcome(False, error=f"the handler {str(name)[:200]!r} could not be looked up "
                                    f"({type(exc).__qualname__}: {exc}): the job can never run",
                       fatal=True)


def is_async(resolved: Resolved | Outcome) -> TypeGuard[Resolved]:
    """Whether the job runs on the worker's event loop (an `async def` handler)."""
    return not isinstance(resolved, Outcome) and resolved[0].is_async


def _call_args(resolved: Resolved, lease: Lease) -> tuple[Any, list[Any], dict[str, Any]]:
    handler, args, kwargs = resolved
    if handler.options.takes_context:
        args = [JobContext(lease), *args]
    return handler.func, args, kwargs


def _unwritten(args: list[Any]) -> JobContext | None:
    """The job's context when it holds progress not yet written (written before the outcome
    is recorded: a fenced write after the ack would be refused, and the last value lost)."""
    ctx = args[0] if args and isinstance(args[0], JobContext) else None
    return ctx if ctx is not None and ctx.progress_unwritten else None


def execute(lease: Lease, resolved: Resolved | Outcome | None = None) -> Outcome:
    """resolve → run → encode; exactly one Outcome, whatever happens."""
    started = time.monotonic()
    resolved = resolve(lease) if resolved is None else resolved
    if isinstance(resolved, Outcome):
        return resolved
    func, args, kwargs = _call_args(resolved, lease)
    try:
        result = func(*args, **kwargs)
        if inspect.iscoroutine(result):  # a coroutine outside the event loop (process mode)
            result = asyncio.run(result, loop_factory=loop_factory())
    except BaseException as exc:  # noqa: BLE001 - whatever a handler raises is its job's failure
        outcome = _failed(exc, started, _unwritten(args))
    else:
        outcome = _succeeded(result, started, _unwritten(args))
    return outcome if SEALED not in lease.payload else sealed(outcome, lease)


async def execute_async(lease: Lease, resolved: Resolved) -> Outcome:
    """`execute` for an `async def` handler, awaited on the worker's event loop. A cancel of its
    task ends up here as a failure too: the caller, which knows whether it cancelled the task,
    drops the outcome of a run it cancelled itself. A run with a time limit is cancelled at its
    deadline by a timer of the loop (`asyncio.timeout`), and fails with JobTimeout whatever it
    did with the cancel (raised it, raised another error, or swallowed it and returned), and
    also when it ends past its deadline without the timer's cancel (a handler that held the
    loop gives the timer no turn)."""
    started = time.monotonic()
    func, args, kwargs = _call_args(resolved, lease)
    failed: BaseException | None = None
    limit = asyncio.timeout(lease.deadline - started) if lease.deadline else None
    try:
        if limit is None:
            result = await func(*args, **kwargs)
        else:
            async with limit:
                result = await func(*args, **kwargs)
    except BaseException as exc:  # noqa: BLE001 - whatever a handler raises is its job's failure
        failed = exc
    if limit is not None and (limit.expired() or time.monotonic() >= lease.deadline):
        failed = JobTimeout(timeout_error(lease))
    ctx = _unwritten(args)
    if ctx is not None:  # (a round trip: off the loop)
        await asyncio.to_thread(_write_progress, ctx)
    outcome = _failed(failed, started) if failed is not None else _succeeded(result, started)
    return outcome if SEALED not in lease.payload else sealed(outcome, lease)


def sealed(outcome: Outcome, lease: Lease) -> Outcome:
    """A sealed job's outcome as it is stored: its result and error text sealed (sealing.py)."""
    try:
        return outcome._replace(
            result=sealing.seal_json(outcome.result, lease.job_id, "result"),
            error=outcome.error and sealing.keyring().seal(outcome.error, lease.job_id, "error"))
    except JobQueueError as exc:  # (the keys were unset since the job was opened)
        return Outcome(False, error=f"the outcome could not be sealed: {exc}", fatal=True)


def _write_progress(ctx: JobContext | None) -> None:
    """Write a job's last progress; Valkey away or refusing it (an error reply: OOM, a script
    error) loses it, and the outcome still gets recorded."""
    if ctx is not None:
        try:
            ctx.flush_progress()
        except RedisError as exc:
            log.warning("job=%s: its last progress could not be written (%r)", ctx.job_id, exc)


def unexpected(exc: Exception) -> Outcome:
    """The failure of a job whose run broke outside its handler (the worker's own code around
    it: a bug, or a reply no code expected); a retry may run it."""
    error = "".join(traceback.format_exception(exc, limit=20))[-8000:]
    return Outcome(False, error=f"the worker failed around this job: {error}")


def _failed(exc: BaseException, started: float, ctx: JobContext | None = None) -> Outcome:
    _write_progress(ctx)
    took = time.monotonic() - started
    final = isinstance(exc, Unretryable)
    if final and exc.__cause__ is not None:  # (the handler's own error is the one to show)
        exc = exc.__cause__
    tracing.failed(exc)
    if isinstance(exc, RetryLater):
        return Outcome(False, error=str(exc), retry_in=exc.retry_in, duration=took)
    if isinstance(exc, JobCancelled):  # the row's cancel flag makes the nack record it cancelled
        return Outcome(False, error=str(exc), fatal=True, duration=took)
    if isinstance(exc, JobTimeout):  # (the error says it all: no traceback to read)
        return timed_out(str(exc), took)
    error = "".join(traceback.format_exception(exc, limit=20))[-8000:]
    return Outcome(False, error=error, fatal=final, duration=took)


def timed_out(message: str, took: float) -> Outcome:
    """The failure of a run past its time limit (retried as its budget allows)."""
    return Outcome(False, error=f"jobqueue.exceptions.JobTimeout: {message}", duration=took)


def _succeeded(result: Any, started: float, ctx: JobContext | None = None) -> Outcome:
    _write_progress(ctx)
    try:
        encoded = dumps(result, "result")
    except JobQueueError as exc:
        return Outcome(False, error=str(exc), fatal=True, duration=time.monotonic() - started)
    return Outcome(True, result=encoded, duration=time.monotonic() - started)
