"""The worker's waits on its shards: kept connections, idle offers, hand-offs, unblocking.

One waiter thread per shard (started by `core.py`) blocks on the shard's `wake` list while the
worker has room, so an idle worker sleeps in BLPOP instead of polling. An idle worker first
offers itself for hand-offs (`handoff.wait_commands`): an enqueue that finds nothing else ready on
the shard leases the job to it and pushes it onto the worker's own list, which the same BLPOP
watches, so the job arrives leased, with no claim call between. Once the worker has an event
loop (it ran an `async def` handler), that wait runs on the loop (`waitline.py`), so an async
job starts on the thread that received it. A busy worker waits without an offer (a job handed
over then would wait for room): when it falls busy, the offers of its waits on other shards go
and those waits end (`withdraw_offers`, once the jobs that made it busy are on its runners);
when it falls idle, the main loop ends its waits without an offer (`unblock`) so the next wait
makes the offer. A wait with an offer whose reply was lost hands back, before the next wait, the
job handed over in it (`handoff.recover`: by the offer's id). A queue whose limits only the
claim script enforces (a `concurrency` cap, a rate, lane caps or lane rates:
`QueueOptions.claim_only`) never offers.
On a cluster the kept connection is to the node that holds the shard, found again after an
error (a failover moves the shard); a burst run waits the plain way (1 s BLPOPs on the client).
On a kept connection a wait lasts up to IDLE_WAIT.

Owns the waits' connections, the offers and the list of waits in progress (so that another
thread can end them with CLIENT UNBLOCK). A wait says what ended it (`Woke`). A job handed over
goes to the `take` it was given, on the thread that received it; after a token the waiter calls
the `claim` it was given (both `claims.py`'s). It reads the held jobs (is the worker idle?) and
the event loop, and calls `handoff`'s `wait_commands`, `after_wait` and `withdraw`; it records
nothing.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import Enum
from typing import Any

from redis.cluster import RedisCluster
from redis.exceptions import ConnectionError as ValkeyConnectionError
from redis.exceptions import NoPermissionError, RedisError, ResponseError

from ..engine import handoff, wire
from ..engine.claims import new_claim_id
from ..engine.store import READ_SLACK, Queue
from ..keys import ShardKeys
from ..records import Lease
from .runners import EventLoop
from .serving import HeldJobs, WorkerConfig
from .waitline import WaitLine

log = logging.getLogger("jobqueue.worker")
IDLE_WAIT = 5
"""Seconds a waiter blocks on its kept connection (and an idle worker's offer lasts): an enqueue's
token or hand-off ends the wait at once, and the worker unblocks it when it stops (or falls
idle, for a wait without an offer). The main loop's claims each maintenance turn catch anything
a token did not announce."""
BURST_WAIT = 0.2
"""Seconds a burst run's plain wait blocks: nothing can end it early, and the run's end waits
for it."""
Take = Callable[[Queue, list[Lease]], None]
Waits = dict[tuple[str, int], tuple[Any, int]]


class Woke(Enum):
    """What ended a wait."""

    TOKEN = "token"
    """A wake token: there is work on the shard, and the waiter claims it."""
    HANDED = "handed"
    """A job handed over to the idle worker, arriving leased: given to `take` already."""
    TIMEOUT = "timeout"
    """Nothing: the wait ran out, or was unblocked."""


@dataclass
class Lines:
    """One shard's waiter: its own connections and offers."""

    queue: Queue
    index: int
    plain: bool
    """A burst run: plain BLPOPs on the client, nothing kept."""
    hand_off: bool = True
    """Whether the worker, idle, offers itself for hand-offs (not for a queue whose limits only
    the claim script enforces: `QueueOptions.claim_only`)."""
    offered: bool = False
    """Whether it ever did (it withdraws the offer when it stops)."""
    node: Any = None
    """The client of the server holding the shard (the standalone client itself, or a cluster
    node's), found at the first wait and again after an error (a failover moves a shard)."""
    conn: Any = None
    """A connection of `node`'s, kept for the waits."""
    conn_id: int | None = None
    """Its id on the server, once asked (a wait registers it, to be unblocked)."""
    line: WaitLine | bool | None = None
    """Its connection for the waits on the event loop, once opened; False when there can be
    none."""
    offer_id: str = ""
    """The id of the offer its wait in progress made, until the wait's reply arrives."""
    lost_offer: str = ""
    """An offer whose wait's reply was lost: a job handed over then (leased to the worker,
    maybe taken off its list by the lost BLPOP) goes back before the next wait
    (`handoff.recover`)."""


class Waiters:
    """The waits of one worker on its shards (see the module's docstring)."""

    def __init__(self, config: WorkerConfig, held: HeldJobs, *, stop_claiming: threading.Event,
                 threads_stop: threading.Event, take: Take, claim: Callable[[Queue, int], object],
                 loop: Callable[[], EventLoop | None], spent: threading.Event | None = None) -> None:
        """Either stop event set ends the waits; `take` runs (or, stopping, hands back) jobs
        handed over; `claim` claims from a shard after its token; `loop` is the worker's event
        loop, once it has one; `spent` set: the worker will claim nothing more (`--max-jobs`),
        so its waiters wait for no token (it would be lost to the other workers)."""
        self._config, self._held = config, held
        self._spent = spent or threading.Event()
        self._stop_claiming, self._threads_stop = stop_claiming, threads_stop
        self._take, self._claim, self._loop = take, claim, loop
        self._started: set[tuple[str, int]] = set()
        self._plain_waits: Waits = {}
        """Waiters blocked without an offer (queue, shard -> the client of the server they wait
        on, and their connection's id there)."""
        self._quiet_waits: Waits = {}
        """Waiters of queues that never offer, blocked on a kept connection (only a token or a
        stop ends their wait early)."""
        self._offered_waits: Waits = {}
        """Waiters blocked with an offer (the worker, busy, ends them: `withdraw_offers`)."""
        self._lock = threading.Lock()
        self._refused_said = False
        """Whether the worker said that the server takes no offer (see `_past_offer`)."""

    def missing(self, queues: list[Queue], shards: dict[str, int]) -> list[tuple[Queue, int]]:
        """The shards that have no waiter yet, counted as having one from now on."""
        new = [(queue, index) for queue in queues for index in range(shards[queue.name])
               if (queue.name, index) not in self._started]
        self._started.update((queue.name, index) for queue, index in new)
        return new

    def serve(self, queue: Queue, index: int) -> None:
        """A waiter's thread: wait on one shard while there is room, claim after a token, and
        when the worker stops, withdraw the offer (the jobs handed over meanwhile go to `take`,
        which hands them back)."""
        lines = Lines(queue, index, self._config.burst,
                      hand_off=not queue.options.claim_only)
        try:
            while not (self._stop_claiming.is_set() or self._threads_stop.is_set()):
                if not self._held.room.wait(0.5):
                    continue
                if self._spent.is_set():
                    self._threads_stop.wait(0.5)  # (until the worker, due, stops)
                    continue
                try:
                    if lines.lost_offer:
                        self._recover(lines)
                    woke = self.wait(lines)
                except RedisError as exc:
                    log.debug("wait on %s shard %d: %r", queue.name, index, exc)
                    lines.lost_offer = lines.lost_offer or lines.offer_id
                    lines.offer_id = ""
                    self.drop(lines)  # (taken anew: on a cluster, maybe on another node)
                    self._threads_stop.wait(1.0)
                    continue
                if woke is Woke.TOKEN:
                    self._claim_after_token(queue, index)
        finally:
            self._withdraw(lines)
            self.drop(lines)

    def _recover(self, lines: Lines) -> None:
        """Hand back what an offer whose wait's reply was lost brought (see `Lines`)."""
        queue = lines.queue
        back = handoff.recover(queue.client, queue.shard(lines.index), self._config.name,
                               lines.lost_offer)
        lines.lost_offer = ""
        if back:
            log.info("queue=%s shard %d: a job handed over in a wait whose reply was lost went "
                     "back uncharged", queue.name, lines.index)

    def _claim_after_token(self, queue: Queue, index: int) -> None:
        """Claim from a shard whose token arrived. A claim that fails gave back the outcomes it
        carried; the main loop's next turn claims again (a token is only a hint)."""
        try:
            self._claim(queue, index)
        except RedisError as exc:
            log.warning("claim on %s shard %d after a wake token failed: %s", queue.name, index,
                        exc)
            self._threads_stop.wait(1.0)

    @property
    def plain_waiting(self) -> bool:
        """Whether a waiter is blocked without an offer (the worker, idle, would end it)."""
        return bool(self._plain_waits)

    def wait(self, lines: Lines) -> Woke:
        """One wait on a shard, in the form the module's docstring says."""
        queue, index = lines.queue, lines.index
        if lines.plain:
            got = queue.client.blpop([queue.shard(index).key("wake")], timeout=BURST_WAIT)
            return Woke.TOKEN if got else Woke.TIMEOUT
        if lines.conn is None:
            lines.node = _node(queue, index)
            lines.conn = lines.node.connection_pool.get_connection()
        if lines.conn_id is None:
            lines.conn_id = wire.call_on(lines.conn, [("CLIENT", "ID")])[0]
        idle = lines.hand_off and self._held.idle  # (not while every thread overruns)
        lease = self._config.lease
        lines.offer_id = new_claim_id() if idle else ""
        offer = (handoff.offer(queue.lease_ms(lease), lease is not None, lines.offer_id)
                 if idle else None)
        commands = handoff.wait_commands(queue.shard(index), IDLE_WAIT, self._config.name, offer)
        lines.offered = lines.offered or idle
        loop = self._loop()
        if idle and loop is not None and lines.line is None:
            lines.line = loop.run(_open_line(lines.node)) or False
        if idle and loop is not None and isinstance(lines.line, WaitLine):
            return loop.run(self._wait_on_loop(lines, commands))
        waits = (self._offered_waits if idle else self._plain_waits if lines.hand_off
                 else self._quiet_waits)
        with _registered(waits, (queue.name, index), (lines.node, lines.conn_id)):
            replies = wire.call_on(lines.conn, commands, IDLE_WAIT + READ_SLACK)
        return self._arrived(lines, replies, offered=idle)

    async def _wait_on_loop(self, lines: Lines, commands: list[tuple[Any, ...]]) -> Woke:
        """The idle form's wait, on the worker's event loop: the replies are read as they
        arrive and an async job handed over starts right there, without a hand-over from the
        waiter's thread."""
        def took(replies: list[Any]) -> Woke:
            return self._arrived(lines, replies, offered=True)

        line = lines.line
        assert isinstance(line, WaitLine)
        where = (lines.queue.name, lines.index)
        with _registered(self._offered_waits, where, (lines.node, line.id)):
            return await line.call(commands, took, IDLE_WAIT + READ_SLACK)

    def _arrived(self, lines: Lines, replies: list[Any], *, offered: bool) -> Woke:
        """What a wait's replies brought (`handoff.after_wait`); a job handed over is taken here.
        `offered`: the wait began with an offer, whose reply comes first (the wait is over: it
        is no offer `withdraw_offers` should end)."""
        self._offered_waits.pop((lines.queue.name, lines.index), None)
        lines.offer_id = ""  # (its reply arrived: nothing handed over was lost)
        got = handoff.after_wait(lines.queue.shard(lines.index),
                                 self._past_offer(lines, replies) if offered else replies)
        if isinstance(got, list):
            self._take(lines.queue, got)
            return Woke.HANDED
        return Woke.TOKEN if got else Woke.TIMEOUT

    def _past_offer(self, lines: Lines, replies: list[Any]) -> list[Any]:
        """An idle wait's replies after its offer's. A server that refuses the offer for good
        (no HSETEX before Valkey 9 and Redis 8, or an ACL that denies it) ends the waiter's
        offers: it waits for tokens from then on, as a capped queue's waiter does. A refusal
        that passes (full, read-only after a failover, busy) costs only this wait's offer."""
        refused, *rest = replies
        if isinstance(refused, ResponseError) and _for_good(refused):
            lines.hand_off = False
            with self._lock:
                said, self._refused_said = self._refused_said, True
            if not said:
                log.warning("queue %s: the server takes no offer (%s): idle workers wait for "
                            "wake tokens and claim, instead of taking jobs handed over",
                            lines.queue.name, refused)
        return rest

    def drop(self, lines: Lines) -> None:
        """Give a waiter's connections back (after an error: taken anew at the next wait)."""
        if lines.conn is not None:
            lines.node.connection_pool.release(lines.conn)
        lines.conn, lines.conn_id = None, None
        line, loop = lines.line, self._loop()
        if isinstance(line, WaitLine):
            lines.line = None
            if loop is not None:
                with contextlib.suppress(RuntimeError):  # (the loop closed already)
                    loop.call_soon(line.close)

    def _withdraw(self, lines: Lines) -> None:
        """A stopping waiter's offer withdrawn; the jobs handed to it meanwhile go back."""
        if not lines.offered:
            return
        try:
            queue = lines.queue
            if lines.lost_offer:
                self._recover(lines)
            self._take(queue, handoff.withdraw(queue.client, queue.shard(lines.index),
                                               self._config.name))
        except RedisError:
            log.warning("could not withdraw the idle offer on %s: a job handed over meanwhile "
                        "waits for its lease to expire", lines.queue.name)

    def withdraw_offers(self) -> None:
        """The worker is busy now: the offers of its idle waits go (each shard's own `idle`
        field, on the node that holds it), and those waits end, to wait again without one. An
        enqueue would otherwise hand it a job on each of those shards until the waits end (up
        to IDLE_WAIT), however little room it has. A job handed over meanwhile stays on the
        worker's list for the next wait (or `_withdraw`) to take."""
        by_node: dict[Any, list[tuple[str, int]]] = defaultdict(list)
        for (name, index), (node, conn_id) in list(self._offered_waits.items()):
            by_node[node].append((ShardKeys(name, index).key("idle"), conn_id))
        for node, waits in by_node.items():
            try:
                with node.pipeline(transaction=False) as pipe:
                    for idle, conn_id in waits:
                        pipe.hdel(idle, self._config.name)
                        pipe.client_unblock(conn_id)
                    pipe.execute()
            except RedisError as exc:  # (the offers end with their waits, IDLE_WAIT at most)
                log.debug("could not withdraw idle offers: %r", exc)

    def unblock(self, every: bool = False) -> None:
        """The worker fell idle: end its waiters' plain waits, so that they wait with an offer;
        `every`: it stops, end every wait. An unblocked BLPOP returns as if it timed out."""
        by_node: dict[Any, list[int]] = defaultdict(list)
        for node, conn_id in [*self._plain_waits.values(),
                              *(self._quiet_waits.values() if every else ()),
                              *(self._offered_waits.values() if every else ())]:
            by_node[node].append(conn_id)
        for node, ids in by_node.items():
            with node.pipeline(transaction=False) as pipe:
                for conn_id in ids:
                    pipe.client_unblock(conn_id)
                pipe.execute()


def _for_good(refusal: ResponseError) -> bool:
    """Whether the server will refuse the offer every time: it lacks the command, or an ACL
    denies it."""
    return isinstance(refusal, NoPermissionError) or "unknown command" in str(refusal).lower()


def _node(queue: Queue, index: int) -> Any:
    """The client of the server that holds a shard: a cluster node's, or the client."""
    client = queue.client
    if not isinstance(client, RedisCluster):
        return client
    node = client.get_node_from_key(queue.shard(index).key("wake"))
    if node is None:
        raise ValkeyConnectionError(f"no cluster node serves {queue.name}'s shard {index}")
    return client.get_redis_connection(node)


@contextlib.contextmanager
def _registered(waits: Waits, where: tuple[str, int], conn: tuple[Any, int]) -> Iterator[None]:
    """A wait in progress, listed so that another thread can unblock it."""
    waits[where] = conn
    try:
        yield
    finally:
        waits.pop(where, None)


async def _open_line(node: Any) -> WaitLine | None:
    twin = wire.async_twin(node)
    return None if twin is None else await WaitLine.open(twin)
