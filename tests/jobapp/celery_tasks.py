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
