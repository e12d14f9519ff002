"""django.tasks functions the integration tests enqueue through jobqueue.tasks.ValkeyBackend."""

from django.tasks import TaskContext, task


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
