"""jobqueue: reliable, fair, fast background jobs for Django on Valkey."""

from .api import enqueue, get_job, job
from .store import JobInfo, JobRef, Lease, Queue

__all__ = ["JobInfo", "JobRef", "Lease", "Queue", "enqueue", "get_job", "job"]
