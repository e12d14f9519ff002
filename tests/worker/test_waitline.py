"""The idle waiter's connection on the event loop (jobqueue/worker/waitline.py), on a real Valkey."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import redis
from redis.exceptions import ConnectionError as ValkeyConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as ValkeyTimeoutError

from jobqueue.conf import loop_factory
from jobqueue.engine import wire
from jobqueue.worker.waitline import WaitLine
from tests.servers import ValkeyProcess


def _on_loop(client: redis.Redis, body: Callable[[WaitLine], Coroutine[Any, Any, Any]]) -> Any:
    """Open a wait line from `client`'s settings on the worker's kind of loop and run `body`."""
    async def go() -> Any:
        line = await WaitLine.open(wire.async_twin(client))
        assert line is not None
        try:
            return await body(line)
        finally:
            line.close()

    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(go())


def _push_soon(client: redis.Redis, key: str) -> None:
    threading.Timer(0.2, lambda: client.rpush(key, "token")).start()


def _echo(replies: list[Any]) -> list[Any]:
    return replies


def test_a_wait_line_hands_over_replies_as_they_arrive_with_errors_as_values(
        valkey_server: ValkeyProcess) -> None:
    client = redis.Redis.from_url(valkey_server.url)

    async def body(line: WaitLine) -> None:
        assert str(line.id) in {c["id"] for c in client.client_list()}  # (what an unblock names)
        _push_soon(client, "wake")
        wait, claim = await line.call([("BLPOP", "wake", 5), ("EVALSHA", "0" * 40, 0)], _echo, 10)
        assert wait == [b"wake", b"token"] and isinstance(claim, NoScriptError)
        [error] = await line.call([("INCR", "no such command", "x")], _echo, 5)
        assert isinstance(error, ResponseError)

        def refuses(replies: list[Any]) -> None:
            raise ValueError("the caller's own error")

        with pytest.raises(ValueError, match="caller's own"):
            await line.call([("PING",)], refuses, 5)
        assert await line.call([("PING",), ("BLPOP", "empty", 0.1)], _echo, 5) == [b"PONG", None]

    _on_loop(client, body)


def test_a_wait_line_decodes_as_its_client_does(valkey_server: ValkeyProcess) -> None:
    client = redis.Redis.from_url(valkey_server.url, decode_responses=True)

    async def body(line: WaitLine) -> list[Any]:
        return await line.call([("SET", "k", "é"), ("GET", "k")], _echo, 5)

    assert _on_loop(client, body) == ["OK", "é"]


def test_a_killed_or_silent_wait_line_raises_and_stays_closed(valkey_server: ValkeyProcess) -> None:
    client = redis.Redis.from_url(valkey_server.url)

    async def killed(line: WaitLine) -> None:
        threading.Timer(0.2, lambda: client.client_kill_filter(_id=line.id)).start()
        with pytest.raises(ValkeyConnectionError):
            await line.call([("BLPOP", "never", 5)], _echo, 10)
        assert line.closed
        with pytest.raises(ValkeyConnectionError):
            line.call([("PING",)], _echo, 5)

    async def silent(line: WaitLine) -> None:
        with pytest.raises(ValkeyTimeoutError):  # (a wait past its own timeout: no server)
            await line.call([("BLPOP", "never", 5)], _echo, 0.3)
        assert line.closed

    _on_loop(client, killed)
    _on_loop(client, silent)
