"""The worker's database side, apart from claiming so a slow or absent database never slows it:
it mirrors terminal events into MySQL, resends durable jobs whose push failed, refreshes the
`Shard` rows, and on the way out mirrors what is left.

`runworker` runs it in a process of its own (`MirrorProcess`), forked before the worker starts
its threads: a mirror step spends milliseconds of Python building rows, and in the worker's
process it would hold the GIL meanwhile, so every reply the worker waited for would wait for it
too. A `Worker` made in code, or one whose process runs another thread already (a fork could
copy a lock that thread holds), runs it in a thread (`MirrorThread`).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from django.db import DatabaseError, connections
from redis.exceptions import RedisError

from .. import collector
from ..conf import rediscover
from ..engine.layouts import known_queues
from ..engine.store import Queue
from ..exceptions import VALKEY_DOWN
from ..history import outbox
from ..history.mirror import Mirror, record_shards
from .serving import WorkerConfig
from .supervisor import Forked, fork, forkable

log = logging.getLogger("jobqueue.worker")
PASSED = signal.SIGUSR1
"""The mirror's thread to its process's main thread (a signal it waits for with the stop
signals): the final pass is over."""
RESEND_EVERY = 2.0
SHARDS_EVERY = 10.0
RECYCLE_EVERY = 60.0
"""Seconds between checks of the thread's database connection against CONN_MAX_AGE (it stays
open between passes: a new MySQL connection per pass would cost more than an idle pass), and
between rewrites of `Shard` rows that did not change (an operator may have edited them)."""


def close_db() -> None:
    """Drop this thread's database connection (broken, or the server went away)."""
    from django.db import connection

    try:
        connection.close()
    except DatabaseError:  # the connection is already broken
        log.debug("closing a broken database connection failed", exc_info=True)


class MirrorThread:
    """Mirror, resend and shard bookkeeping for the queues `queues()` names, until `stop`."""

    def __init__(self, queues: Callable[[], list[Queue]], consumer: str,
                 stop: threading.Event) -> None:
        self.queues = queues
        self.mirror = Mirror(queues(), consumer=consumer)
        self.stop = stop

    def run(self) -> None:
        from django.db import close_old_connections

        delay, next_shards, next_resend, next_recycle = 0.2, 0.0, 0.0, 0.0
        shards_written: dict[tuple[str, int], dict[str, Any]] = {}
        while not self.stop.is_set():
            try:
                if time.monotonic() >= next_recycle:
                    close_old_connections()
                    shards_written.clear()
                    next_recycle = time.monotonic() + RECYCLE_EVERY
                self.mirror.queues = self.queues()
                written = self.mirror.step()
                if time.monotonic() >= next_resend:  # durable jobs whose push failed
                    outbox.resend(self.mirror.queues)
                    next_resend = time.monotonic() + RESEND_EVERY
                if time.monotonic() >= next_shards:
                    for queue in self.mirror.queues:
                        record_shards(queue, shards_written)
                    next_shards = time.monotonic() + SHARDS_EVERY
                # Idle, it looks less and less often (up to once a second): a worker with no
                # jobs then costs little, and the first finished job is mirrored within a second.
                delay = 0.05 if written else min(max(delay, 0.1) * 2, 1.0)
            except VALKEY_DOWN:
                self._rediscover()
                delay = 1.0
            except RedisError as exc:  # e.g. NOGROUP after Valkey lost its data: recreate groups
                log.warning("mirror: %s; retrying", exc)
                self.mirror.forget_groups()
                delay = 1.0
            except DatabaseError as exc:  # the database is down or refused the batch: retry later
                log.warning("mirror: %s; the events wait in Valkey", exc)
                close_db()
                delay = min(max(delay * 2, 0.5), 5.0)
            self.stop.wait(delay)

    def _rediscover(self) -> None:
        """After a connection error: on a cluster, read the slot map again (the mirror's reads
        go to nodes directly, and in a process of its own no worker refreshes it meanwhile)."""
        with contextlib.suppress(RedisError):
            for client in {id(q.client): q.client for q in self.mirror.queues}.values():
                rediscover(client)

    def final_pass(self, insist: bool, abort: threading.Event, limit: float = 30.0) -> bool:
        """Mirror what is left. Insisting (a burst run), take over dead mirrors' entries too and
        go on until the streams are empty, `abort`, or `limit` seconds pass (a database that
        refuses every row, say never migrated, must not hold the exit forever); else try three
        times and leave the rest in Valkey for the next worker. False when it gave up insisting
        (the burst's exit code says so)."""
        self.mirror.queues = self.queues()
        delay, tries, ends, failure = 0.2, 0, time.monotonic() + limit, ""
        while not abort.is_set():
            try:
                self.mirror.step(take_over_all=insist)
                if self.mirror.backlog() == 0:
                    return True
            except (DatabaseError, *VALKEY_DOWN) as exc:
                failure = str(exc)
                log.warning("mirror (final pass %d): %s; retrying", tries + 1, exc)
                close_db()
                self._rediscover()
            tries += 1
            if not insist and tries >= 3:
                return True
            if insist and time.monotonic() + delay > ends:
                log.error("mirror gave up after %.0f s (--grace): %s; %s wait in Valkey for the "
                          "next worker's mirror", limit, failure or "entries still pending",
                          self._left())
                return False
            abort.wait(delay)
            delay = min(delay * 2, 5.0)
        return not insist

    def _left(self) -> str:
        """How many events the streams still hold, for a message."""
        try:
            return f"{self.mirror.backlog()} event(s)"
        except (RedisError, *VALKEY_DOWN):
            return "its events"


