"""The twins of the operator's transitions, of key rotation's compare-and-set (reseal.lua, for
`operations.reseal`) and of the reads (see `calls` for what a twin is), and of the few scripts
that live in Python text rather than a file of their own: a resize's compare-and-set of the
layout, the registry's widest count, and the schedules' clock and record
(`operations.schedule`). These are all the scripts a module outside this folder runs.

An operator's transition carries its call's own id and is sent again while its reply is lost
(`caller.run_answered`): retry.lua, cancel.lua and reprioritize.lua keep their answer a minute
under that id (`_operator.lua`), so a call sent again answers as the first one did.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any

from redis.exceptions import NoScriptError

from ...exceptions import JobQueueError
from ...keys import ShardKeys
from ...records import COUNTS_REPLY
from . import caller, source
from .answers import Head, Watched, operator_answer
from .calls import twin

OPERATOR_SENDS = 3
"""How many times an operator's transition is sent when its reply is lost."""


def call_id() -> str:
    """A fresh id for an operator's call (its answer is kept under it)."""
    return secrets.token_hex(8)


def keep_answer(client: Any, shard: ShardKeys, call_id: str, answer: str) -> None:
    """Keep `answer` a minute as call `call_id`'s, where `_operator.lua` keeps a script's: a
    transition made outside the scripts (an operator's retry that creates its job again from
    the history) answers so when the same call comes again, as a script's transition would."""
    if call_id:
        client.set(shard.key(f"op:{call_id}"), answer, px=60_000)


@twin("retry")
def retry(client: Any, shard: ShardKeys, job_id: str, call_id: str) -> str:
    """A dead, cancelled or expired job back to pending (or waiting): the state it is in now;
    JobNotFound or InvalidTransition as the script refuses (`answers.refused`)."""
    reply = caller.run_answered(client, "retry", shard, [job_id, call_id], OPERATOR_SENDS)
    return operator_answer("retry", reply, job_id, shard.queue)


@twin("reprioritize")
def reprioritize(client: Any, shard: ShardKeys, job_id: str, priority: int, call_id: str) -> str:
    reply = caller.run_answered(client, "reprioritize", shard, [job_id, priority, call_id],
                                OPERATOR_SENDS)
    return operator_answer("reprioritize", reply, job_id, shard.queue)


@twin("cancel")
def cancel(client: Any, shard: ShardKeys, job_id: str, retention: int, call_id: str) -> str:
    """'cancelled', or 'active' (flagged: its worker's outcome records it cancelled)."""
    reply = caller.run_answered(client, "cancel", shard, [job_id, retention, call_id],
                                OPERATOR_SENDS)
    return operator_answer("cancel", reply, job_id, shard.queue)


def retry_many(client: Any, shard: ShardKeys, calls: Sequence[tuple[str, str]]) -> list[Any]:
    """`retry` of many jobs of one shard in one round trip, (job id, call id) each: each one's
    state after, or its refusal (the exception, not raised)."""
    return _answers("retry", shard, calls, caller.run_many(
        client, "retry", shard, [[job_id, call] for job_id, call in calls]))


def cancel_many(client: Any, shard: ShardKeys, calls: Sequence[tuple[str, str]],
                retention: int) -> list[Any]:
    """`cancel` of many jobs of one shard in one round trip (as `retry_many`)."""
    return _answers("cancel", shard, calls, caller.run_many(
        client, "cancel", shard, [[job_id, retention, call] for job_id, call in calls]))


def _answers(script: str, shard: ShardKeys, calls: Sequence[tuple[str, str]],
             replies: list[Any]) -> list[Any]:
    answers: list[Any] = []
    for (job_id, _), reply in zip(calls, replies, strict=True):
        try:
            answers.append(operator_answer(script, reply, job_id, shard.queue))
        except JobQueueError as exc:
            answers.append(exc)
    return answers


@twin("set_lane_concurrency")
def set_lane_concurrency(client: Any, shard: ShardKeys, lane: str, cap: int) -> int:
    """How many held lanes came back on the ring."""
    return int(caller.run(client, "set_lane_concurrency", shard, [lane, cap]))


@twin("reseal")
def reseal(client: Any, shard: ShardKeys, row: str, job_id: str,
           fields: Sequence[tuple[str, str, str]]) -> int:
    """Write back values sealed again on a job row (`row` 'job') or a flow's result slots
    ('results'), each (name, the value read, the value sealed again) only while the field still
    holds the value read: how many were written."""
    args: list[Any] = [row, job_id, len(fields)]
    for field in fields:
        args.extend(field)
    return int(caller.run(client, "reseal", shard, args))


# -- reads ----------------------------------------------------------------------------------

