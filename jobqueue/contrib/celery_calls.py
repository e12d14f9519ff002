"""A call of a bridged Celery task as a job: `apply_async`'s options mapped to the job's
(`BridgedTask.job_call`), and what a call returns (`JobResult`, `JobGroupResult`).

The Celery bridge (celery.py) enqueues one call; its canvas (celery_canvas.py) compiles
`chain`, `group` and `chord` of such calls into a jobqueue flow. Both map options here, so a
task's signature in a canvas means what its `apply_async` means.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from celery import Task, states
from celery.exceptions import TimeoutError as CeleryTimeoutError
from celery.result import AsyncResult, GroupResult
from vine import barrier

from .. import ids
from ..api.registry import get_job
from ..engine.refs import JobRef
from ..exceptions import InvalidJobId, InvalidOption, JobFailed
from ..options import MAX_ATTEMPTS, MAX_SECONDS, seconds
from ..states import State

PREFIX = "celery:"
SOFT_LIMIT = "soft_time_limit"
"""The payload's key for `apply_async(soft_time_limit=…)` (a task's own is read as it runs)."""
# Transport details with no meaning here; anything else (time_limit, chord, …) would be
# silently lost, so it is refused instead.
IGNORED_OPTIONS = {
    "serializer",
    "compression",
    "headers",
    "shadow",
    "ignore_result",
    "exchange",
    "routing_key",
    "retry",
    "retry_policy",
    "producer",
    "add_to_parent",
    "publisher",
    "connection",
    "router",
    "result_cls",
    "route_name",
}
MAPPED_OPTIONS = (
    "args, kwargs, countdown, eta, priority, queue, expires, time_limit, "
    "soft_time_limit, task_id, link, link_error"
)

CELERY_STATES: dict[str, str] = {
    State.PENDING: states.PENDING,
    State.SCHEDULED: states.PENDING,
    State.WAITING: states.PENDING,
    State.ACTIVE: states.STARTED,
    State.SUCCEEDED: states.SUCCESS,
    State.DEAD: states.FAILURE,
    State.CANCELLED: states.REVOKED,
    State.EXPIRED: states.REVOKED,
}


class JobCall(NamedTuple):
    """One call of a bridged task as a job: its queue, payload and `JobSpec` options."""

    queue: str
    payload: dict[str, Any]
    spec: dict[str, Any]


class BridgedTask(Task):
    """A Celery task whose calls are jobqueue jobs: the options of a call mapped to a job's."""

    abstract = True

    def job_call(self, args: Any, kwargs: Any, options: Mapping[str, Any]) -> JobCall:
        """The job for `apply_async(args, kwargs, **options)` (link and link_error taken out
        by the caller); InvalidOption names an option that cannot be honoured, or is bad."""
        if self.name.startswith("celery."):
            raise InvalidOption(
                f"{self.name} is one of Celery's own tasks (chunks, xmap and xstarmap, "
                "starmap and map call them), which jobqueue does not run: write a group of "
                "the task's signatures instead"
            )
        options = dict(options)
        time_limit = options.pop("time_limit") if "time_limit" in options else self.time_limit
        soft_limit = options.pop("soft_time_limit", None)
        if time_limit is not None:  # (named as Celery names it, not as the job's `timeout`)
            time_limit = seconds(time_limit, "time_limit", low=0.001, high=MAX_SECONDS)
        if soft_limit is None and self.soft_time_limit is not None:  # (read where it runs:
            seconds(self.soft_time_limit, SOFT_LIMIT, low=0.001, high=MAX_SECONDS)  # refused now)
        known = {"task_id", "countdown", "eta", "priority", "queue", "expires"}
        unsupported = set(options) - IGNORED_OPTIONS - known
        unsupported |= {name for name in ("link", "link_error") if options.get(name)}
        if unsupported:
            raise InvalidOption(
                f"{self.name}: apply_async option(s) {sorted(unsupported)} are not "
                f"supported by jobqueue ({MAPPED_OPTIONS} are)"
            )
        args, kwargs = list(args or ()), dict(kwargs or {})
        payload: dict[str, Any] = {"handler": PREFIX + self.name, "args": args, "kwargs": kwargs}
        if soft_limit is not None:  # (a task's own soft_time_limit is read where it runs)
            payload[SOFT_LIMIT] = seconds(soft_limit, SOFT_LIMIT, low=0.001, high=MAX_SECONDS)
        priority, expires = options.get("priority"), options.get("expires")
        spec = {
            "job_id": self._job_id(options.get("task_id")),
            "delay": options.get("countdown"),
            "run_after": options.get("eta"),
            "timeout": time_limit,
            "priority": self.priority if priority is None else priority,
            "max_attempts": _budget(self.max_retries),
            "backoff": float(self.default_retry_delay or 0),
            "expires": self.expires if expires is None else expires,
        }
        return JobCall(
            self._queue_for(options.get("queue"), args, kwargs),
            payload,
            {key: value for key, value in spec.items() if value is not None},
        )

    def _job_id(self, task_id: str | None) -> str | None:
        """`task_id` as the job's id: it must be a jobqueue id (`jobqueue.ids.new_id()`)."""
        if task_id is None:
            return None
        try:
            return ids.validate_job_id(task_id)
        except InvalidJobId as exc:
            raise InvalidOption(
                f"{self.name}: apply_async(task_id={task_id!r}) is refused: a "
                f"task id is the job's id, a jobqueue id ({exc})"
            ) from None

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


def _budget(max_retries: int | None) -> int:
    """The job's runs for a task's `max_retries` (None, Celery's "for ever": the most a job
    may have)."""
    return MAX_ATTEMPTS if max_retries is None else min(max_retries + 1, MAX_ATTEMPTS)


class JobResult(AsyncResult):
    """Celery's AsyncResult for a job: `get`, `state`, `ready` and `result` ask jobqueue."""

    def __init__(self, id: str, queue: str = "default", app: Any = None) -> None:
        super().__init__(id, app=app)
        self.job_queue = queue

    def get(self, timeout: float | None = None, propagate: bool = True, **options: Any) -> Any:
        """The job's result, waiting up to `timeout` seconds (no polling); a dead, cancelled
        or expired job raises JobFailed (returned instead with `propagate=False`), and a
        timeout Celery's TimeoutError."""
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
        return (
            None
            if info is None
            else (info.result if info.state == State.SUCCEEDED else info.last_error or None)
        )

    info = result

    def ready(self) -> bool:
        return self.state in states.READY_STATES


class JobGroupResult(GroupResult):
    """Celery's GroupResult for a group's jobs (its id is the flow's; None for a group nested
    in a canvas, which has no id of its own): `get` is the list of
    their results, in order; `ready`, `successful`, `failed`, `completed_count` ask each job."""

    def __init__(self, id: str | None, results: list[JobResult], app: Any = None) -> None:
        # (Celery's barrier waits for its result backend to fulfil each member: an empty one,
        # never fulfilled, as jobqueue answers `get` and `ready`)
        super().__init__(id, results, app=app, ready_barrier=barrier())

    def get(self, timeout: float | None = None, propagate: bool = True, **options: Any) -> list[Any]:
        """Every member's result, in order (JobFailed for the first that failed, returned in
        its place with `propagate=False`; Celery's TimeoutError once `timeout` passes)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        return [
            result.get(None if deadline is None else max(deadline - time.monotonic(), 0), propagate)
            for result in self.results
        ]

    join = join_native = get