class MirrorProcess:
    """The mirror of `runworker`'s worker in a process of its own (see the module's docstring).
    It mirrors until the worker has stopped (`finish`), then makes its final pass: insisting in
    a burst run, cut short when the worker is told to stop a second time (`abort`)."""

    def __init__(self, proc: Forked) -> None:
        self.proc = proc

    @classmethod
    def start(cls, config: WorkerConfig) -> MirrorProcess | None:
        """Fork the mirror of the worker `config` describes; None when another thread runs here
        (the worker then mirrors in a thread)."""
        if not forkable():
            return None
        connections.close_all()  # (the mirror opens its own)
        return cls(fork(partial(_serve, config)))

    def finish(self, abort: bool) -> bool:
        """The worker has stopped: let the mirror make its final pass (`abort`: cut it short)
        and wait for it to exit. False when it did not end well (a burst's final pass gave up)."""
        self.proc.send_signal(signal.SIGTERM)
        if abort:
            self.abort()
        if self.proc.wait():
            log.warning("mirror process exited with code %d", self.proc.returncode)
            return False
        return True

    def abort(self) -> None:
        """Cut the final pass short (the worker was told to stop a second time)."""
        self.proc.send_signal(signal.SIGINT)


def _serve(config: WorkerConfig) -> int:
    """In the mirror's process: mirror until the first stop signal, then make the final pass
    until it ends or a second signal comes. Signals are taken by `sigwait` on this thread, so
    no handler runs while the mirror's thread holds a lock. The mirror's thread says when it
    is done (PASSED), so the process exits then: its worker waits for that exit before its own,
    and a recycled worker's supervisor for the worker's."""
    collector.settle()  # (forked before the worker settled it)
    stops = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, {*stops, PASSED})  # (its thread inherits the mask)
    stop, abort = threading.Event(), threading.Event()
    mirror = MirrorThread(_served(config), config.name, stop)
    waiting = threading.get_ident()  # (the thread that waits for the signals: PASSED is for it)
    passed = [False]

    def work() -> None:
        try:
            mirror.run()
            passed[0] = mirror.final_pass(insist=config.burst, abort=abort, limit=config.grace)
        finally:
            signal.pthread_kill(waiting, PASSED)

    thread = threading.Thread(target=work, name="jobqueue-mirror", daemon=True)
    thread.start()
    signal.sigwait(stops)
    stop.set()
    while thread.is_alive():
        got = signal.sigtimedwait({*stops, PASSED}, 1.0)
        if got is not None and got.si_signo == PASSED:
            thread.join(0.1)  # (on its way out; a hint only: the loop looks again)
        elif got is not None:
            abort.set()
    return 0 if passed[0] or abort.is_set() else 1


def _served(config: WorkerConfig) -> Callable[[], list[Queue]]:
    """The queues the worker serves, as the worker finds them (its `queues`, else every known
    one), read again at most once a second; while Valkey is down or refuses (a cluster failing
    over), the last ones read."""
    kept: list[Queue] = []
    next_read = 0.0

    def queues() -> list[Queue]:
        nonlocal kept, next_read
        if time.monotonic() >= next_read:
            try:
                names = list(config.queues or known_queues())
            except RedisError:  # (down, or a cluster failing over: the mirror carries on)
                return kept
            if names != [queue.name for queue in kept]:
                kept = [Queue(name) for name in names]
            next_read = time.monotonic() + 1.0
        return kept

    return queues
