"""BullMQ for Python (the `bullmq` package: BullMQ's Lua driven from asyncio) in bench/peers.py.

Runs in a venv of its own (it pins its own redis-py; jobqueue's venv need not agree):

    python3.12 -m venv bench/.venv-bullmq && bench/.venv-bullmq/bin/pip install bullmq

`python bullmq_py.py enqueue N [single]` prints {"seconds": …}; `python bullmq_py.py work
CONCURRENCY` runs a worker until SIGTERM whose job INCRs `bench:done` with redis.asyncio, as
every peer's job does.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time

import redis.asyncio
from bullmq import Queue, Worker

URL = os.environ.get("BENCH_URL", "redis://127.0.0.1:6399/0")
OPTS = {"removeOnComplete": True}


async def enqueue(n: int, single: bool) -> None:
    queue = Queue("bench", {"connection": URL})
    started = time.perf_counter()
    if single:
        for _ in range(n):
            await queue.add("tick", {}, OPTS)
    else:
        for start in range(0, n, 1000):
            await queue.addBulk([{"name": "tick", "data": {}, "opts": OPTS}
                                 for _ in range(min(1000, n - start))])
    seconds = time.perf_counter() - started
    await queue.close()
    print(json.dumps({"seconds": seconds}))


async def work(concurrency: int) -> None:
    counter = redis.asyncio.Redis.from_url(URL)

    async def tick(job: object, token: str) -> None:
        await counter.incr("bench:done")

    worker = Worker("bench", tick, {"connection": URL, "concurrency": concurrency})
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await worker.close()


if __name__ == "__main__":
    if sys.argv[1] == "enqueue":
        asyncio.run(enqueue(int(sys.argv[2]), sys.argv[3:] == ["single"]))
    else:
        asyncio.run(work(int(sys.argv[2])))
