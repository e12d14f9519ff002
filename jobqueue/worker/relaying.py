"""The worker's relay of what its recorded outcomes forwarded (flows' "member done" for jobs on
other shards or queues: `flows/relay.py`), on a thread of its own.

The main loop records outcomes; an ack or nack whose answer says it forwarded names its shard
here (`after`), and the relay thread delivers that shard's `:outcomes` entries right away. The
main loop does not wait for the three calls a relay makes (read, deliver, delete): it claims
on. While a relay runs, the shards named meanwhile gather, and the next pass reads each once:
a worker whose long jobs end one by one relays while it claims on. The outcomes of a worker
that holds no job but those its call acked are relayed at once on the caller's thread instead
(a claim's new jobs are not counted: they are handed to the runners after it): so a fan-out of
short jobs, whose every claim acks all the worker held, relays inline at each claim, and its
last members' relay, which the dependent's start waits for, never waits for a pass in flight
nor for the thread's turn (bench/RESULTS.md, 2026-12-05: handing those relays to the thread ran
the fan-out faster but started the dependent later). A pass in flight may deliver some entries
an inline relay delivers too: a delivery is idempotent.
Before its thread starts (a test that drives the worker's turns itself), and once it stopped,
a shard is relayed on the caller's thread, as before.

Nothing is lost with the thread: the entries are in Valkey from the ack on, the relay is
idempotent, and a pass that fails, or a worker killed before it, leaves them to the next
maintenance turn of any worker of the queue (`relay_queue`). A stopping worker's thread ends
only after it relayed what its last outcomes forwarded (the worker records them before it
stops its threads).

Owns the set of shards to relay and its lock; calls `relay.after_shards`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from ..flows import relay
from ..records import Lease

IDLE_CHECK = 0.5
"""Seconds the relay thread waits between looks at the stop event when nothing is due (the
worker wakes it as it stops: `wake`)."""
Shard = tuple[str, int]


class Relayer:
    """Relays the shards an outcome forwarded from, off the main loop (see the docstring)."""

    def __init__(self, queues: relay.Queues, stop: threading.Event) -> None:
        self._queues, self._stop = queues, stop
        self._lock = threading.Lock()
        self._due: set[Shard] = set()
        self._wake = threading.Event()
        self._running = False

    @property
    def running(self) -> bool:
        """Whether its thread runs (else `after` relays on the caller's thread)."""
        return self._running

    def after(self, leases: Iterable[Lease], now: bool = False) -> None:
        """Relay the shards of `leases` (their outcomes forwarded entries): on the thread
        when it runs, else (or `now`) here and now."""
        shards = {(lease.queue, lease.shard) for lease in leases}
        with self._lock:
            if self._running and not now:
                self._due |= shards
                self._wake.set()
                return
        relay.after_shards(self._queues, shards)

    def wake(self) -> None:
        """Have the thread look now (the worker stops its threads)."""
        self._wake.set()

    def run(self) -> None:
        """The relay thread: until the worker stops its threads, and what was due then."""
        with self._lock:
            self._running = True
        try:
            while True:
                self._wake.wait(IDLE_CHECK)
                self._wake.clear()
                with self._lock:
                    shards, self._due = self._due, set()
                    if not shards and self._stop.is_set():
                        self._running = False  # (later ones are relayed by their callers)
                        return
                if shards:
                    relay.after_shards(self._queues, shards)
        finally:  # (a death leaves what was due to the maintenance turns: it is in Valkey)
            with self._lock:
                self._running = False
