"""Handlers the worker tests enqueue; `runworker` imports this module at start."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from jobqueue import job
from jobqueue.worker import JobContext, RetryLater


@job
def add(x: int, y: int) -> int:
    return x + y


@job
def noop() -> None:
    return None


@job(max_attempts=2, backoff=0)
def always_fails(reason: str) -> None:
    raise ValueError(reason)


@job(backoff=0)
def retry_later(seconds: float) -> None:
    raise RetryLater("not yet", retry_in=seconds)


@job
def sleep(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


@job
def append_line(path: str, text: str) -> str:
    """Appends to a file: the tests read the order in which jobs ran."""
    with open(path, "a") as f:
        f.write(text + "\n")
    return text


@job(takes_context=True, max_attempts=3, backoff=0)
def crash_once(ctx: JobContext) -> dict[str, Any]:
    """First run saves a checkpoint, then the whole worker process dies; the re-run resumes."""
    if ctx.checkpoint is None:
        ctx.save_checkpoint({"step": 1, "attempt": ctx.attempt})
        os._exit(1)
    return {"resumed_from": ctx.checkpoint, "attempt": ctx.attempt}


@job
def unencodable() -> object:
    return object()


@job
def touch(path: str) -> None:
    Path(path).touch()


from . import celery_tasks, django_tasks  # noqa: E402,F401 - the worker registers these too
