"""jobqueue: reliable, fair, fast background jobs for Django on Valkey."""

from .store import JobInfo, JobRef, Lease, Queue

__all__ = ["JobInfo", "JobRef", "Lease", "Queue"]
