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
