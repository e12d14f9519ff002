"""`django.tasks` on jobqueue: `TASKS = {"default": {"BACKEND": "jobqueue.tasks.ValkeyBackend"}}`.

On Django 5.2 the same backend runs the tasks of the `django-tasks` backport (`django_tasks`).

A task is enqueued as a job whose handler is `django.tasks:<module.function>`; `runworker` runs it
with the task's own function. Result ids are job ids. Statuses map onto Django's four:
pending/scheduled/waiting → READY, active → RUNNING, succeeded → SUCCESSFUL,
dead/cancelled/expired → FAILED.
"""

from __future__ import annotations

import inspect
from typing import Any

from django.utils.module_loading import import_string

try:  # Django 6.0 and later ship django.tasks
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
except ImportError:  # Django 5.2: the django-tasks backport (`pip install jobqueue[tasks]`)
    from django_tasks.backends.base import BaseTaskBackend  # type: ignore[no-redef]
    from django_tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus  # type: ignore[no-redef]
    from django_tasks.exceptions import InvalidTaskError as InvalidTask  # type: ignore[no-redef]
    from django_tasks.exceptions import TaskResultDoesNotExist  # type: ignore[no-redef]

from .api import JobFunction, JobOptions, submit
from .exceptions import JobQueueError, UnknownHandler
from .keys import validate_queue
from .states import State
from .store import JobInfo, JobSpec, Lease, Queue

PREFIX = "django.tasks:"
STATUS: dict[str, TaskResultStatus] = {
    State.PENDING: TaskResultStatus.READY, State.SCHEDULED: TaskResultStatus.READY,
    State.WAITING: TaskResultStatus.READY,
    State.ACTIVE: TaskResultStatus.RUNNING, State.SUCCEEDED: TaskResultStatus.SUCCESSFUL,
    State.DEAD: TaskResultStatus.FAILED, State.CANCELLED: TaskResultStatus.FAILED,
    State.EXPIRED: TaskResultStatus.FAILED,
}


class ValkeyBackend(BaseTaskBackend):
    """Runs Django tasks on jobqueue workers, with priorities, run_after and results."""

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def validate_task(self, task: Task) -> None:
        super().validate_task(task)
        try:
            validate_queue(task.queue_name)
        except JobQueueError as exc:
            raise InvalidTask(str(exc)) from None

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        self.validate_task(task)
        payload = {"handler": PREFIX + task.module_path, "args": list(args), "kwargs": dict(kwargs)}
        spec = JobSpec(payload, priority=task.priority, run_after=task.run_after)
        [ref] = submit(Queue(task.queue_name), [spec], immediate=False)
        info = Queue(task.queue_name).get(ref.id)
        return self._result(task, info or JobInfo(ref.id, ref.queue, State.PENDING, payload=payload))

    def get_result(self, result_id: str) -> TaskResult:
        from .api import get_job

        try:
            for queue in self.queues or ["default"]:
                info = get_job(result_id, queue=queue)
                if info is not None:
                    break
        except JobQueueError:
            info = None
        if info is None or not isinstance(info.payload, dict):
            raise TaskResultDoesNotExist(result_id)
        return self._result(_task(info.payload.get("handler", "")), info)

    def _result(self, task: Task, info: JobInfo) -> TaskResult:
        payload = info.payload if isinstance(info.payload, dict) else {}
        failed = info.state in (State.DEAD, State.CANCELLED, State.EXPIRED)
        result: TaskResult = TaskResult(
            task=task, id=info.id, status=STATUS.get(info.state, TaskResultStatus.FAILED),
            enqueued_at=info.enqueued_at, started_at=info.started_at,
            finished_at=info.finished_at, last_attempted_at=info.started_at,
            args=payload.get("args", []), kwargs=payload.get("kwargs", {}), backend=self.alias,
            errors=[TaskError(exception_class_path="jobqueue.exceptions.JobQueueError",
                              traceback=info.last_error or info.state)] if failed else [],
            worker_ids=[info.worker or "worker"] * info.attempts,
        )
        object.__setattr__(result, "_return_value", info.result)
        return result


def _task(path: str) -> Task:
    """The Django Task a handler name points at; only real Task objects are ever run."""
    if not path.startswith(PREFIX):
        raise UnknownHandler(f"{path!r} is not a django.tasks handler")
    try:
        task = import_string(path[len(PREFIX):])
    except ImportError:
        raise UnknownHandler(f"no django.tasks task at {path[len(PREFIX):]!r}") from None
    if not isinstance(task, Task):
        raise UnknownHandler(f"{path[len(PREFIX):]!r} is not a @task")
    return task


def handler_for(name: str, lease: Lease) -> JobFunction:
    """A JobFunction that runs the named Django task (with a TaskContext when it takes one); an
    async task's is async, so it runs on the worker's event loop."""
    task = _task(name)

    def context_args(args: tuple[Any, ...]) -> tuple[Any, ...]:
        if not task.takes_context:
            return args
        backend = task.get_backend()
        info = JobInfo(lease.job_id, lease.queue, State.ACTIVE, attempts=lease.token,
                       payload=lease.payload)
        result = backend._result(task, info) if isinstance(backend, ValkeyBackend) else None
        return (TaskContext(task_result=result), *args)  # type: ignore[arg-type]

    def run(*args: Any, **kwargs: Any) -> Any:
        return task.call(*context_args(args), **kwargs)

    async def arun(*args: Any, **kwargs: Any) -> Any:
        return await task.acall(*context_args(args), **kwargs)

    if inspect.iscoroutinefunction(task.func):
        return JobFunction(arun, name, JobOptions(queue=task.queue_name))
    return JobFunction(run, name, JobOptions(queue=task.queue_name))
