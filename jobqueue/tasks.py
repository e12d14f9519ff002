"""`django.tasks` on jobqueue: `TASKS = {"default": {"BACKEND": "jobqueue.tasks.ValkeyBackend"}}`.

On Django 5.2 the same backend runs the tasks of the `django-tasks` backport (`django_tasks`).

A task is enqueued as a job whose handler is `django.tasks:<module.function>`; `runworker` runs it
with the task's own function. Result ids are job ids. Statuses map onto Django's four:
pending/scheduled/waiting → READY, active → RUNNING, succeeded → SUCCESSFUL,
dead/cancelled/expired → FAILED.

A job names a task; it never makes a process import one. The tasks a process may run or read
results of are those it defined itself with a jobqueue backend (Django validates every Task with
its backend, and `validate_task` keeps each): the modules the process imported, and each
installed app's `tasks` module, imported once when a job names a task not seen yet.

The task's `using()` options travel with the job: its queue and priority are the job's, and
what the job's row does not keep as given (`run_after`, a priority other than the @task's) sits
in the payload under "using", so that `get_result(id)` answers the task that was enqueued and
the worker's TaskResult (its signals, a TaskContext) carries the same options.
"""

from __future__ import annotations

import asyncio
import builtins
import inspect
import os
import re
import socket
import threading
import traceback
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.utils.module_loading import autodiscover_modules

try:  # Django 6.0 and later ship django.tasks
    from django.tasks import task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json
except ImportError:  # Django 5.2: the django-tasks backport (`pip install jobqueue[tasks]`)
    from django_tasks import task_backends  # type: ignore[no-redef]
    from django_tasks.backends.base import BaseTaskBackend  # type: ignore[no-redef]
    from django_tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus  # type: ignore[no-redef]
    from django_tasks.exceptions import TaskResultDoesNotExist  # type: ignore[no-redef]
    from django_tasks.signals import task_enqueued, task_finished, task_started  # type: ignore[no-redef]
    from django_tasks.utils import normalize_json  # type: ignore[no-redef]

    try:  # (its name since django-tasks 0.13)
        from django_tasks.exceptions import InvalidTask  # type: ignore[no-redef]
    except ImportError:
        from django_tasks.exceptions import InvalidTaskError as InvalidTask  # type: ignore[no-redef]

from . import signals
from .api.dispatch import submit
from .api.registry import JobFunction, JobOptions, get_job
from .engine.store import JobInfo, JobSpec, Lease, Queue
from .exceptions import JobQueueError, UnknownHandler
from .keys import validate_queue
from .records import enqueued_ms, ms_to_dt
from .sealing import opened_info
from .states import State

PREFIX = "django.tasks:"
USING = "using"
"""The payload key of the task's options the job's row does not keep as given (see above)."""
STATUS: dict[str, TaskResultStatus] = {
    State.PENDING: TaskResultStatus.READY, State.SCHEDULED: TaskResultStatus.READY,
    State.WAITING: TaskResultStatus.READY,
    State.ACTIVE: TaskResultStatus.RUNNING, State.SUCCEEDED: TaskResultStatus.SUCCESSFUL,
    State.DEAD: TaskResultStatus.FAILED, State.CANCELLED: TaskResultStatus.FAILED,
    State.EXPIRED: TaskResultStatus.FAILED,
}
JOBQUEUE_ERROR = f"{JobQueueError.__module__}.{JobQueueError.__qualname__}"
"""The class a failure names when no task raised it (jobqueue recorded it: an unknown task, a
result JSON cannot hold, a cancel, an expiry, a lease that ran out)."""
_TRACEBACK = re.compile(r"^(?P<group>  \+ Exception Group )?Traceback \(most recent call last\):\n"
                        r"(?:(?(group)  \|)[ \t].*\n)*(?(group)  \| )(?P<name>[A-Za-z_][\w.]*)(?::|$)",
                        re.MULTILINE)
