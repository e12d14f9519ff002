"""jobqueue's side of bench/peers.py: the same no-op job every peer runs."""

from peer_tasks import counter

from jobqueue import job


@job
def tick() -> None:
    counter().incr("bench:done")
