"""A queue's global cap (`global_concurrency`): at most n of its jobs active at once across every
worker, process and shard.

Shards live in different cluster slots, so no claim script can count them all. The cap lives
in a slot of its own (`keys.cap_keys`: `emq:{q#cap}`) as anonymous permits, which each holder
(one `Permits` per `Leases`: a worker's queue, or an API caller's `Queue`) takes in batches
(permits.lua: one call takes k, answering how many it got) and maps to its jobs itself. A claim
asks a shard for at most as many jobs as its holder has permits free; a finished job's permit is
kept for the next claim (no call), so a cap that does not bind costs no round trip per claim.
Permits are renewed with the leases (`Leases.extend_many`, on the heartbeat's period), given
back when a claim finds the queue drained with nothing running, and lapse on the server clock
when their holder stops renewing them (a killed worker's come back within about half a lease
after its jobs' leases end: a call holds them for 1.5 leases, or the longest job lease left).

A cap set live (`set_cap`) is kept in the cap's slot and marked on every shard's `meta` (`gcap`):
a claim passes the mark as its holder knows it, and a shard whose mark differs leases nothing
(claim.lua answers -1): the holder asks for permits again, learning the cap, and claims again.
So a queue with no cap pays nothing on its claims (the mark is one more field of a read the claim
makes anyway), a cap set live reaches every claimer at its next claim, and a lowered one takes
back the permits its holders do not run jobs on. Jobs already running when a cap is first set
live are not counted by it (they held no permit); they end as they would.

Reads and writes the cap's keys; writes the shards' `gcap` mark (`set_cap`, `copy_mark`).
"""

from __future__ import annotations

import os
import secrets
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..keys import ShardKeys, cap_keys
from ..options import QueueOptions, global_cap, validate_lease
from ..records import Lease
from .scripts import calls

LEASE_MARGIN = 1.5
"""A permits call holds them for this many of the claims' lease: the holder calls again only
once a claim's whole lease would outlast them (a claim then rarely needs a call of its own to
cover the jobs it leased), and a dead holder's come back within half a lease after its jobs'."""
_forks = [0]
"""Forks this process came through: a child's holders start afresh (the permits are the
parent's)."""
os.register_at_fork(after_in_child=lambda: _forks.__setitem__(0, _forks[0] + 1))


class Permits:
    """One holder's permits of a queue's global cap and the jobs it runs on them."""

    def __init__(self, queue: str) -> None:
        self.queue = queue
        self._lock = threading.Lock()
        self._start()

    def _start(self) -> None:
        """A holder that holds nothing yet (a new one, or a forked child's)."""
        self.holder = f"{os.getpid()}:{secrets.token_hex(4)}"
        self._born = _forks[0]
        self.mark = ""
        """The cap's live setting as last heard ('' = none set live; '0' = lifted live)."""
        self.held = 0
        self.running: dict[tuple[str, int], float] = {}
        """(job id, token) -> when its lease ends (monotonic): the jobs holding a permit."""
        self.reserved = 0
        """Permits claims in flight may lease jobs on."""
        self.overrunning = 0
        """Runs past their time limit whose threads still run: their jobs were recorded (the
        permit's lease gone with them) but each keeps its permit until its thread returns."""
        self.drained = False
        """The last claim leased fewer jobs than its permits allowed (the queue had no more for
        it, not the cap): the next renewal gives back what is free."""
        self.over = False
        """The holders hold more than a cap lowered live: every claim asks again (a finished
        job's permit goes back rather than serve the next claim) until they do not."""
        self._deadline = 0.0
        """When the server lets the held permits lapse (monotonic, counted from before the call
        that set it: never later than the server's); 0 after a call whose reply did not come."""

    def capped(self, given: int) -> bool:
        """Whether a cap is in force as the holder knows it: set live, else in the settings."""
        return self.mark not in ("", "0") or (self.mark == "" and given > 0)

    def busy(self) -> int:
        """Permits in use: by running jobs, claims in flight and overrunning threads."""
        return len(self.running) + self.reserved + self.overrunning

    def reserve(self, client: Any, want: int, given: int, lease: float) -> int | None:
        """How many of `want` jobs a claim may lease (permits taken first when too few are
        free, or when a claim's whole `lease` would outlast them), reserved until `settle`;
        None when no cap is in force (nothing is counted)."""
        if not self.capped(given):
            return None
        with self._lock:
            self._adopt()
            now = time.monotonic()
            busy = self.busy()
            if (self.held - busy < want or now + validate_lease(lease) > self._deadline
                    or self.over):
                self._drop_lapsed(now)
                busy = self.busy()
                self._sync(client, busy + want, busy, given, lease, now)
                if not self.capped(given):
                    return None
            granted = max(min(want, self.held - busy), 0)
            self.reserved += granted
            return granted

    def settle(self, client: Any, given: int, reserved: int, leases: Sequence[Lease],
               short: bool, lease: float) -> None:
        """A claim that reserved `reserved` permits leased `leases`: each holds one until it
        ends. `short`: it leased fewer than `reserved` (the queue had no more). A lease that ends after the
        held permits would lapse (a job's own longer lease, a claim's slow trip) renews them
        first: one call, for as long as the longest lease left."""
        with self._lock:
            self.reserved -= reserved
            now = time.monotonic()
            for held in leases:
                self.running[held.job_id, held.token] = now + held.lease
            self.drained = short
            if any(self.running[held.job_id, held.token] > self._deadline for held in leases):
                self._sync(client, max(self.held, self.busy()), self.busy(), given, lease, now)

    def ended(self, leases: Iterable[Lease]) -> None:
        """Jobs whose outcome was recorded (or handed back): their permits are free again."""
        with self._lock:
            for lease in leases:
                self.running.pop((lease.job_id, lease.token), None)

    def overran(self, lease: Lease) -> bool:
        """A run past its time limit is about to be recorded while its thread still runs: its
        permit stays in use (`returned` frees it). Whether it held one."""
        with self._lock:
            if self.running.pop((lease.job_id, lease.token), None) is None:
                return False
            self.overrunning += 1
            return True

    def returned(self) -> None:
        """An overrunning thread returned: its permit is free again."""
        with self._lock:
            self.overrunning = max(self.overrunning - 1, 0)

    def renewed(self, client: Any, leases: Iterable[Lease], seconds: float, given: int) -> None:
        """Leases were renewed for `seconds`: so are their jobs' permits; and the holder's
        permits, once they would lapse before a lease of `seconds` from now ends (what is free
        goes back when the last claim found the queue drained)."""
        with self._lock:
            self._adopt()
            now = time.monotonic()
            for lease in leases:
                key = (lease.job_id, lease.token)
                if key in self.running:
                    self.running[key] = now + seconds
            if self.held and now + validate_lease(seconds) > self._deadline:
                busy = self.busy()
                self._sync(client, busy if self.drained else self.held, busy, given, seconds, now)

    def give_back(self, client: Any, given: int) -> None:
        """Give back the permits no job or claim uses (the queue is drained): one call, only
        when some are held."""
        with self._lock:
            self._adopt()
            busy = self.busy()
            if self.held > busy:
                self._sync(client, busy, busy, given, 0.0, time.monotonic())

    def resync(self, client: Any, given: int, lease: float) -> None:
        """The cap changed live (a claim said so): hear it, keeping only what runs jobs or
        claims in flight."""
        with self._lock:
            self._adopt()
            busy = self.busy()
            self._sync(client, busy, busy, given, lease, time.monotonic())

    def _sync(self, client: Any, want: int, floor: int, given: int, lease: float,
              now: float) -> None:
        """One permits call: hold `want` from now on, for `LEASE_MARGIN` times `lease` or the
        longest of the running jobs' leases left, whichever is longer. Until its answer comes
        the holder counts on no more than `floor` (what is in use) and on no deadline: a call
        whose reply is lost (it may have given permits back) leaves the next claim to call
        again."""
        hold = max([LEASE_MARGIN * validate_lease(lease) if lease else 0.0, 1.0,
                    *(end - now for end in self.running.values())])
        self._deadline = 0.0
        self.held = min(self.held, floor)
        answer = calls.permits(client, cap_keys(self.queue), self.holder, want, floor,
                               round(hold * 1000), given)
        self.held, self.mark, self.over = answer.held, answer.live, answer.over
        self._deadline = now + hold

    def _adopt(self) -> None:
        """In a forked child, start afresh: the parent's permits are not the child's."""
        if self._born != _forks[0]:
            self._start()

    def _drop_lapsed(self, now: float) -> None:
        """Forget jobs whose lease ended unrenewed (an API caller that never acked them)."""
        lapsed = [key for key, end in self.running.items() if end < now]
        for key in lapsed:
            del self.running[key]


