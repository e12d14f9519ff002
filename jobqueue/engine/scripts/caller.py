"""Sends the transition scripts: by SHA (EVALSHA), loading a script's text again on NOSCRIPT.

A call's head — EVALSHA, the SHA, the number of keys, the keys its script declares — depends only
on the script and the shard, never on the client, so one table keeps each head for every client
(`_HEADS`): a call builds no key and hashes no text. A standalone client's calls go the short
way (`wire`: connections borrowed from its pool); a cluster client's go through redis-py, which
routes each to the node of the shard's slot.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from redis.cluster import RedisCluster
from redis.exceptions import ConnectionError as ValkeyConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as ValkeyTimeoutError

from ...conf import rediscover
from ...keys import ShardKeys
from .. import wire
from . import source

log = logging.getLogger("jobqueue")
_HEADS: dict[tuple[str, str, int], tuple[Any, ...]] = {}
"""(transition, queue, shard index) -> the call up to its arguments."""


def head(name: str, shard: ShardKeys) -> tuple[Any, ...]:
    """EVALSHA, the SHA, the number of keys and the keys of a transition on a shard."""
    found = _HEADS.get((name, shard.queue, shard.index))
    if found is None:
        script = source(name)
        keys = script.keys_for(shard)
        found = _HEADS[name, shard.queue, shard.index] = ("EVALSHA", script.sha, len(keys), *keys)
    return found


def _script(client: Any, name: str) -> Any:
    """redis-py's Script for `name`: it loads the text where the server lacks it (a NOSCRIPT
    reply, a pipeline)."""
    return client.register_script(source(name).text)


def run(client: Any, name: str, shard: ShardKeys, args: Sequence[Any]) -> Any:
    """One script call on one shard: its reply (an error reply raises)."""
    found = _HEADS.get((name, shard.queue, shard.index)) or head(name, shard)
    command = (*found, *args)
    try:
        if isinstance(client, RedisCluster):
            return client.execute_command(*command)
        return wire.call(client, command)
    except NoScriptError:
        return _script(client, name)(keys=found[3:], args=list(args))


def run_answered(client: Any, name: str, shard: ShardKeys, args: Sequence[Any],
                 sends: int) -> Any:
    """`run` for a script that answers its own replay as its first call (an operator's: see
    retry.lua), sent again after a timeout or a broken connection, `sends` times in all, so
    that the caller learns what it did rather than that its reply was lost."""
    for sent in range(1, sends):
        try:
            return run(client, name, shard, args)
        except (ValkeyConnectionError, ValkeyTimeoutError) as exc:
            log.warning("queue=%s: no reply to %s (%s; send %d of %d); sending it again",
                        shard.queue, name, exc, sent, sends)
    return run(client, name, shard, args)


def run_once(client: Any, name: str, shard: ShardKeys, args: Sequence[Any]) -> Any:
    """`run` for a script whose replay would not answer as its first call did (a claim): sent
    once, never again after a connection error or a timeout, which raise (`wire.call_once`).
    On a cluster it goes to the node of the shard's slot; a slot that moved meanwhile (MOVED,
    ASK: not run there) goes redis-py's way."""
    command = (*head(name, shard), *args)
    target = client
    if isinstance(client, RedisCluster):
        node = client.get_node_from_key(command[3])
        target = client.get_redis_connection(node) if node is not None else client
    try:
        return wire.call_once(target, command)
    except NoScriptError:  # (not run: load it, then send it once more)
        return _script(client, name)(keys=command[3:3 + command[2]], args=list(args))
    except ResponseError as exc:
        if target is client or not str(exc).startswith(("MOVED", "ASK")):
            raise
        return client.execute_command(*command)
    except (ValkeyConnectionError, ValkeyTimeoutError):
        rediscover(client)
        raise


def run_by_shard(client: Any, name: str, queue: str, head: list[Any],
                 items: Sequence[tuple[int, list[Any]]]) -> list[Any]:
    """A batch script once per shard of `queue` (one round trip each): ARGV = `head`, then the
    number of items on that shard, then each item's entries. `items`: (shard index, entries);
    the script answers one reply per item, and they come back in the items' order."""
    groups: dict[int, list[int]] = defaultdict(list)
    for pos, (index, _) in enumerate(items):
        groups[index].append(pos)
    answers: list[Any] = [None] * len(items)
    for index, positions in groups.items():
        args: list[Any] = [*head, len(positions)]
        for pos in positions:
            args.extend(items[pos][1])
        reply = run(client, name, ShardKeys(queue, index), args)
        for pos, answer in zip(positions, reply, strict=True):
            answers[pos] = answer
    return answers


