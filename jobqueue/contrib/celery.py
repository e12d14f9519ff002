"""Run existing Celery tasks as jobs: `Celery(..., task_cls="jobqueue.contrib.celery:JobTask")`.

`.delay()` / `.apply_async(...)` enqueue a job whose handler is `celery:<task name>`, on the queue
Celery's routing names (`queue=`, the task's own `queue`, `task_routes`; else jobqueue's
`default`); `runworker` runs the task's own body with Celery's meaning kept:

- a task that raises fails once, as Celery records one failure: no retry follows
  (`handler.Unretryable`); `autoretry_for` goes through `self.retry` as in Celery;
- `self.retry(countdown=…, eta=…, exc=…, max_retries=…)` is a job retry, refused past the
  limit by Celery's own rule, with `self.request.retries` counting the earlier runs that were
  charged (not a stopping worker's hand-backs, nor the runs an operator's retry forgave);
  `max_retries` becomes the job's budget (max_retries + 1 runs) so a worker's death counts too;
- a task's `time_limit` (or `apply_async(time_limit=…)`) is the job's `timeout`: past it the run
  is stopped and fails with JobTimeout (retried within the job's budget); `soft_time_limit`
  raises Celery's `SoftTimeLimitExceeded` inside the task, which it may catch to clean up;
- what jobqueue cannot honour (a retry with other arguments or `throw=False`, `link`, a task id
  that is not a jobqueue id, …) is refused by name with InvalidOption, never dropped.

Nothing goes through a Celery broker or result backend: what `.delay()` returns is a `JobResult`,
whose `.get(timeout=…)` waits for the job's result through jobqueue (`JobRef.result`).
docs/howto/from-celery.md lists what is mapped, refused and changed.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from celery import Task, current_app, states
from celery.exceptions import SoftTimeLimitExceeded
from celery.exceptions import TimeoutError as CeleryTimeoutError
from celery.result import AsyncResult

from .. import ids
from ..api.dispatch import submit
from ..api.handler import RetryLater, Unretryable
from ..api.registry import JobFunction, JobOptions, get_job
from ..engine.refs import JobRef
from ..engine.store import JobSpec, Lease, Queue
from ..exceptions import InvalidJobId, InvalidOption, JobFailed, UnknownHandler
from ..records import int_field
from ..spec import MAX_ATTEMPTS, MAX_SECONDS, seconds
from ..states import State

PREFIX = "celery:"
SOFT_LIMIT = "soft_time_limit"
"""The payload's key for `apply_async(soft_time_limit=…)` (a task's own is read as it runs)."""
# Transport details with no meaning here; anything else (link, time_limit, chord, …) would be
# silently lost, so it is refused instead.
IGNORED_OPTIONS = {"serializer", "compression", "headers", "shadow", "ignore_result", "exchange",
                   "routing_key", "retry", "retry_policy"}


CELERY_STATES: dict[str, str] = {State.PENDING: states.PENDING, State.SCHEDULED: states.PENDING,
                                 State.WAITING: states.PENDING, State.ACTIVE: states.STARTED,
                                 State.SUCCEEDED: states.SUCCESS, State.DEAD: states.FAILURE,
                                 State.CANCELLED: states.REVOKED, State.EXPIRED: states.REVOKED}


class JobResult(AsyncResult):
    """Celery's AsyncResult for a job: `get`, `state`, `ready` and `result` ask jobqueue."""

    def __init__(self, id: str, queue: str = "default", app: Any = None) -> None:
        super().__init__(id, app=app)
        self.job_queue = queue

    def get(self, timeout: float | None = None, propagate: bool = True,
            **options: Any) -> Any:
        """The job's result, waiting up to `timeout` seconds (no polling); a dead or cancelled
        job raises JobFailed (returned instead with `propagate=False`), and a timeout Celery's
        TimeoutError."""
        try:
            return JobRef(self.id, self.job_queue).result(timeout)
        except TimeoutError as exc:
            raise CeleryTimeoutError(str(exc)) from None
        except JobFailed as exc:
            if propagate:
                raise
            return exc

    @property
    def state(self) -> str:
        info = get_job(self.id, self.job_queue)
        return states.PENDING if info is None else CELERY_STATES.get(info.state, states.PENDING)

    status = state

    @property
    def result(self) -> Any:
        info = get_job(self.id, self.job_queue)
        return None if info is None else (info.result if info.state == State.SUCCEEDED
                                          else info.last_error or None)

    info = result

    def ready(self) -> bool:
        return self.state in states.READY_STATES


