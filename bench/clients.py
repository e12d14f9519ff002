"""Valkey clients side by side, for the worker's hot path: is a faster client worth a switch?

Each client makes the same calls against one Valkey started for the run: a round trip at a time
(INCR, and the shape of a claim: an EVALSHA with 16 arguments whose reply is 5 strings), and 32
INCRs at once from tasks or threads (what a worker's jobs do). Prints µs per call of wall time
and of this process's CPU. Clients: redis-py with hiredis (sync, as the main loop uses it),
redis.asyncio on asyncio and on uvloop (as async handlers and the loop-form wait use it), and
valkey-glide (Rust core) when installed.

    .venv/bin/pip install -r bench/requirements.txt
    .venv/bin/python bench/clients.py [--calls 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import threading
import time
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

from _common import valkey

SCRIPT = "return {KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4]}"
ARGS = [str(i) for i in range(16)]


def timed(n: int, run: Callable[[], None]) -> tuple[float, float]:
    """(wall µs, CPU µs) per call."""
    wall, cpu = time.perf_counter(), time.process_time()
    run()
    return ((time.perf_counter() - wall) / n * 1e6, (time.process_time() - cpu) / n * 1e6)


def sync_rows(url: str, n: int) -> dict[str, tuple[float, float]]:
    import redis

    client = redis.Redis.from_url(url, max_connections=64)
    sha = client.script_load(SCRIPT)

    def many() -> None:
        def part() -> None:
            for _ in range(n // 32):
                client.incr("bench:c")
        threads = [threading.Thread(target=part) for _ in range(32)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    return {"INCR, one at a time": timed(n, lambda: [client.incr("bench:c") for _ in range(n)]),
            "EVALSHA, one at a time": timed(n, lambda: [client.evalsha(sha, 1, "k", *ARGS)
                                                        for _ in range(n)]),
            "INCR, 32 at once": timed(n, many)}


async def async_rows(n: int, incr: Callable[[], Awaitable[object]],
                     evalsha: Callable[[], Awaitable[object]]) -> dict[str, tuple[float, float]]:
    async def one_at_a_time(call: Callable[[], Awaitable[object]]) -> tuple[float, float]:
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(n):
            await call()
        return ((time.perf_counter() - wall) / n * 1e6, (time.process_time() - cpu) / n * 1e6)

    async def many() -> tuple[float, float]:
        async def part() -> None:
            for _ in range(n // 32):
                await incr()
        wall, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*(part() for _ in range(32)))
        return ((time.perf_counter() - wall) / n * 1e6, (time.process_time() - cpu) / n * 1e6)

    return {"INCR, one at a time": await one_at_a_time(incr),
            "EVALSHA, one at a time": await one_at_a_time(evalsha),
            "INCR, 32 at once": await many()}


async def redis_asyncio(url: str, n: int) -> dict[str, tuple[float, float]]:
    import redis.asyncio

    client = redis.asyncio.Redis.from_url(url, max_connections=64)
    sha = await client.script_load(SCRIPT)
    rows = await async_rows(n, lambda: client.incr("bench:c"),
                            lambda: client.evalsha(sha, 1, "k", *ARGS))
    await client.aclose()
    return rows


async def glide_rows(url: str, n: int) -> dict[str, tuple[float, float]]:
    from glide import GlideClient, GlideClientConfiguration, NodeAddress

    parts = urlsplit(url)
    client = await GlideClient.create(
        GlideClientConfiguration([NodeAddress(parts.hostname or "127.0.0.1", parts.port or 6379)]))
    sha = await client.custom_command(["SCRIPT", "LOAD", SCRIPT])
    rows = await async_rows(n, lambda: client.incr("bench:c"),
                            lambda: client.custom_command(["EVALSHA", sha, "1", "k", *ARGS]))
    await client.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=20_000)
    n = parser.parse_args().calls
    results: dict[str, dict[str, tuple[float, float]]] = {}
    with valkey() as url:
        results["redis-py + hiredis (sync)"] = sync_rows(url, n)
        results["redis.asyncio on asyncio"] = asyncio.run(redis_asyncio(url, n))
        try:
            import uvloop
        except ImportError:
            pass
        else:
            results["redis.asyncio on uvloop"] = asyncio.run(redis_asyncio(url, n),
                                                            loop_factory=uvloop.new_event_loop)
        if importlib.util.find_spec("glide") is None:
            print("(valkey-glide is not installed: pip install valkey-glide)")
        else:
            results["valkey-glide (async)"] = asyncio.run(glide_rows(url, n))
    shapes = list(next(iter(results.values())))
    print(f"{n:,} calls each; µs per call, wall / this process's CPU")
    print(f"  {'client':<28}" + "".join(f"{s:>26}" for s in shapes))
    for name, rows in results.items():
        print(f"  {name:<28}" + "".join(f"{rows[s][0]:>14.1f} / {rows[s][1]:>8.1f}" for s in shapes))


if __name__ == "__main__":
    main()
