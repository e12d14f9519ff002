"""An ordinary Celery app whose tasks run as jobqueue jobs."""

from celery import Celery, shared_task

app = Celery("tests", task_cls="jobqueue.contrib.celery:JobTask", set_as_current=True)


@shared_task
def shout(word: str) -> str:
    return word.upper() + "!"


@shared_task(bind=True, max_retries=5, default_retry_delay=0)
def flaky(self, fail_times: int) -> int:  # type: ignore[no-untyped-def]
    if self.request.retries < fail_times:
        raise self.retry(exc=ConnectionError("try again"), countdown=0)
    return self.request.retries + 1


@shared_task(bind=True, max_retries=3)
def charge_card(self, amount: int) -> None:  # type: ignore[no-untyped-def]
    """Raises without self.retry: Celery records one failure, and runs it once."""
    raise ValueError(f"card declined: {amount}")


@shared_task(bind=True)
def reports_retries(self) -> int:  # type: ignore[no-untyped-def]
    return self.request.retries


@shared_task(bind=True, max_retries=5, default_retry_delay=0)
def retries_at_most_once(self) -> None:  # type: ignore[no-untyped-def]
    """Its own limit for this call (max_retries=1) wins over the task's 5."""
    raise self.retry(exc=ConnectionError("still down"), max_retries=1)


@shared_task(bind=True, default_retry_delay=0)
def retries_with_new_args(self, n: int) -> None:  # type: ignore[no-untyped-def]
    raise self.retry(args=[n + 1])


@shared_task(bind=True, default_retry_delay=0)
def retries_without_throw(self) -> str:  # type: ignore[no-untyped-def]
    self.retry(throw=False)
    return "went on"


@shared_task(bind=True, soft_time_limit=0.3, max_retries=0)
def catches_its_soft_limit(self) -> str:  # type: ignore[no-untyped-def]
    """Works until Celery's soft limit interrupts it, and cleans up."""
    import time

    from celery.exceptions import SoftTimeLimitExceeded

    try:
        while True:
            time.sleep(0.01)
    except SoftTimeLimitExceeded:
        return "cleaned up"


@shared_task(time_limit=0.5, max_retries=1, default_retry_delay=0)
def overruns_its_time_limit() -> None:
    """Works past its hard limit (a thread: left overrunning, its late return dropped)."""
    import time

    time.sleep(3)


@shared_task(soft_time_limit=-1)
def has_a_bad_soft_limit() -> None:
    """A task whose own soft_time_limit makes no sense: refused when it is enqueued."""


# The canvas tests' tasks (chain, group, chord, link and link_error of them).


@shared_task
def add(x: int, y: int) -> int:
    return x + y


@shared_task
def tsum(numbers: list[int]) -> int:
    return sum(numbers)


@shared_task
def fails(why: str) -> None:
    raise ValueError(why)


@shared_task
def sees_its_error(request, exc, traceback) -> dict:  # type: ignore[no-untyped-def]
    """An errback as modern Celery calls one: the failed task's request, exception, traceback."""
    return {"id": request.id, "task": request.task, "args": list(request.args),
            "exc": type(exc).__name__, "message": str(exc), "traceback": traceback}


@shared_task
def sees_the_task_id(task_id: str) -> str:
    """An errback of one argument: Celery calls it with the failed task's id."""
    return task_id


@shared_task
def echo(*args: object) -> list[object]:
    return list(args)
