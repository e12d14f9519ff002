"""Django signals around a job's life. A receiver runs in the process that sends it, on the
sending thread; a receiver that raises is logged and does not stop the job or the worker.

- `job_enqueued(sender=Queue, ref=JobRef)` — in the enqueuing process (web, shell, a worker
  firing a schedule), once Valkey holds a new job; not for a unique key that matched a live job.
- `job_started(sender=Queue, lease=Lease)` — in the worker, just before the handler runs: on the
  runner thread (also with `--processes`: the handler then runs in a pool process); for an
  `async def` handler on a thread of the event loop's executor, never on the loop itself, so a
  receiver may use the ORM.
- `job_finished(sender=Queue, lease=Lease, state=str, duration=float)` — in the worker, once the
  outcome is recorded: `state` is the job's new state (`succeeded`, `pending` or `scheduled` for
  a retry, `dead`, `cancelled`, or `stale` when the lease had been lost), `duration` the run's
  seconds.

The worker's signals are sent as a request runs (`send_from_worker`): the sending thread's
database connections are closed or checked before and after the receivers, so a receiver's
query never meets a connection the server dropped (a restart, `wait_timeout`) more than once.
"""

from __future__ import annotations

import logging
from typing import Any

from django.dispatch import Signal

from ._compat import connection_closer

log = logging.getLogger("jobqueue.signals")

job_enqueued = Signal()
job_started = Signal()
job_finished = Signal()


def send(signal: Signal, sender: Any, **kwargs: Any) -> None:
    """Send `signal` if anything listens; a receiver's error is logged, never raised."""
    if not signal.receivers or not signal.has_listeners(sender):  # (the first: per job, cheap)
        return
    for receiver, result in signal.send_robust(sender, **kwargs):
        if isinstance(result, Exception):
            log.error("a %s receiver (%r) failed: %r", _name(signal), receiver, result)


def send_from_worker(signal: Signal, sender: Any, **kwargs: Any) -> None:
    """`send`, for the worker's signals: around the receivers, this thread's database
    connections are closed or checked as at a request's start and end (CONN_MAX_AGE,
    CONN_HEALTH_CHECKS). Nothing is done when nothing listens."""
    if not signal.receivers or not signal.has_listeners(sender):
        return
    close = connection_closer()  # (nothing to do when this thread holds no connection)
    close()
    try:
        send(signal, sender, **kwargs)
    finally:
        close()


def _name(signal: Signal) -> str:
    return next((name for name, value in globals().items() if value is signal), "signal")
