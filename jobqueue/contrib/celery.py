"""Run existing Celery tasks as jobs: `Celery(..., task_cls="jobqueue.contrib.celery:JobTask")`.

`.delay()` / `.apply_async(args, kwargs, countdown=, eta=, priority=, queue=)` enqueue a job whose
handler is `celery:<task name>`; `runworker` runs the task's own body. `self.retry(countdown=…)`
becomes a job retry, and `max_retries` becomes the job's retry budget (max_retries + 1 runs).
Nothing goes through a Celery broker or result backend: what `.delay()` returns is a `JobResult`,
whose `.get(timeout=…)` waits for the job's result through jobqueue (`JobRef.result`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from celery import Task, current_app, states
from celery.exceptions import TimeoutError as CeleryTimeoutError
from celery.result import AsyncResult

from ..api import JobFunction, JobOptions, get_job, submit
from ..exceptions import InvalidOption, JobFailed, UnknownHandler
from ..handler import RetryLater
from ..refs import JobRef
from ..states import State
from ..store import JobSpec, Lease, Queue

PREFIX = "celery:"
# Transport details with no meaning here; anything else (link, expires, chord, …) would be
# silently lost, so it is refused instead.
IGNORED_OPTIONS = {"serializer", "compression", "headers", "shadow", "ignore_result", "exchange",
                   "routing_key", "retry", "retry_policy"}


CELERY_STATES: dict[str, str] = {State.PENDING: states.PENDING, State.SCHEDULED: states.PENDING,
                                 State.WAITING: states.PENDING, State.ACTIVE: states.STARTED,
                                 State.SUCCEEDED: states.SUCCESS, State.DEAD: states.FAILURE,
                                 State.CANCELLED: states.REVOKED}


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
                    priority: int | None = None, queue: str | None = None,
                    **options: Any) -> JobResult:
        unsupported = set(options) - IGNORED_OPTIONS
        unsupported |= {name for name, value in (("link", link), ("link_error", link_error)) if value}
        if unsupported:
            raise InvalidOption(f"{self.name}: apply_async option(s) {sorted(unsupported)} are not "
                                "supported by jobqueue (args, kwargs, countdown, eta, priority, queue are)")
        payload = {"handler": PREFIX + self.name, "args": list(args or ()),
                   "kwargs": dict(kwargs or {})}
        max_retries = self.max_retries
        spec = JobSpec(payload, delay=countdown, run_after=eta, priority=priority,
                       max_attempts=None if max_retries is None else max_retries + 1,
                       backoff=float(self.default_retry_delay or 0))
        [ref] = submit(Queue(queue or "default"), [spec], immediate=False)
        return JobResult(ref.id, ref.queue, app=self._get_app())

    def retry(self, args: Any = None, kwargs: Any = None, exc: BaseException | None = None,
              throw: bool = True, eta: datetime | None = None, countdown: float | None = None,
              max_retries: int | None = None, **options: Any) -> Any:
        if not getattr(self.request, "jobqueue", False):
            return super().retry(args, kwargs, exc, throw, eta, countdown, max_retries, **options)
        if eta is not None:
            countdown = max((eta - datetime.now(eta.tzinfo)).total_seconds(), 0)
        delay = self.default_retry_delay if countdown is None else countdown
        raise RetryLater(repr(exc) if exc else "retry requested", retry_in=delay)


def handler_for(name: str, lease: Lease) -> JobFunction:
    """A JobFunction running the registered Celery task `name` with a request context: a task
    of this process's Celery app that runs on jobqueue (a JobTask), never one of Celery's own
    (`celery.*`, which take signatures to call)."""
    task_name = name[len(PREFIX):]
    current_app.loader.import_default_modules()  # (the modules the app itself names)
    task = current_app.tasks.get(task_name)
    if not isinstance(task, JobTask) or task_name.startswith("celery."):
        raise UnknownHandler(f"no Celery task registered as {task_name[:200]!r} runs on jobqueue "
                             "(a task of the worker's Celery app whose class is JobTask)")

    def run(*args: Any, **kwargs: Any) -> Any:
        task.push_request(id=lease.job_id, retries=lease.token - 1, args=args, kwargs=kwargs,
                          called_directly=False, jobqueue=True)
        try:
            return task.run(*args, **kwargs)
        finally:
            task.pop_request()

    return JobFunction(run, name, JobOptions(queue=lease.queue))