"""A Python traceback (an exception group's too) up to the class of its exception, which comes
after the indented lines of its frames."""
_tasks: dict[str, Task] = {}
"""The tasks this process defined with a jobqueue backend, by module path (the @task itself:
the first Task Django validates for a function)."""
_discovery = threading.Lock()
_discovered = False
_HOST = socket.gethostname()


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
        _tasks.setdefault(task.module_path, task)  # (every Task made with this backend: @task)

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        self.validate_task(task)
        # What Django's TaskResult does with them: TypeError for what JSON cannot hold, as with
        # Django's own backends, before anything is written.
        payload = {"handler": PREFIX + task.module_path, "args": normalize_json(args),
                   "kwargs": normalize_json(kwargs)}
        if using := _using(task):
            payload[USING] = using
        spec = JobSpec(payload, priority=task.priority, run_after=task.run_after)
        [ref] = submit(Queue(task.queue_name), [spec], immediate=False)
        info = Queue(task.queue_name).get(ref.id)
        result = self._result(task, info or JobInfo(ref.id, ref.queue, State.PENDING, payload=payload))
        signals.send(task_enqueued, type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> TaskResult:
        """The result of a task's job (TaskResultDoesNotExist: no such job, or a job that is no
        task's); UnknownHandler when its task is not one this process knows."""
        info = self._find(result_id)
        payload = info.payload if info is not None and isinstance(info.payload, dict) else {}
        handler = payload.get("handler")
        if info is None or not isinstance(handler, str) or not handler.startswith(PREFIX):
            raise TaskResultDoesNotExist(result_id)
        task = _with_options(registered(handler), payload, queue_name=info.queue,
                             priority=info.priority, backend=self.alias)
        return self._result(task, info)

    def _find(self, result_id: str) -> JobInfo | None:
        try:
            for queue in sorted(self.queues) or ["default"]:
                info = get_job(result_id, queue=queue)
                if info is not None:
                    return info
        except JobQueueError:  # (not a job id)
            pass
        return None

    def _result(self, task: Task, info: JobInfo) -> TaskResult:
        info = opened_info(info) if info.sealed else info
        payload = info.payload if isinstance(info.payload, dict) else {}
        failed = info.state in (State.DEAD, State.CANCELLED, State.EXPIRED)
        result: TaskResult = TaskResult(
            task=task, id=info.id, status=STATUS.get(info.state, TaskResultStatus.FAILED),
            enqueued_at=info.enqueued_at, started_at=info.started_at,
            finished_at=info.finished_at, last_attempted_at=info.started_at,
            args=payload.get("args", []), kwargs=payload.get("kwargs", {}), backend=self.alias,
            errors=[TaskError(exception_class_path=raised(info.last_error),
                              traceback=info.last_error or info.state)] if failed else [],
            worker_ids=[info.worker or "worker"] * info.attempts,
        )
        object.__setattr__(result, "_return_value", info.result)
        return result


def raised(error: str) -> str:
    """The dotted path of the exception class a recorded error names: the last traceback's
    (the exception the task raised, after any it was raised from); JobQueueError's when the
    error is no traceback (jobqueue recorded it)."""
    names = [found["name"] for found in _TRACEBACK.finditer(error)]
    if not names:
        return JOBQUEUE_ERROR
    name = names[-1]  # (a traceback names a class of builtins or __main__ bare)
    return name if "." in name else f"{'builtins' if hasattr(builtins, name) else '__main__'}.{name}"


def registered(name: str) -> Task:
    """The task a `django.tasks:` handler name points at, if this process defined it
    (UnknownHandler otherwise); never imports a module the name points at."""
    path = name[len(PREFIX):]
    task = _tasks.get(path)
    if task is None:
        _discover()
        task = _tasks.get(path)
    if task is None:
        raise UnknownHandler(
            f"no django.tasks task {path[:200]!r} is defined in this process (a worker knows the tasks "
            "of the modules it imports: each installed app's jobs and tasks modules, and what "
            "they import; never a module a job names)")
    return task


def _discover() -> None:
    """Import each installed app's `tasks` module, once per process, in a process whose TASKS
    use a jobqueue backend: the tasks defined there register themselves."""
    global _discovered
    with _discovery:
        if _discovered or not any(isinstance(task_backends[alias], ValkeyBackend)
                                  for alias in getattr(settings, "TASKS", None) or {}):
            return
        _discovered = True  # (once, even if an app's module fails: the job that asked says why)
        autodiscover_modules("tasks")


def _using(task: Task) -> dict[str, Any]:
    """The task's options the job's row does not keep as given."""
    base = _tasks.get(task.module_path, task)
    using: dict[str, Any] = {}
    if task.priority != base.priority:
        using["priority"] = task.priority
    if task.run_after is not None:
        using["run_after"] = task.run_after.isoformat()
    return using


def _with_options(task: Task, payload: dict[str, Any], **fields: Any) -> Task:
    """The registered task with the options its job was enqueued with (its row's, `fields`, and
    the payload's "using")."""
    using = payload.get(USING)
    using = using if isinstance(using, dict) else {}
    fields.setdefault("priority", using.get("priority", task.priority))
    when = using.get("run_after")
    fields["run_after"] = None if when is None else datetime.fromisoformat(when)
    if all(getattr(task, name) == value for name, value in fields.items()):
        return task  # (the common case: no Task to build and validate per job)
    return replace(task, **fields)


def handler_for(name: str, lease: Lease) -> JobFunction:
    """A JobFunction that runs the named Django task, sending Django's task_started and
    task_finished around each run (with a TaskContext when the task takes one); an async
    task's is async, so it runs on the worker's event loop."""
    payload = lease.payload if isinstance(lease.payload, dict) else {}
    task = _with_options(registered(name), payload, queue_name=lease.queue)
    sender = type(task.get_backend())

    def run(*args: Any, **kwargs: Any) -> Any:
        result = _started(sender, task, lease, args, kwargs)
        try:
            value = task.call(*_context(result, args), **kwargs)
        except BaseException as exc:
            _finished(sender, result, exc)  # (in the except: Django's log line takes exc_info)
            raise
        return _returned(sender, result, value)

    async def arun(*args: Any, **kwargs: Any) -> Any:
        result = _started(sender, task, lease, args, kwargs)
        try:
            value = await task.acall(*_context(result, args), **kwargs)
        except asyncio.CancelledError:  # stopped from outside: the worker records what it was
            raise
        except BaseException as exc:
            _finished(sender, result, exc)
            raise
        return _returned(sender, result, value)

    if inspect.iscoroutinefunction(task.func):
        return JobFunction(arun, name, JobOptions(queue=task.queue_name))
    return JobFunction(run, name, JobOptions(queue=task.queue_name))


def _started(sender: type, task: Task, lease: Lease, args: tuple[Any, ...],
             kwargs: dict[str, Any]) -> TaskResult:
    """A run's TaskResult (RUNNING), announced."""
    now = datetime.now(UTC)
    result: TaskResult = TaskResult(
        task=task, id=lease.job_id, status=TaskResultStatus.RUNNING,
        enqueued_at=ms_to_dt(enqueued_ms(lease.job_id, None)), started_at=now,
        finished_at=None, last_attempted_at=now, args=list(args), kwargs=kwargs,
        backend=task.backend, errors=[], worker_ids=[f"{_HOST}:{os.getpid()}"] * lease.token)
    signals.send(task_started, sender, task_result=result)
    return result


def _context(result: TaskResult, args: tuple[Any, ...]) -> tuple[Any, ...]:
    return (TaskContext(task_result=result), *args) if result.task.takes_context else args


def _returned(sender: type, result: TaskResult, value: Any) -> Any:
    """A run's return value, as JSON keeps it (Django's normalisation: tuples as lists, bytes
    as text); one JSON cannot hold fails the run, and the worker ends its job dead."""
    try:
        value = normalize_json(value)
    except (TypeError, ValueError, RecursionError) as exc:
        _finished(sender, result, exc)
        return value
    _finished(sender, result, None, value)
    return value


def _finished(sender: type, result: TaskResult, error: BaseException | None,
              value: Any = None) -> None:
    """The run's end on its TaskResult (in place, as Django's own backends do), announced."""
    object.__setattr__(result, "finished_at", datetime.now(UTC))
    if error is None:
        object.__setattr__(result, "status", TaskResultStatus.SUCCESSFUL)
        object.__setattr__(result, "_return_value", value)
    else:
        kind = type(error)
        result.errors.append(TaskError(exception_class_path=f"{kind.__module__}.{kind.__qualname__}",
                                       traceback="".join(traceback.format_exception(error))))
        object.__setattr__(result, "status", TaskResultStatus.FAILED)
    signals.send(task_finished, sender, task_result=result)
