"""The worker that `manage.py runworker` runs.

May import: operations and everything below; never the console.
"""

from ..api.handler import JobCancelled, JobContext, RetryLater  # the handler's API, also in jobqueue
from .core import Worker
from .serving import WorkerConfig

__all__ = ["JobCancelled", "JobContext", "RetryLater", "Worker", "WorkerConfig"]
