"""The handler's API: what an `@job` function may use while it runs.

`RetryLater` and `JobCancelled` are exceptions a handler raises; `JobContext` is the `ctx` a
`takes_context=True` handler gets. All three are re-exported from `jobqueue`.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from .records import Lease
from .store import Queue


class RetryLater(Exception):
    """Raise from a handler to retry after `retry_in` seconds without a traceback."""

    def __init__(self, reason: str = "retry requested", retry_in: float | None = None) -> None:
        super().__init__(reason)
        self.retry_in = retry_in


class JobCancelled(Exception):
    """Raised by `ctx.raise_if_cancelled()`: the job is recorded as cancelled."""


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

    # For `async def` handlers: the same, with the round trip to Valkey made off the event loop
    # (on its default thread pool), so the worker's other async jobs run meanwhile.

    async def acancelled(self) -> bool:
        """`cancelled`, awaited. Between its once-a-second looks it answers at once."""
        if self._cancelled or time.monotonic() < self._next_check:
            return self._cancelled
        return await asyncio.to_thread(lambda: self.cancelled)

    async def araise_if_cancelled(self) -> None:
        """`raise_if_cancelled`, awaited."""
        if await self.acancelled():
            raise JobCancelled(f"job {self.job_id} was cancelled while it ran")

    async def asave_checkpoint(self, data: Any) -> bool:
        """`save_checkpoint`, awaited."""
        return await asyncio.to_thread(self.save_checkpoint, data)
