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
- `link` and `link_error`, and Celery's canvas (`chain`, `group`, `chord`) of such tasks, run as
  one jobqueue flow (celery_canvas.py); an errback job calls its task, as Celery calls an
  errback, only when the task it watches failed (`Errback`);
- what jobqueue cannot honour (a retry with other arguments or `throw=False`, `chunks`, a task
  id that is not a jobqueue id, …) is refused by name with InvalidOption, never dropped.

Nothing goes through a Celery broker or result backend: what `.delay()` returns is a `JobResult`,
whose `.get(timeout=…)` waits for the job's result through jobqueue (`JobRef.result`). How a
call's options map to a job's, and the results: celery_calls.py.
docs/howto/from-celery.md lists what is mapped, refused and changed.
"""

from __future__ import annotations

import ctypes
import inspect
import threading
from datetime import datetime, timedelta
from typing import Any

from celery import current_app
from celery.app.task import Context
from celery.exceptions import ChordError, SoftTimeLimitExceeded

from ..api.dispatch import submit
from ..api.handler import RetryLater, Unretryable
from ..api.registry import JobFunction, JobOptions, get_job
from ..engine.store import JobSpec, Lease, Queue
from ..exceptions import InvalidOption, JobFailed, UnknownHandler
from ..records import int_field
from ..states import State
from . import celery_canvas
from .celery_calls import (
    CELERY_STATES,
    IGNORED_OPTIONS,
    PREFIX,
    SOFT_LIMIT,
    BridgedTask,
    JobGroupResult,
    JobResult,
)

__all__ = ["CELERY_STATES", "IGNORED_OPTIONS", "PREFIX", "SOFT_LIMIT", "JobGroupResult",
           "JobResult", "JobTask", "SoftLimit", "handler_for"]

celery_canvas.install()


class JobTask(BridgedTask):
    """A Celery task class whose calls enqueue jobqueue jobs."""

    abstract = True

    def apply_async(self, args: Any = None, kwargs: Any = None, task_id: str | None = None,
                    producer: Any = None, link: Any = None, link_error: Any = None,
                    countdown: float | None = None, eta: datetime | None = None,
                    priority: int | None = None, queue: Any = None,
                    expires: float | timedelta | datetime | None = None,
                    **options: Any) -> JobResult:
        given = {"task_id": task_id, "countdown": countdown, "eta": eta, "priority": priority,
                 "queue": queue, "expires": expires}
        options.update({name: value for name, value in given.items() if value is not None})
        if link or link_error:  # (a flow: the task, then its callbacks)
            callbacks = {name: value for name, value in (("link", link),
                                                         ("link_error", link_error)) if value}
            result = celery_canvas.apply(self.signature(args, kwargs, options={**options,
                                                                               **callbacks}))
            assert isinstance(result, JobResult)  # (a task's result is one job's)
            return result
        call = self.job_call(args, kwargs, options)
        [ref] = submit(Queue(call.queue), [JobSpec(call.payload, **call.spec)], immediate=False)
        return JobResult(ref.id, ref.queue, app=self._get_app())

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


class Errback:
    """An errback job's watch (a canvas's `link_error`: celery_canvas.py): whether the task it
    watches failed, and the arguments Celery calls an errback with then."""

    def __init__(self, watch: dict[str, Any]) -> None:
        self.job_id, self.queue = [*(watch.get("of") or ()), "", "default"][:2]
        self.header = [tuple(job) for job in watch.get("header") or ()]
        self.immutable = bool(watch.get("immutable"))

    def arguments(self, task: JobTask, args: tuple[Any, ...],
                  kwargs: dict[str, Any]) -> tuple[Any, ...] | None:
        """The errback's arguments, its own after `(request, exc, traceback)` when it can take
        them, else after the failed task's id (Celery's rule), none more when immutable; None
        when the task did not fail. `args[0]` is the task's outcome (its result, or its error
        object when it did not succeed)."""
        outcome, own = (args[0] if args else None), tuple(args[1:])
        failure = self._failure(outcome)
        if failure is None:
            return None
        if self.immutable:
            return own
        try:
            inspect.signature(task.run).bind(None, None, None, *own, **kwargs)
        except TypeError:
            return (self.job_id, *own)
        exc, error = failure
        return (self._request(), exc, error, *own)

    def _failure(self, outcome: Any) -> tuple[BaseException, str] | None:
        """The task's failure (JobFailed, its error text) when its run failed (dead), or, for a
        chord's callback cancelled by a header task that failed, expired or was cancelled (as
        Celery's revoked), that one's (ChordError)."""
        if not (isinstance(outcome, dict) and outcome.get("job") == self.job_id):
            return None  # (it succeeded: its result is no error object of its own)
        error = str(outcome.get("error") or "")
        if outcome.get("state") == State.DEAD:
            return JobFailed(self.job_id, State.DEAD, error), error
        for member, queue in self.header if outcome.get("state") == State.CANCELLED else ():
            info = get_job(member, queue)  # (Celery fails a chord whose header task was revoked)
            if info is not None and info.state in (State.DEAD, State.EXPIRED, State.CANCELLED):
                failed = JobFailed(member, info.state, info.last_error)
                return ChordError(f"Dependency {member} raised {failed}"), info.last_error
        return None

    def _request(self) -> Context:
        """The failed task's request, as its run had it (id, task, args, kwargs, queue)."""
        info = get_job(self.job_id, self.queue)
        payload = info.payload if info is not None and isinstance(info.payload, dict) else {}
        return Context(id=self.job_id, task=str(payload.get("handler", ""))[len(PREFIX):],
                       args=payload.get("args", []), kwargs=payload.get("kwargs", {}),
                       delivery_info={"routing_key": self.queue}, jobqueue=True)


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
    watch = payload.get(celery_canvas.ERRBACK)
    errback = Errback(watch) if isinstance(watch, dict) else None

    def run(*args: Any, **kwargs: Any) -> Any:
        if errback is not None:
            reshaped = errback.arguments(task, args, kwargs)
            if reshaped is None:  # (its task did not fail: the errback is not called)
                return None
            args = reshaped
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
