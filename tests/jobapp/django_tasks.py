"""django.tasks functions the integration tests enqueue through jobqueue.tasks.ValkeyBackend."""

try:
    from django.tasks import TaskContext, task
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import TaskContext, task  # type: ignore[no-redef]


@task
def multiply(x: int, y: int) -> int:
    return x * y


@task
def explode() -> None:
    raise RuntimeError("kaboom")


@task(takes_context=True)
def which_attempt(context: TaskContext) -> int:
    return context.attempt


@task
async def add_later(x: int, y: int) -> int:
    import asyncio

    await asyncio.sleep(0.01)
    return x + y


# What tests/api/test_django_tasks.py holds the backend to (the checks django-tasks' own backends
# pass, rewritten for a real backend and worker).

RAN: list[str] = []
"""The tags of `record`'s runs, in order (the worker runs in the test's process)."""


class TaskBroke(Exception):
    """A task's own exception class: its result must name it."""


@task
def noop(*args: object, **kwargs: object) -> None:
    return None


@task
async def anoop(*args: object, **kwargs: object) -> None:
    return None


@task
def meaning_of_life() -> int:
    return 42


@task
def fails_with_value_error() -> None:
    raise ValueError("This task failed due to ValueError")


@task
def fails_with_its_own_error() -> None:
    raise TaskBroke("a task's own exception")


@task
def complex_exception() -> None:
    raise ValueError(ValueError("This task failed"))


@task
def returns_what_json_cannot_hold() -> object:
    return lambda: True


@task
def returns_bytes_and_tuples() -> object:
    return {"b": b"bytes", "t": (1, 2)}


@task(takes_context=True)
def own_id(context: TaskContext) -> str:
    return context.task_result.id


@task(takes_context=True)
def sees_its_context(context: TaskContext, attempt: int) -> str:
    assert isinstance(context, TaskContext) and context.attempt == attempt
    assert context.task_result.task.queue_name == "emails" and context.task_result.task.priority == 7
    return context.task_result.status


@task
def record(tag: str) -> None:
    RAN.append(tag)


@task(takes_context=True)
def fails_on_its_first_run(context: TaskContext) -> int:
    if context.attempt == 1:
        raise ConnectionError("the first run fails")
    return context.attempt
