"""A handle on an enqueued job (`JobRef`), and waiting for its result without polling.

A caller that waits first runs the `watch` script on the job's shard: in one atomic step it
reads the row and, while the job has not finished, counts the caller in the row's `notify`
field. The script that finishes the job (`finish()` in `_finish.lua`, which every terminal
transition goes through) then pushes one token per counted waiter onto `:notify:<id>`, the list
the caller BLPOPs; a job nobody waits for costs its finish nothing more. Because the count and
the read are one step, a job that finishes between them still wakes the caller. A job Valkey no
longer holds (its row expired) is read from the database mirror (`models.Job`).

Touches only `:job:<id>` (through `watch`) and `:notify:<id>`. Asyncio callers share one
redis.asyncio client per event loop.
"""

from __future__ import annotations

import asyncio
import math
import time
import weakref
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async

from .. import ids, sealing
from ..conf import CLIENT_OPTIONS, get_client, get_config, normalise_url, seed_nodes
from ..exceptions import JobFailed, JobNotFound
from ..keys import ShardKeys, validate_queue
from ..records import json_field
from ..states import State
from . import layouts
from .scripts import operator_calls

FINISHED = (State.SUCCEEDED, State.DEAD, State.CANCELLED, State.EXPIRED)
"""The states a mirror row answers `result()` with (every terminal one)."""
WAIT_SLICE = 4.0
"""Seconds one BLPOP blocks at most: less than a pool's usual socket timeout (5 s); the wait
then watches the row again and blocks anew."""


@dataclass(frozen=True)
class JobRef:
    """A handle on an enqueued job."""

    id: str
    queue: str
    created: bool = True
    """False when a unique_key (or the caller's id) matched a live job: `id` is that job's."""

    def result(self, timeout: float | None = None) -> Any:
        """The job's result once it has succeeded, waiting up to `timeout` seconds (None: as
        long as it takes). Raises JobFailed when it ended dead, cancelled or expired,
        TimeoutError when it has not finished in time, JobNotFound when neither Valkey nor the
        mirror knows it."""
        return wait(self.queue, self.id, timeout)

    async def aresult(self, timeout: float | None = None) -> Any:
        """`result`, awaited on the caller's event loop."""
        return await await_result(self.queue, self.id, timeout)


def _answer(job_id: str, state: str, raw_result: str, error: str) -> Any:
    """A finished job's result, or JobFailed."""
    if state == State.SUCCEEDED:
        return sealing.open_value(json_field(raw_result, "result")[0], job_id, "result")
    raise JobFailed(job_id, state, sealing.open_text(error, job_id))


def _deadline(timeout: float | None) -> float:
    return math.inf if timeout is None else time.monotonic() + max(float(timeout), 0.0)


def _slice(deadline: float, job_id: str, timeout: float | None) -> float:
    """How long the next BLPOP blocks (TimeoutError once the deadline has passed)."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError(f"job {job_id} did not finish within {timeout}s")
    return max(min(left, WAIT_SLICE), 0.01)


def _shard(client: Any, queue: str, job_id: str) -> ShardKeys | None:
    """The shard holding a live row for the job, or None."""
    configured = get_config().queue(queue).shards
    for index in layouts.candidates(client, queue, configured, job_id):
        if client.exists(ShardKeys(queue, index).job(job_id)):
            return ShardKeys(queue, index)
    return None


def wait(queue: str, job_id: str, timeout: float | None = None) -> Any:
    """The result of job `job_id` of `queue` (see `JobRef.result`)."""
    ids.validate_job_id(job_id)
    validate_queue(queue)
    client, deadline = get_client(), _deadline(timeout)
    shard = _shard(client, queue, job_id)
    if shard is None:
        return _from_mirror(queue, job_id)
    while True:
        seen = operator_calls.watch(client, shard, job_id)
        if seen.state is None:
            return _from_mirror(queue, job_id)
        if seen.finished:
            return _answer(job_id, seen.state, seen.result, seen.error)
        client.blpop([shard.key(f"notify:{job_id}")], _slice(deadline, job_id, timeout))


def _from_mirror(queue: str, job_id: str) -> Any:
    """A job Valkey no longer holds: its mirror row's outcome."""
    from ..models import Job

    row = Job.objects.filter(pk=job_id, queue=queue).first()
    if row is None or row.state not in FINISHED:
        raise JobNotFound(f"no job {job_id} in queue {queue!r} (nor in the mirror)")
    if row.state == State.SUCCEEDED:
        return sealing.open_value(row.result, job_id, "result")
    raise JobFailed(job_id, row.state, sealing.open_text(row.last_error, job_id))


async def await_result(queue: str, job_id: str, timeout: float | None = None) -> Any:
    """`wait` on an event loop: the watch script and the BLPOP go through the loop's shared
    redis.asyncio client; a client asyncio cannot mirror (a django-redis cache's) waits in a
    thread instead."""
    ids.validate_job_id(job_id)
    validate_queue(queue)
    client = _async_client()
    if client is None:
        return await asyncio.to_thread(wait, queue, job_id, timeout)
    deadline = _deadline(timeout)
    shard = await asyncio.to_thread(_shard, get_client(), queue, job_id)
    if shard is None:
        return await sync_to_async(_from_mirror)(queue, job_id)
    while True:
        seen = await operator_calls.watch_async(client, shard, job_id)
        if seen.state is None:
            return await sync_to_async(_from_mirror)(queue, job_id)
        if seen.finished:
            return _answer(job_id, seen.state, seen.result, seen.error)
        await client.blpop([shard.key(f"notify:{job_id}")], _slice(deadline, job_id, timeout))


_async_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = (
    weakref.WeakKeyDictionary())


def _async_client() -> Any | None:
    """The running loop's redis.asyncio client for the configured URL (made on first use);
    None for a django-redis cache alias, whose settings asyncio cannot take over."""
    config = get_config()
    if config.cache_alias:
        return None
    loop = asyncio.get_running_loop()
    found = _async_clients.get(loop)
    if found is not None and found[0] is config:
        return found[1]
    url = config.url
    if url == "embedded":
        from .. import embedded

        url = embedded.ensure_running()
    plain, cluster = normalise_url(url)
    plain = seed_nodes(plain)[0]
    if cluster:
        from redis.asyncio.cluster import RedisCluster

        client: Any = RedisCluster.from_url(plain, **CLIENT_OPTIONS)
    else:
        from redis.asyncio import Redis

        client = Redis.from_url(plain, **CLIENT_OPTIONS)
    _async_clients[loop] = (config, client)
    return client
