"""jobqueue: reliable, fair, fast background jobs for Django on Valkey."""

from . import collector

collector.pause_for_runworker()  # (first: a runworker's start runs without the collector)

from .api import Signature, enqueue, get_job, job
from .flows import chain, chord, group
from .handler import JobCancelled, JobContext, RetryLater
from .store import JobInfo, JobRef, Lease, Queue

__all__ = ["JobCancelled", "JobContext", "JobInfo", "JobRef", "Lease", "Queue", "RetryLater",
           "Signature", "chain", "chord", "enqueue", "get_job", "group", "job"]