def run_many(client: Any, name: str, shard: ShardKeys, calls: Iterable[list[Any]]) -> list[Any]:
    """Several calls of one script on one shard in a single round trip (a pipeline). Each call
    is sent as soon as `calls` yields it, so the server runs one while the next is built. The
    cluster client refuses scripts in pipelines, so there they go one by one."""
    if isinstance(client, RedisCluster):
        return [run(client, name, shard, args) for args in calls]
    found = head(name, shard)
    calls, built = iter(calls), []  # built: the calls sent (or being sent) so far

    def commands() -> Iterator[tuple[Any, ...]]:
        for args in calls:
            built.append(args)
            yield (*found, *args)

    replies = wire.call_many(client, commands())
    if replies is None:  # every borrowed connection busy, or this one broke: a pipeline
        built.extend(calls)  # and the rest (one sent twice is harmless: its ids are there)
        script, pipe = _script(client, name), client.pipeline(transaction=False)
        for args in built:
            script(keys=found[3:], args=args, client=pipe)
        return list(pipe.execute())
    for i, reply in enumerate(replies):
        if isinstance(reply, NoScriptError):  # loads the script, then calls it again
            replies[i] = run(client, name, shard, built[i])
        elif isinstance(reply, ResponseError):
            raise reply
    return replies


def run_replicated(client: Any, name: str, shard: ShardKeys, calls: list[list[Any]],
                   replicas: int, wait_ms: int) -> tuple[list[Any], int]:
    """Calls then `WAIT replicas wait_ms` on the same connection (WAIT counts the replicas
    holding this connection's writes): (the calls' replies, replicas that confirmed). On a
    cluster the pipeline goes to the node that owns the shard's slot; if that node moved or
    died (a failover), the slot map is read again and the calls sent once more (the caller's
    calls must be safe to send twice, as an enqueue with the same ids is)."""
    keys, script = head(name, shard)[3:], _script(client, name)
    cluster = isinstance(client, RedisCluster)
    for attempt in (1, 2):
        target = client.get_redis_connection(client.get_node_from_key(keys[0])) if cluster else client
        pipe = target.pipeline(transaction=False)
        for args in calls:
            script(keys=keys, args=args, client=pipe)
        pipe.execute_command("WAIT", replicas, wait_ms)
        try:
            *replies, acked = pipe.execute()
        except (ValkeyConnectionError, ValkeyTimeoutError, ResponseError) as exc:
            if not cluster or attempt == 2 or (isinstance(exc, ResponseError)
                                               and not str(exc).startswith(("MOVED", "ASK"))):
                raise
            rediscover(client)
            continue
        return replies, int(acked)
    raise AssertionError("unreachable")


def same_server(client: Any, a: ShardKeys, b: ShardKeys) -> bool:
    """Whether two shards live on one server (always for a standalone client; on a cluster,
    whether one node owns both slots)."""
    if not isinstance(client, RedisCluster):
        return True
    return bool(client.get_node_from_key(a.key("meta")) == client.get_node_from_key(b.key("meta")))


def run_on_disk(client: Any, name: str, shard: ShardKeys, args: Sequence[Any],
                wait_ms: int) -> tuple[Any, bool]:
    """A call then `WAITAOF 1 0 wait_ms` on the same connection (WAITAOF waits for this
    connection's writes): (its reply, whether the node's AOF holds them; True when the node
    keeps no AOF: nothing to wait for). A cluster client only: a standalone server's AOF keeps
    its writes in order already. A node gone or moved (a failover): the slot map is read
    again and the error raised (the relay's caller tries again later)."""
    keys, script = head(name, shard)[3:], _script(client, name)
    pipe = client.get_redis_connection(client.get_node_from_key(keys[0])).pipeline(
        transaction=False)
    script(keys=keys, args=list(args), client=pipe)
    pipe.execute_command("WAITAOF", 1, 0, wait_ms)
    try:
        reply, synced = pipe.execute(raise_on_error=False)
        if isinstance(reply, Exception):
            raise reply
    except (ValkeyConnectionError, ValkeyTimeoutError, ResponseError):
        rediscover(client)
        raise
    if isinstance(synced, ResponseError):
        return reply, "appendonly" in str(synced).lower()
    return reply, int(synced[0]) >= 1
