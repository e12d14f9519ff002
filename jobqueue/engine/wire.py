"""Script calls on a standalone client, the short way: connections borrowed from its pool.

redis-py's pool and `execute_command` spend as much client time a call (locks, telemetry, a
readiness poll, retry wrappers, packing each argument in Python) as the rest of an enqueue's
Python (bench/RESULTS.md). Here a client's script calls take connections from its pool once and then
pass them among themselves (a list's pop and append are atomic), and hiredis packs the command.
At most a quarter of the pool's connections (and no more than 8) are borrowed, so other commands
always find one; calls beyond that take the usual path. The connections stay the pool's: its
disconnect closes them too, and they reconnect on their next command. A forked child starts
with none.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any
from weakref import WeakKeyDictionary

from redis.exceptions import ConnectionError as ValkeyConnectionError
from redis.exceptions import ResponseError

from .. import _compat

PACK: Callable[[tuple[Any, ...]], bytes] | None
try:
    from hiredis import pack_command as PACK
except ImportError:  # hiredis is optional: redis-py packs commands itself then
    PACK = None


class _Borrowed:
    """The connections borrowed from one pool, in one process."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.idle: list[Any] = []
        self.room = min(8, _compat.pool_limit(pool) // 4)
        self.lock = threading.Lock()

    @classmethod
    def of(cls, client: Any) -> _Borrowed:
        pool = client.connection_pool
        held = _BORROWED.get(pool)
        if held is None:
            held = _BORROWED[pool] = cls(pool)
        return held

    def take(self) -> Any:
        """An idle borrowed connection, a newly borrowed one, or None when all are busy."""
        try:
            return self.idle.pop()
        except IndexError:
            with self.lock:
                if self.room <= 0:
                    return None
                self.room -= 1
            try:
                return self.pool.get_connection()
            except BaseException:  # (Valkey down: the pool lent nothing, so the room is still ours)
                with self.lock:
                    self.room += 1
                raise


_BORROWED: WeakKeyDictionary[Any, _Borrowed] = WeakKeyDictionary()
os.register_at_fork(after_in_child=_BORROWED.clear)  # (not os.getpid() per call: a syscall)


def call(client: Any, command: tuple[Any, ...]) -> Any:
    """Send one command and return its reply (an error reply raises). A broken connection
    (Valkey restarted) is closed and the call goes again through `execute_command`, with
    redis-py's reconnect and retries. A timeout raises: the command may still run (a slow or
    stalled server), and a second send would only double the wait."""
    replies = call_many(client, [command])
    if replies is None:
        return client.execute_command(*command)
    if isinstance(replies[0], ResponseError):
        raise replies[0]
    return replies[0]


def call_once(client: Any, command: tuple[Any, ...]) -> Any:
    """`call` for a command whose replay would not answer as the first send did (a claim: its
    jobs would be leased to nobody): sent once on one connection, never again by this layer;
    a connection error or a timeout raises, and the caller learns its reply was lost. A kept
    connection the server has closed meanwhile (its idle `timeout`, CLIENT KILL, a restart) is
    found before the send, and replaced: nothing went out on it."""
    held = _Borrowed.of(client)
    conn = held.take()
    if conn is None:  # all borrowed connections are busy: one of the pool's (which checks it)
        pool = client.connection_pool
        conn = pool.get_connection()
        try:
            reply = call_on(conn, [command])[0]
        finally:
            pool.release(conn)
    else:
        try:
            _reconnect_if_closed(conn)
            reply = call_on(conn, [command])[0]
        finally:
            held.idle.append(conn)
    if isinstance(reply, ResponseError):
        raise reply
    return reply


def _reconnect_if_closed(conn: Any) -> None:
    """Close a connected `conn` that the server closed (EOF is waiting) or that holds a reply
    nobody asked for: the send that follows connects anew. One poll of the socket, no round
    trip; a connection not connected yet is left to connect at the send."""
    if getattr(conn, "_sock", None) is None:
        return
    try:
        stale = conn.can_read(timeout=0)
    except (ValkeyConnectionError, OSError):
        stale = True
    if stale:
        conn.disconnect()


def call_many(client: Any, commands: Iterable[tuple[Any, ...]]) -> list[Any] | None:
    """Send several commands, then read their replies (one round trip): the replies in order,
    an error reply as its exception; None when no connection could be borrowed or it broke
    (send them again another way). A timeout raises (it is not a reason to send again: see
    `call`). Each command goes out as soon as it is built, so the server works on the first
    while the caller builds the next. An interrupted call closes its connection, so no reply
    is left unread on it."""
    held = _Borrowed.of(client)
    conn = held.take()
    if conn is None:
        return None
    try:
        return call_on(conn, commands)
    except ValkeyConnectionError:
        return None
    finally:
        held.idle.append(conn)


def call_on(conn: Any, commands: Iterable[tuple[Any, ...]], timeout: float | None = None) -> list[Any]:
    """`call_many` on a connection the caller holds: a broken or interrupted call closes it
    (it reconnects on its next command) and raises. `timeout` (seconds) replaces the
    connection's read timeout for these replies (a wait that blocks longer than it)."""
    read = conn.read_response if timeout is None else partial(conn.read_response, timeout=timeout)
    replies: list[Any] = []
    sent = 0
    try:
        for command in commands:
            conn.send_packed_command([PACK(command)] if PACK else conn.pack_command(*command))
            sent += 1
        for _ in range(sent):
            try:
                replies.append(read())
            except ResponseError as exc:  # the whole reply was read: the connection is fine
                replies.append(exc)
    except BaseException:
        conn.disconnect()
        raise
    return replies


async def call_on_async(conn: Any, commands: Iterable[tuple[Any, ...]]) -> list[Any]:
    """`call_on` for a redis.asyncio connection, on its event loop."""
    replies: list[Any] = []
    sent = 0
    try:
        for command in commands:
            await conn.send_packed_command([PACK(command)] if PACK else conn.pack_command(*command))
            sent += 1
        for _ in range(sent):
            try:
                replies.append(await conn.read_response())
            except ResponseError as exc:
                replies.append(exc)
    except BaseException:
        await conn.disconnect()
        raise
    return replies


def async_twin(client: Any) -> Any | None:
    """A redis.asyncio connection with a standalone client's connection settings, unconnected;
    None when the client's connections have a class or a setting the asyncio ones lack (then
    keep to threads). See `_compat.async_connection`."""
    return _compat.async_connection(client.connection_pool)
