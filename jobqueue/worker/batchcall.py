"""One call of a batch handler: its `BatchItem`s built from the batch's jobs, the call made (on
a runner thread, or in a pool process: pool.py), and each job's outcome made of what it came to
(see worker/batches.py). Like executor.py's `execute`, `run_batch` never raises: every job of
the batch gets an `Outcome`. A sealed job's item gets its args opened, and its outcome is sealed
under its own id (sealing.py), as a single run's is.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from ..api.batches import BatchContext, BatchItem
from ..api.handler import timeout_error
from ..conf import loop_factory
from ..records import Lease
from ..sealing import SEALED
from .executor import Outcome, _failed, _succeeded, _write_progress, resolve, sealed, timed_out


def time_limit(leases: list[Lease]) -> Lease | None:
    """The started lease whose deadline is the batch's (the smallest time limit), if any."""
    return min((lease for lease in leases if lease.deadline), key=lambda lease: lease.deadline, default=None)


class Call(NamedTuple):
    """One call of a batch handler, as `prepared` leaves it: its arguments, the outcomes of the
    jobs that cannot run (by position), and the context (if the handler takes one)."""

    func: Callable[..., Any]
    args: list[Any]
    leases: list[Lease]
    positions: list[int]
    """Where each item's job is among the batch's leases."""
    outcomes: list[Outcome | None]
    ctx: BatchContext | None


def prepared(leases: list[Lease], lanes: list[str], limit: Lease | None) -> Call:
    """The handler's call for these jobs; a job whose payload cannot run gets its fatal
    outcome instead of an item."""
    outcomes: list[Outcome | None] = [None] * len(leases)
    items, positions, handler = [], [], None
    for i, (lease, lane) in enumerate(zip(leases, lanes, strict=True)):
        resolved = resolve(lease)
        if isinstance(resolved, Outcome):
            outcomes[i] = resolved
            continue
        handler = resolved[0]
        items.append(BatchItem(lease.job_id, resolved[1], resolved[2], lane, lease.token))
        positions.append(i)
    if handler is None:
        return Call(list, [], leases, positions, outcomes, None)
    if not handler.options.takes_context:
        return Call(handler.func, [items], leases, positions, outcomes, None)
    ctx = BatchContext([leases[i] for i in positions], limit)
    return Call(handler.func, [ctx, items], leases, positions, outcomes, ctx)


def answered(call: Call, result: Any, failed: BaseException | None, started: float) -> list[Outcome]:
    """Each job's outcome from what the handler's one call came to (a sealed job's sealed under
    its own id)."""
    if call.ctx is not None:
        for ctx in call.ctx.unwritten():  # (before the outcomes are recorded)
            _write_progress(ctx)
    count = len(call.positions)
    if failed is None and (not isinstance(result, list) or len(result) != count):
        got = f"{len(result)}" if isinstance(result, list) else f"a {type(result).__name__}"
        failed = TypeError(
            f"a batch handler must return a list of one result per item, in "
            f"order: expected {count} results, got {got}"
        )
    if failed is not None:
        each = [_failed(failed, started)] * count
    else:
        each = [
            _failed(value, started) if isinstance(value, BaseException) else _succeeded(value, started)
            for value in result
        ]
    outcomes = list(call.outcomes)
    for position, outcome in zip(call.positions, each, strict=True):
        lease = call.leases[position]
        outcomes[position] = outcome if SEALED not in lease.payload else sealed(outcome, lease)
    return [outcome for outcome in outcomes if outcome is not None]


def run_batch(leases: list[Lease], lanes: list[str]) -> list[Outcome]:
    """One call of a (plain) batch handler for these started jobs, on this thread: each job's
    outcome, whatever the handler does (an `async def` one outside the event loop, as in a
    pool process, runs on a loop of its own)."""
    started, limit = time.monotonic(), time_limit(leases)
    call = prepared(leases, lanes, limit)
    if not call.positions:  # (no job of it can run)
        return answered(call, [], None, started)
    result: Any = None
    failed: BaseException | None = None
    try:
        result = call.func(*call.args)
        if inspect.iscoroutine(result):
            result = asyncio.run(_limited(result, limit), loop_factory=loop_factory())
    except BaseException as exc:  # noqa: BLE001 - whatever a handler raises fails its batch
        failed = exc
    if limit is not None and time.monotonic() >= limit.deadline:  # (a thread overran)
        return [timed_out(timeout_error(limit), time.monotonic() - started)] * len(leases)
    return answered(call, result, failed, started)


async def _limited(coroutine: Any, limit: Lease | None) -> Any:
    if limit is None:
        return await coroutine
    async with asyncio.timeout(limit.deadline - time.monotonic()):
        return await coroutine
