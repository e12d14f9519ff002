"""The same no-op job as every peer's, as a django-vtasks task. A plain function measured
faster here than an async one with redis.asyncio (3,065 against 1,532 jobs/s in one process)."""

from __future__ import annotations

import peer_tasks
from django_vtasks import task


@task
def tick() -> None:
    peer_tasks.tick()
