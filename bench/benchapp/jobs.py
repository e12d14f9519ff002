"""jobqueue's side of bench/peers.py: the same no-op job every peer runs."""

import time

from peer_tasks import counter

from jobqueue import job


@job
def tick() -> None:
    counter().incr("bench:done")


@job
def stamp(sent: float) -> None:
    """For the latency run: how long from enqueue to start (the plain handler's: jq-sync)."""
    counter().rpush("bench:latency:jq-sync", time.time() - sent)


@job
def noop() -> None:
    """For the soak: nothing at all."""


_async_counter = None


def async_counter():  # type: ignore[no-untyped-def]
    """One redis.asyncio client, made on the worker's event loop and kept there. Its pool is
    bounded (64 connections, tasks beyond them waiting their turn): with one connection per task,
    a worker's first batch (256 jobs at c=128) opened 256 connections at once and its first job
    finished only once all had made their handshakes (bench/RESULTS.md)."""
    global _async_counter
    if _async_counter is None:
        import redis.asyncio
        from peer_tasks import URL

        pool = redis.asyncio.BlockingConnectionPool.from_url(URL, max_connections=64, timeout=None)
        _async_counter = redis.asyncio.Redis(connection_pool=pool)
    return _async_counter


@job
async def atick() -> None:
    """`tick` as an async handler (redis.asyncio): it runs on the worker's event loop, as
    BullMQ's job runs on Node's."""
    await async_counter().incr("bench:done")


@job
async def astamp(sent: float) -> None:
    await async_counter().rpush("bench:latency:jobqueue", time.time() - sent)


@job
async def anoop() -> None:
    """For profiling the worker alone: an async job that does nothing."""


@job
def flow_member(i: int) -> float:
    """For bench/flows.py: a chord's member; its result is when it finished (the epoch)."""
    return time.time()


@job
def flow_callback(finished: list[float]) -> dict[str, float]:
    """For bench/flows.py: a chord's callback; how long after the last member it started."""
    started = time.time()
    return {"started": started, "gap_ms": (started - max(finished)) * 1000}


@job
async def acarry(blob: str) -> int:
    """`atick` with an argument (bench/sealed.py: 1 KB, sealed or plain) and a result."""
    await async_counter().incr("bench:done")
    return len(blob)
