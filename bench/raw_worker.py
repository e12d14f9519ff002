"""The raw floor of bench/peers.py: BRPOP a list and run the no-op job, no queue semantics
(no lease, no retry, no history). `python raw_worker.py` runs until SIGTERM."""

from __future__ import annotations

import signal
import sys
import time

import redis
from peer_tasks import URL, tick

client = redis.Redis.from_url(URL)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
while True:
    item = client.brpop(["raw"], timeout=1)
    if item and item[1] != b"x":
        client.rpush("bench:latency:raw", time.time() - float(item[1]))  # enqueued at (latency runs)
    if item:
        tick()
