"""The worker that `manage.py runworker` runs."""

from .core import Worker, WorkerConfig
from .executor import JobContext, RetryLater

__all__ = ["JobContext", "RetryLater", "Worker", "WorkerConfig"]
