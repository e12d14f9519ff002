"""The same no-op job as every peer's, as django-vtasks runs it best: an async task."""

from __future__ import annotations

from functools import cache

import redis.asyncio
from django_vtasks import task
from peer_tasks import URL


@cache
def _counter() -> redis.asyncio.Redis:
    return redis.asyncio.Redis.from_url(URL)


@task
async def tick() -> None:
    await _counter().incr("bench:done")