@twin("counts")
def counts(client: Any, shard: ShardKeys) -> dict[str, int]:
    """The shard's counts by `records.COUNTS_REPLY` name (states, 'paused', 'lanes')."""
    return {name: int(value) for name, value in zip(
        COUNTS_REPLY, caller.run(client, "counts", shard, []), strict=True)}


@twin("heads")
def heads(client: Any, shard: ShardKeys, lanes: int, bands: int) -> list[Head]:
    from ...ids import minted_ms

    reply = caller.run(client, "heads", shard, [lanes, bands])
    return [Head(reply[n], reply[n + 1], int(reply[n + 2]) or minted_ms(reply[n + 1]) or 0)
            for n in range(0, len(reply), 3)]


def _watched(reply: list[str]) -> Watched:
    if reply[0] == "missing":
        return Watched(None, False)
    if len(reply) == 3:
        return Watched(reply[0], True, reply[1], reply[2])
    return Watched(reply[0], False)


@twin("watch")
def watch(client: Any, shard: ShardKeys, job_id: str) -> Watched:
    """A job's row read for a caller about to wait for its result (counted as a waiter while
    it has not finished)."""
    return _watched(caller.run(client, "watch", shard, [job_id]))


async def watch_async(client: Any, shard: ShardKeys, job_id: str) -> Watched:
    """`watch` through a redis.asyncio client."""
    script = source("watch")
    keys = script.keys_for(shard)
    try:
        reply = await client.evalsha(script.sha, len(keys), *keys, job_id)
    except NoScriptError:  # (a restarted server: load the text, then call it again)
        await client.script_load(script.text)
        reply = await client.evalsha(script.sha, len(keys), *keys, job_id)
    return _watched(reply)


# -- scripts kept as Python text ------------------------------------------------------------

# Write the layout only if nobody changed it since it was read (compare and set), and raise the
# registry's widest count to cover it. The call's id (ARGV[5]) is kept a minute in KEYS[3], so
# that the call sent again after its reply was lost answers 1, as it did.
LAYOUT_CAS = """
local cur = redis.call('HGET', KEYS[1], ARGV[1]) or ''
if cur ~= ARGV[2] then
  return (cur == ARGV[3] and redis.call('GET', KEYS[3]) == ARGV[5]) and 1 or 0
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
redis.call('SET', KEYS[3], ARGV[5], 'PX', 60000)
local widest = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0')
if tonumber(ARGV[4]) > widest then redis.call('HSET', KEYS[2], ARGV[1], ARGV[4]) end
return 1
"""

# Raise the registry's widest count of a queue to ARGV[2] (never lower it: a resize may have
# raised it further meanwhile).
RAISE_WIDEST = """
if tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0') < tonumber(ARGV[2]) then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
end
"""

# Valkey's clock, in ms, read on the node that holds the schedules' state.
SERVER_NOW = "local t = redis.call('TIME') return t[1] * 1000 + math.floor(t[2] / 1000)"

# Record ARGV[2] as the last tick of entry ARGV[1] (its state ARGV[3]) unless it is in Valkey's
# future beyond ARGV[4] ms, or not later than the last tick recorded (one in that future counts
# as none). Returns 1 when recorded.
RECORD_TICK = """
local t = redis.call('TIME')
local now, tick = t[1] * 1000 + math.floor(t[2] / 1000), tonumber(ARGV[2])
if tick > now + tonumber(ARGV[4]) then return 0 end
local ok, seen = pcall(cjson.decode, redis.call('HGET', KEYS[1], ARGV[1]) or '')
local last = ok and type(seen) == 'table' and tonumber(seen.last)
if last and last >= tick and last <= now + tonumber(ARGV[4]) then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
return 1
"""


def layout_cas(client: Any, keys: list[str], queue: str, before: str, after: str, widest: int,
               call_id: str) -> bool:
    """`LAYOUT_CAS`: keys (layout hash, registry, the call's op key); True when written (or
    written by this very call, sent again)."""
    return bool(int(client.register_script(LAYOUT_CAS)(
        keys=keys, args=[queue, before, after, widest, call_id])))


def raise_widest(client: Any, registry: str, queue: str, widest: int) -> None:
    client.register_script(RAISE_WIDEST)(keys=[registry], args=[queue, widest])


def server_now_ms(client: Any, key: str) -> int:
    """Valkey's clock in ms, on the node holding `key`."""
    return int(client.register_script(SERVER_NOW)(keys=[key]))


def record_tick(client: Any, key: str, entry: str, tick_ms: int, state: str,
                slack_ms: int) -> bool:
    """`RECORD_TICK` on the schedules' state hash `key`: True when recorded."""
    return bool(int(client.register_script(RECORD_TICK)(
        keys=[key], args=[entry, tick_ms, state, slack_ms])))
