"""The worker that `manage.py runworker` runs."""

from .core import Worker, WorkerConfig
from .executor import JobCancelled, JobContext, RetryLater

__all__ = ["JobCancelled", "JobContext", "RetryLater", "Worker", "WorkerConfig"]
