"""jobqueue: reliable, fair, fast background jobs for Django on Valkey.

The package is a few rooms, each a folder, and the leaves they share. Each room imports only the
rooms left of it, never one to its right:

    leaves  <-  models  <-  engine  <-  flows  <-  history  <-  api  <-  operations  <-  worker  <-  console

The leaves are the modules at the top level that every room may use: `_compat`, `exceptions`,
`states`, `signals`, `ids`, `keys`, `records`, `options`, `spec`, `cron`, `grants`, `sealing`, `conf`,
`embedded`, `tracing`, `collector` and `debug`. `models` is `jobqueue/models.py`, where Django
looks for it. Each room's `__init__` says what the room owns and imports nothing (but `flows`,
for the names the docs call). The other modules left at the top level are anchors that Django,
settings strings or the docs name by path: this module (the public API, re-exported below), `apps`, `admin`,
`urls`, `metrics`, `tasks`, `contrib.celery`, `management/` and `templatetags/`.
"""

from . import collector

collector.pause_for_runworker()  # (first: a runworker's start runs without the collector)

from .api.batches import BatchContext, BatchItem
from .api.composition import chain, chord, group
from .api.handler import JobCancelled, JobContext, RetryLater
from .api.registry import Signature, enqueue, get_job, job
from .engine.store import JobInfo, JobRef, Lease, Queue

__all__ = ["BatchContext", "BatchItem", "JobCancelled", "JobContext", "JobInfo", "JobRef", "Lease",
           "Queue", "RetryLater", "Signature", "chain", "chord", "enqueue", "get_job", "group",
           "job"]
