"""jobqueue's side of bench/peers.py: the same no-op job every peer runs."""

import time

from peer_tasks import counter

from jobqueue import job


@job
def tick() -> None:
    counter().incr("bench:done")


@job
def stamp(sent: float) -> None:
    """For the latency run: how long from enqueue to start."""
    counter().rpush("bench:latency", time.time() - sent)


@job
def noop() -> None:
    """For the soak: nothing at all."""