class JobTask(Task):
    """A Celery task class whose calls enqueue jobqueue jobs."""

    abstract = True

    def apply_async(self, args: Any = None, kwargs: Any = None, task_id: str | None = None,
                    producer: Any = None, link: Any = None, link_error: Any = None,
                    countdown: float | None = None, eta: datetime | None = None,
                    priority: int | None = None, queue: Any = None,
                    expires: float | timedelta | datetime | None = None,
                    **options: Any) -> JobResult:
        time_limit = options.pop("time_limit") if "time_limit" in options else self.time_limit
        soft_limit = options.pop("soft_time_limit", None)
        if time_limit is not None:  # (named as Celery names it, not as the job's `timeout`)
            time_limit = seconds(time_limit, "time_limit", low=0.001, high=MAX_SECONDS)
        if soft_limit is None and self.soft_time_limit is not None:  # (read where it runs:
            seconds(self.soft_time_limit, SOFT_LIMIT, low=0.001, high=MAX_SECONDS)  # refused now)
        unsupported = set(options) - IGNORED_OPTIONS
        unsupported |= {name for name, value in (("link", link), ("link_error", link_error)) if value}
        if unsupported:
            raise InvalidOption(f"{self.name}: apply_async option(s) {sorted(unsupported)} are not "
                                "supported by jobqueue (args, kwargs, countdown, eta, priority, "
                                "queue, expires, task_id are)")
        args, kwargs = list(args or ()), dict(kwargs or {})
        payload: dict[str, Any] = {"handler": PREFIX + self.name, "args": args, "kwargs": kwargs}
        if soft_limit is not None:  # (a task's own soft_time_limit is read where it runs)
            payload[SOFT_LIMIT] = seconds(soft_limit, SOFT_LIMIT, low=0.001, high=MAX_SECONDS)
        spec = JobSpec(payload, job_id=self._job_id(task_id), delay=countdown, run_after=eta,
                       timeout=time_limit,
                       priority=self.priority if priority is None else priority,
                       max_attempts=_budget(self.max_retries),
                       backoff=float(self.default_retry_delay or 0),
                       expires=self.expires if expires is None else expires)
        [ref] = submit(Queue(self._queue_for(queue, args, kwargs)), [spec], immediate=False)
        return JobResult(ref.id, ref.queue, app=self._get_app())

    def _job_id(self, task_id: str | None) -> str | None:
        """`task_id` as the job's id: it must be a jobqueue id (`jobqueue.ids.new_id()`)."""
        if task_id is None:
            return None
        try:
            return ids.validate_job_id(task_id)
        except InvalidJobId as exc:
            raise InvalidOption(f"{self.name}: apply_async(task_id={task_id!r}) is refused: a "
                                f"task id is the job's id, a jobqueue id ({exc})") from None

    def _queue_for(self, queue: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
        """The queue Celery's routing picks: `apply_async(queue=…)`, then the task's own `queue`,
        then `task_routes`; one that none of them names is jobqueue's `default` (not Celery's
        `task_default_queue`)."""
        named = queue or getattr(self, "queue", None)
        if not named:
            router = self._get_app().amqp.router
            route = router.lookup_route(self.name, args, kwargs, {}, self) if router.routes else None
            named = route.get("queue") if isinstance(route, Mapping) else route
        return str(getattr(named, "name", named) or "default")  # (a name, or kombu's Queue)

    def retry(self, args: Any = None, kwargs: Any = None, exc: BaseException | None = None,
              throw: bool = True, eta: datetime | None = None, countdown: float | None = None,
              max_retries: int | None = None, **options: Any) -> Any:
        if not getattr(self.request, "jobqueue", False):
            return super().retry(args, kwargs, exc, throw, eta, countdown, max_retries, **options)
        self._refuse(args, kwargs, throw, max_retries, options)
        limit = self.max_retries if max_retries is None else max_retries
        if limit is not None and self.request.retries + 1 > limit:  # (Celery's own rule)
            if exc is not None:
                raise exc
            raise self.MaxRetriesExceededError(
                f"Can't retry {self.name}[{self.request.id}] args:{self.request.args} "
                f"kwargs:{self.request.kwargs}")
        if eta is not None:
            countdown = max((eta - datetime.now(eta.tzinfo)).total_seconds(), 0)
        delay = self.default_retry_delay if countdown is None else countdown
        raise RetryLater(repr(exc) if exc else "retry requested", retry_in=delay)

    def _refuse(self, args: Any, kwargs: Any, throw: bool, max_retries: int | None,
                options: dict[str, Any]) -> None:
        """InvalidOption for what a job's retry cannot do (its run then fails, naming it)."""
        given = [name for name, value in (("args", args), ("kwargs", kwargs)) if value is not None]
        given += ["throw"] if throw is not True else []
        given += sorted(options)
        if given:
            raise InvalidOption(
                f"{self.name}: retry({'=…, '.join(given)}=…) is not supported by jobqueue: a job "
                "is retried with its own arguments and options, and a retry ends its run")
        if max_retries is not None and self.max_retries is not None and max_retries > self.max_retries:
            raise InvalidOption(
                f"{self.name}: retry(max_retries={max_retries}) is above the task's max_retries "
                f"({self.max_retries}), which set the job's budget when it was enqueued: raise "
                "the task's max_retries")


class SoftLimit:
    """Celery's `soft_time_limit` on the thread that runs a task: past it, `SoftTimeLimitExceeded`
    is raised inside the task (at its next Python instruction: a blocking C call ends first), as
    Celery's prefork pool does with a signal; the task may catch it to clean up."""

    def __init__(self, seconds: float) -> None:
        self._thread = threading.get_ident()
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True
        self._lock = threading.Lock()
        self._over = False

    def __enter__(self) -> None:
        self._timer.start()

    def __exit__(self, *exc: object) -> None:
        with self._lock:  # (the limit fires before this, or never)
            self._over = True
        self._timer.cancel()

    def _fire(self) -> None:
        with self._lock:
            if not self._over:
                ctypes.pythonapi.PyThreadState_SetAsyncExc(
                    ctypes.c_ulong(self._thread), ctypes.py_object(SoftTimeLimitExceeded))


def _budget(max_retries: int | None) -> int:
    """The job's runs for a task's `max_retries` (None, Celery's "for ever": the most a job
    may have)."""
    return MAX_ATTEMPTS if max_retries is None else min(max_retries + 1, MAX_ATTEMPTS)


def _charged_runs(lease: Lease) -> int:
    """How many earlier runs of the job used up its budget: not a stopping worker's hand-backs,
    nor the runs an operator's retry forgave (both counted in the row's `uncharged`)."""
    queue = Queue(lease.queue)
    uncharged = queue.client.hget(queue.shard(lease.shard).job(lease.job_id), "uncharged")
    return max(lease.token - 1 - (int_field(uncharged) or 0), 0)


_imported_app_modules: list[bool] = []
"""Whether this process imported the Celery app's own modules (`handler_for`)."""


def handler_for(name: str, lease: Lease) -> JobFunction:
    """A JobFunction running the registered Celery task `name` with a request context: a task
    of this process's Celery app that runs on jobqueue (a JobTask), never one of Celery's own
    (`celery.*`, which take signatures to call)."""
    task_name = name[len(PREFIX):]
    task = current_app.tasks.get(task_name)
    if task is None and not _imported_app_modules:
        # Once per process, on the first miss: the modules the app itself names (Celery's
        # import_default_modules also runs Django's system checks through its fixup, so not
        # at every job).
        _imported_app_modules.append(True)
        current_app.loader.import_default_modules()
        task = current_app.tasks.get(task_name)
    if not isinstance(task, JobTask) or task_name.startswith("celery."):
        raise UnknownHandler(f"no Celery task registered as {task_name[:200]!r} runs on jobqueue "
                             "(a task of the worker's Celery app whose class is JobTask)")

    payload = lease.payload if isinstance(lease.payload, dict) else {}
    soft_limit = payload.get(SOFT_LIMIT) or task.soft_time_limit

    def run(*args: Any, **kwargs: Any) -> Any:
        retries = 0 if lease.token <= 1 else _charged_runs(lease)
        task.push_request(id=lease.job_id, retries=retries, args=args, kwargs=kwargs,
                          called_directly=False, jobqueue=True,
                          delivery_info={"routing_key": lease.queue})
        try:
            if soft_limit:
                with SoftLimit(float(soft_limit)):
                    return task.run(*args, **kwargs)
            return task.run(*args, **kwargs)
        except RetryLater:
            raise
        except BaseException as exc:  # (Celery records one failure: no retry follows)
            raise Unretryable(f"{task.name} failed") from exc
        finally:
            task.pop_request()

    return JobFunction(run, name, JobOptions(queue=lease.queue))