@dataclass(frozen=True)
class CapState:
    """A queue's global cap as the console and the metrics show it."""

    cap: int | None
    """The cap in force (None: none)."""
    live: bool
    """Whether it was set live (`set_cap`), not by the settings."""
    held: int
    """Permits held now (lapsed holders' not counted)."""


def set_cap(client: Any, queue: str, shards: int, cap: int | None) -> None:
    """Set the queue's global cap live (None lifts it, whatever the settings say): the cap's
    key first, then the mark on each of `shards`, so a claim that sees the new mark hears the
    new cap."""
    value = "0" if cap is None else str(global_cap(cap, "the global cap"))
    client.set(cap_keys(queue).key("limit"), value)
    mark_shards(client, queue, shards, value)


def clear_cap(client: Any, queue: str, shards: int) -> None:
    """Drop the cap set live (the settings' cap holds again): its key, then each shard's mark."""
    client.delete(cap_keys(queue).key("limit"))
    mark_shards(client, queue, shards, "")


def mark_shards(client: Any, queue: str, shards: int, value: str) -> None:
    """Mark `shards` with the cap's live setting `value` ('': none, the mark goes): `set_cap`'s,
    and a claimer's repair of marks that differ from the cap's key (a `set_cap` cut short
    between its writes, a key lost) once the key has told it the setting."""
    with client.pipeline(transaction=False) as pipe:
        for index in range(shards):
            meta = ShardKeys(queue, index).key("meta")
            if value:
                pipe.hset(meta, "gcap", value)
            else:
                pipe.hdel(meta, "gcap")
        pipe.execute()


def copy_mark(client: Any, queue: str, shards: int) -> None:
    """Give shards 1…shards-1 the cap's live mark (a resize, or a raised `shards` setting,
    added shards)."""
    value = client.get(cap_keys(queue).key("limit"))
    if value is None:
        return
    for index in range(1, shards):
        client.hset(ShardKeys(queue, index).key("meta"), "gcap", value)


def state(client: Any, queue: str, options: QueueOptions) -> CapState:
    """The cap in force and the permits held now (holders whose deadline passed on the server's
    clock not counted); one read when no cap is in force."""
    keys = cap_keys(queue)
    live = client.get(keys.key("limit"))
    cap = options.global_concurrency if live is None else int(live) or None
    if cap is None:
        return CapState(None, live is not None, 0)
    seconds, micros = client.time()
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    holders = client.zrangebyscore(keys.key("holders"), now_ms, "+inf")
    held = sum(int(n or 0) for n in client.hmget(keys.key("permits"), holders)) if holders else 0
    return CapState(cap, live is not None, held)
