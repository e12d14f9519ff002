"""jobqueue: reliable, fair, fast background jobs for Django on Valkey."""

from .api import enqueue, get_job, job
from .handler import JobCancelled, JobContext, RetryLater
from .store import JobInfo, JobRef, Lease, Queue

__all__ = ["JobCancelled", "JobContext", "JobInfo", "JobRef", "Lease", "Queue", "RetryLater",
           "enqueue", "get_job", "job"]
