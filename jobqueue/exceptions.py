"""Typed errors of jobqueue: every one is a `JobQueueError` (and `VALKEY_DOWN`, the errors of
an unreachable Valkey that callers wait through).

A stale lease is not an error: `Queue.ack`/`nack`/`extend` answer False/None for it.
"""

from __future__ import annotations

from typing import Any

from redis.exceptions import ConnectionError as ValkeyConnectionError
from redis.exceptions import TimeoutError as ValkeyTimeoutError

VALKEY_DOWN = (ValkeyConnectionError, ValkeyTimeoutError, ConnectionRefusedError)
"""What a call raises when Valkey did not answer (down, restarting, unreachable): not an error of
jobqueue's but a moment to wait through; a worker retries once Valkey answers."""


class JobQueueError(Exception):
    """Base class of every error jobqueue raises on purpose."""


class InvalidName(JobQueueError, ValueError):
    """A queue or lane name outside the allowed charset or length."""


class InvalidJobId(JobQueueError, ValueError):
    """A job id that is not a branded `JOB…` id."""


class InvalidPriority(JobQueueError, ValueError):
    """A priority that is not an integer in -100…100."""


class InvalidPayload(JobQueueError, ValueError):
    """Arguments, results or checkpoints that JSON cannot represent."""


class InvalidOption(JobQueueError, ValueError):
    """An enqueue or worker option with a wrong type or out of range."""


class JobNotFound(JobQueueError, LookupError):
    """No live row for that job id in that queue."""


class InvalidTransition(JobQueueError):
    """An operator action the job's current state does not allow."""


class UnknownHandler(JobQueueError, LookupError):
    """No `@job` handler is registered under that dotted name."""


class NotReplicated(JobQueueError):
    """A queue with `wait_replicas`: the jobs were written on the primary, but fewer replicas
    than asked confirmed them in time. `refs` are the jobs (they exist, and run, unless the
    primary fails before a replica has them); enqueue them again with the same ids to be sure."""

    def __init__(self, message: str, refs: list[Any]) -> None:
        super().__init__(message)
        self.refs = refs


class ConfigurationError(JobQueueError):
    """Settings that cannot work (bad URL, bad queue options)."""


class JobFailed(JobQueueError):
    """A job awaited for its result ended without one: dead (its retry budget spent) or
    cancelled. `state` is that state, `error` the job's last error."""

    def __init__(self, job_id: str, state: str, error: str = "") -> None:
        last = error.strip().splitlines()[-1:] if error else []
        super().__init__(f"job {job_id} ended {state}" + (f": {last[0]}" if last else ""))
        self.job_id, self.state, self.error = job_id, state, error


class JobTimeout(JobQueueError):
    """A run that passed its `timeout` (the job's or its queue's option): the attempt fails with
    this error and is retried as `max_attempts` and `backoff` say. The worker ends it (an async
    run is cancelled, a process-pool run's process killed; a thread's run is left overrunning,
    its `ctx.cancelled` true and its late return discarded), or, when the worker itself is stuck,
    another worker's reaper does once the run's lease lapses past the limit."""


class InvalidFlow(JobQueueError, ValueError):
    """A flow or a dependency that cannot be built: a cycle, an unknown or finished-and-gone
    member, an empty group, a step that cannot take the previous result, a flow across queues
    that names a durable queue or an unknown one."""
