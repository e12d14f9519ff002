"""The transitions of `Queue`, each on its own and as behaviour, on Valkey and Valkey Cluster."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from redis.cluster import RedisCluster

from jobqueue import Queue, conf, keys
from jobqueue.engine import backlog, handoff, layouts, scripts, wire
from jobqueue.engine.scripts import caller
from jobqueue.engine.scripts import calls as twins
from jobqueue.exceptions import (
    InvalidJobId,
    InvalidName,
    InvalidOption,
    InvalidPayload,
    InvalidPriority,
    InvalidTransition,
    JobNotFound,
)
from jobqueue.spec import JobSpec, prepare
from tests.servers import server_ms, wait_past
from tests.workers import ROOT, wait_for


def claim_all(queue: Queue, n: int = 1000, **kw: Any) -> list:
    return queue.dequeue(count=n, lease=30, worker="t", **kw)


# -- the scripts themselves ----------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(scripts.TRANSITIONS))
def test_each_script_declares_its_keys_and_touches_no_undeclared_key_shape(name: str) -> None:
    src = scripts.source(name)
    assert src.key_names[0] == "base"
    body = (scripts.HERE / scripts.TRANSITIONS[name]).read_text()
    header, code = body.split("]]", 1)
    assert "ARGV" in header and "Returns" in header
    used = {int(n) for n in re.findall(r"KEYS\[(\d+)\]", code)}
    assert used == set(range(1, len(src.key_names) + 1)), "code uses exactly the declared KEYS"


@pytest.mark.parametrize("name", sorted(scripts.TRANSITIONS))
def test_each_header_names_every_key_its_script_derives_from_its_base(name: str) -> None:
    """A key built from the braced base (`base .. ':slots'`, in the script or in a helper it
    carries) is named in the header (`base:slots`), or declared in KEYS."""
    src = scripts.source(name)
    code = re.sub(r"--\[\[.*?\]\]|--[^\n]*", "", src.text, flags=re.DOTALL)
    derived = {part.strip(":") for part in re.findall(r"\bbase \.\. '(:\w+:?)'", code)}
    header = (scripts.HERE / scripts.TRANSITIONS[name]).read_text().split("]]", 1)[0]
    unnamed = {key for key in derived - set(src.key_names)
               if not re.search(rf"\bbase:{key}\b", header)}
    assert not unnamed, f"{name}.lua touches base:{sorted(unnamed)} unnamed in its header"


def test_a_script_carries_only_the_helpers_it_uses() -> None:
    defined = lambda name: set(re.findall(r"^local (?:function )?(\w+)", scripts.source(name).text, re.M))  # noqa: E731
    assert {"job_key", "lane_push", "wake_workers", "now_ms"} <= defined("enqueue")
    assert not {"ack_jobs", "finish", "bury", "STATES", "EVENT_FIELDS"} & defined("enqueue")
    assert {"ack_jobs", "finish", "tally", "EVENT_AT", "bury", "STATES"} <= defined("claim")
    assert defined("reprioritize") >= {"job_key", "lane_key"} and "now_ms" not in defined("reprioritize")


@pytest.mark.parametrize("name", sorted(scripts.TRANSITIONS))
def test_every_key_a_wrapper_passes_is_in_the_queues_slot(name: str) -> None:
    for index in (0, 3):
        shard = Queue("emails").shard(index)
        head = caller.head(name, shard)  # what every call of the script sends before its ARGV
        passed = list(head[3:])
        assert head[:3] == ("EVALSHA", scripts.source(name).sha, len(passed))
        assert passed == scripts.source(name).keys_for(shard)  # exactly the header's KEYS
        assert len({keys.slot(k) for k in passed}) == 1
        assert all(k.startswith(shard.base) for k in passed)


def test_enqueue_writes_the_row_and_the_lane(queue: Queue, valkey: Any) -> None:
    ref = queue.enqueue({"x": 1}, priority=5)
    row = valkey.hgetall(f"emq:{{default}}:job:{ref.id}")
    # Only what differs from a default: a waiting job's bytes are RAM (and a minted id says when).
    assert row == {"state": "pending", "payload": '{"x":1}', "priority": "5"}
    queue.enqueue("p", lane="l", max_attempts=9, backoff=2, lease=5, unique_key="u", delay=60,
                  job_id="JOB00000000001")
    assert set(valkey.hgetall("emq:{default}:job:JOB00000000001")) == {
        "state", "payload", "enqueued_at", "lane", "max_attempts", "backoff_ms", "lease_ms",
        "unique_key", "run_after"}
    info = queue.get(ref.id)
    assert info and info.attempts == 0 and info.max_attempts == 3 and info.run_after == info.enqueued_at
    assert info.enqueued_at and abs(info.enqueued_at.timestamp() - time.time()) < 5
    assert valkey.zscore("emq:{default}:pending", ref.id) == -5
    assert valkey.lrange("emq:{default}:ring", 0, -1) == [""]
    assert valkey.llen("emq:{default}:wake") == 1


@pytest.mark.parametrize("how", ["one", "many"])
def test_a_minted_id_another_process_took_is_minted_anew(queue: Queue, valkey: Any,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          how: str) -> None:
    taken = queue.enqueue({"first": True}).id
    from jobqueue import ids

    fresh = ids.new_id()
    minted = iter([taken, fresh])
    monkeypatch.setattr(ids, "new_id", lambda: next(minted))
    specs = [JobSpec({"second": True})]
    ref = queue.enqueue({"second": True}) if how == "one" else queue.enqueue_many(specs)[0]
    assert ref.id == fresh and ref.created
    assert queue.get(taken).payload == {"first": True}  # type: ignore[union-attr]
    assert queue.get(fresh).payload == {"second": True}  # type: ignore[union-attr]


def test_claim_leases_on_the_server_clock_and_counts_attempts(queue: Queue, valkey: Any) -> None:
    ref = queue.enqueue("p", lease=7)
    before = time.time() * 1000
    [lease] = queue.dequeue(count=5, lease=30, worker="w1")
    deadline = valkey.zscore("emq:{default}:active", ref.id)
    assert lease.job_id == ref.id and lease.token == 1 and lease.payload == "p"
    assert lease.lease == 7 and before + 6000 < deadline < time.time() * 1000 + 8000
    assert valkey.hget(f"emq:{{default}}:job:{ref.id}", "worker") == "w1"
    assert valkey.lrange("emq:{default}:ring", 0, -1) == []  # an empty lane leaves the ring


def test_ack_records_success_result_event_and_retention(queue: Queue, valkey: Any) -> None:
    ref = queue.enqueue([1, 2])
    [lease] = claim_all(queue)
    assert queue.ack(lease, result={"sum": 3}) is True
    info = queue.get(ref.id)
    assert info and info.state == "succeeded" and info.result == {"sum": 3}
    assert valkey.pttl(f"emq:{{default}}:job:{ref.id}") > 0
    [(_, event)] = valkey.xrange("emq:{default}:done")
    assert event["id"] == ref.id and event["state"] == "succeeded" and event["result"] == '{"sum":3}'
    assert queue.counts()["succeeded"] == 1 and queue.counts()["active"] == 0


def test_stale_ack_extend_nack_checkpoint_change_nothing(queue: Queue) -> None:
    ref = queue.enqueue("p")
    [old] = claim_all(queue)
    assert queue.release(old)
    [new] = claim_all(queue)
    assert new.token == old.token + 1
    assert queue.ack(old) is False
    assert queue.extend(old, 10) is False
    assert queue.nack(old, "late") is None
    assert queue.checkpoint(old, {"x": 1}) is False
    info = queue.get(ref.id)
    assert info and info.state == "active" and info.last_error == "" and info.checkpoint is None
    assert queue.ack(new) is True


def test_successes_ride_in_the_next_claim_and_a_repeated_ack_counts_once(queue: Queue,
                                                                        valkey: Any) -> None:
    first = queue.enqueue_many([JobSpec(n) for n in range(3)])
    leases = queue.dequeue(count=3)
    answers, more = queue.ack_and_dequeue([(lease, "7") for lease in leases], count=2)
    assert answers == [True, True, True] and more == []
    assert {queue.get(r.id).state for r in first} == {"succeeded"}  # type: ignore[union-attr]
    assert queue.ack(leases[0], 7) is True  # sent again after a lost reply: recorded once
    assert valkey.xlen("emq:{default}:done") == 3
    queue.enqueue_many([JobSpec(n) for n in range(2)])
    [a] = queue.dequeue(count=1)
    answers, [b] = queue.ack_and_dequeue([(a, "1")], count=1)
    assert answers == [True] and b.job_id != a.job_id


def test_a_claim_that_carries_a_success_costs_the_commands_of_one_job(queue: Queue,
                                                                      valkey: Any) -> None:
    """Concurrency 1's path: one script call that records a success and claims the next job,
    inside it one clock reading and the 19 commands listed here."""
    queue.enqueue_many([JobSpec(n) for n in range(3)])
    [a] = queue.dequeue(count=1, worker="w")
    every = {"target_nodes": RedisCluster.ALL_NODES} if isinstance(valkey, RedisCluster) else {}
    valkey.config_resetstat(**every)
    answers, [b] = queue.ack_and_dequeue([(a, "1")], count=1, worker="w")
    stats = valkey.info("commandstats", **every)
    calls: Counter[str] = Counter()
    for node in stats.values() if every else [stats]:
        calls.update({name.removeprefix("cmdstat_"): v["calls"] for name, v in node.items()})
    calls.pop("config|resetstat", None)
    assert answers == [True] and b.job_id != a.job_id
    assert calls == {"evalsha": 1, "time": 1, "hmget": 4, "hincrby": 4, "hset": 2, "zrem": 1,
                     "xadd": 1, "pexpire": 1, "expire": 1, "lmove": 1, "zpopmin": 1,
                     "zcard": 1, "zadd": 1, "hdel": 1}


def test_a_queue_keeps_its_claims_head_until_what_it_holds_changes(queue: Queue) -> None:
    queue.dequeue(count=1, lease=30, worker="w")
    head = queue.leases.claim_head
    queue.dequeue(count=1, lease=30, worker="w")
    assert head is not None and queue.leases.claim_head is head  # (the kept one: not built again)
    queue.dequeue(count=1, lease=60, worker="w")
    assert queue.leases.claim_head is not head
    assert queue.leases.claim_head[2][0] == 60_000  # type: ignore[index]
    conf.reset()
    queue.dequeue(count=1, lease=60, worker="w")
    assert queue.leases.claim_head[0] is conf.get_config()  # type: ignore[index]


def test_nack_retries_with_exponential_backoff_then_dies(queue: Queue, valkey: Any) -> None:
    ref = queue.enqueue("p", max_attempts=3, backoff=10)
    [lease] = claim_all(queue)
    assert queue.nack(lease, "boom 1") == "scheduled"
    due = valkey.zscore("emq:{default}:schedule", ref.id)
    assert 9_000 < due - time.time() * 1000 <= 10_100
    valkey.zadd("emq:{default}:schedule", {ref.id: 0})  # make it due now
    assert queue.promote() == 1
    [lease] = claim_all(queue)
    assert queue.nack(lease, "boom 2") == "scheduled"
    due = valkey.zscore("emq:{default}:schedule", ref.id)
    assert 19_000 < due - time.time() * 1000 <= 20_100  # 10 s × 2
    valkey.zadd("emq:{default}:schedule", {ref.id: 0})
    queue.promote()
    [lease] = claim_all(queue)
    assert queue.nack(lease, "boom 3") == "dead"
    info = queue.get(ref.id)
    assert info and info.state == "dead" and info.last_error == "boom 3" and info.attempts == 3
    assert valkey.zscore("emq:{default}:dead", ref.id) is not None
    assert [e["state"] for _, e in valkey.xrange("emq:{default}:done")] == ["dead"]


def test_nack_retry_in_zero_and_fatal(queue: Queue) -> None:
    queue.enqueue("p", max_attempts=5)
    [lease] = claim_all(queue)
    assert queue.nack(lease, "again", retry_in=0) == "pending"
    [lease] = claim_all(queue)
    assert queue.nack(lease, "cannot ever run", fatal=True) == "dead"


def test_extend_and_checkpoint(queue: Queue, valkey: Any) -> None:
    ref = queue.enqueue("p")
    [lease] = queue.dequeue(count=1, lease=1, worker="w")
    assert queue.extend(lease, 60) is True
    assert valkey.zscore("emq:{default}:active", ref.id) > time.time() * 1000 + 50_000
    assert queue.checkpoint(lease, {"page": 3}, extend=120) is True
    assert queue.release(lease)
    [again] = claim_all(queue)
    assert again.checkpoint == {"page": 3}


def test_renewing_an_attempt_that_just_finished_says_so_instead_of_stale(queue: Queue) -> None:
    # The heartbeat snapshots the held jobs and renews them; an ack may land in between. That
    # attempt finished: it is not a lost lease (which would warn "may run again elsewhere").
    queue.enqueue("p")
    [lease] = claim_all(queue)
    assert queue.ack(lease, None)
    assert queue.extend_many([lease], 30) == [3]
    assert queue.extend(lease, 30) is False


def test_reap_returns_expired_leases_and_kills_spent_ones(queue: Queue) -> None:
    a = queue.enqueue("a", max_attempts=2)
    b = queue.enqueue("b", max_attempts=1)
    queue.dequeue(count=2, lease=0.05, worker="gone")
    wait_past(queue.client, queue.shard(0).key("active"))
    assert queue.reap() == 2
    assert queue.get(a.id).state == "pending"  # type: ignore[union-attr]
    dead = queue.get(b.id)
    assert dead and dead.state == "dead" and dead.last_error == "lease expired"
    assert queue.reap() == 0


def test_release_does_not_charge_the_retry_budget(queue: Queue) -> None:
    ref = queue.enqueue("p", max_attempts=1)
    for _ in range(3):
        [lease] = claim_all(queue)
        assert queue.release(lease)
    [lease] = claim_all(queue)
    assert lease.token == 4
    assert queue.nack(lease, "first real failure") == "dead"  # the budget of 1 run is now spent
    assert queue.get(ref.id).attempts == 4  # type: ignore[union-attr]


def test_promote_moves_due_jobs_and_reports_the_next(queue: Queue) -> None:
    queue.enqueue("soon", delay=0.05)
    queue.enqueue("later", delay=60)
    assert claim_all(queue) == []
    assert queue.counts()["scheduled"] == 2
    soon = queue.client.zrange(queue.shard(0).key("schedule"), 0, 0, withscores=True)[0][1]
    wait_for(lambda: server_ms(queue.client) > soon, every=0.01)
    moved, wait = queue.promote_shard(0)
    assert moved == 1 and wait is not None and 55 < wait <= 60
    assert [lease.payload for lease in claim_all(queue)] == ["soon"]


# -- behaviour through Queue ----------------------------------------------------------------

def test_higher_priority_first_then_fifo(queue: Queue) -> None:
    specs = [JobSpec(f"p{p}-{i}", priority=p) for i in range(3) for p in (0, 10, -5)]
    queue.enqueue_many(specs)
    order = [lease.payload for lease in claim_all(queue)]
    assert order == ["p10-0", "p10-1", "p10-2", "p0-0", "p0-1", "p0-2", "p-5-0", "p-5-1", "p-5-2"]


def test_one_flooding_lane_cannot_starve_the_others(queue: Queue) -> None:
    queue.enqueue_many([JobSpec(("flood", i), lane="flood") for i in range(300)])
    for lane in ("a", "b", "c", "d"):
        queue.enqueue_many([JobSpec((lane, i), lane=lane) for i in range(10)])
    first_60 = []
    while len(first_60) < 60:  # single claims, as a --concurrency 1 worker does
        first_60 += [lease.payload[0] for lease in queue.dequeue(count=1, worker="w")]
    served = Counter(first_60)
    assert all(served[lane] == 10 for lane in "abcd"), served
    assert served["flood"] == 20


def test_lane_weights_give_a_lane_w_turns_per_round(settings: Any, valkey: Any) -> None:
    settings.JOBQUEUE = {**settings.JOBQUEUE,
                         "QUEUES": {"default": {"lane_weights": {"vip": 3, "": 2}}}}
    conf.reset()
    queue = Queue("default", client=valkey)
    for lane in ("vip", "b", ""):
        queue.enqueue_many([JobSpec(lane, lane=lane or None) for _ in range(12)])
    served = []
    while len(served) < 18:  # single claims, as a --concurrency 1 worker does
        served += [lease.payload for lease in queue.dequeue(count=1, worker="w")]
    assert "".join(x[0] if x else "-" for x in served) == "vvvb--vvvb--vvvb--"
    # A lane's wait between two of its turns is at most the other lanes' weights: 3 + 2 here.
    batch = [lease.payload for lease in queue.dequeue(count=6, worker="w")]
    assert Counter(batch) == {"vip": 3, "b": 1, "": 2}


def test_a_rate_limit_admits_at_most_its_bucket_then_the_refill(settings: Any, valkey: Any) -> None:
    settings.JOBQUEUE = {**settings.JOBQUEUE, "QUEUES": {"default": {"rate": "5/s"}}}
    conf.reset()
    queue = Queue("default", client=valkey)
    queue.enqueue_many([JobSpec(i) for i in range(20)])
    assert len(queue.dequeue(count=20)) == 5 and 0 < queue.rate_wait <= 0.2  # a full bucket
    assert queue.dequeue(count=20) == [] and 0 < queue.rate_wait <= 0.2
    start, taken = server_ms(valkey), []
    wait_for(lambda: taken.extend(queue.dequeue(count=20)) or len(taken) >= 2)
    elapsed = (server_ms(valkey) - start) / 1000
    assert len(taken) <= 5 * elapsed + 1  # 5 a second, refilled on the server clock
    assert queue.counts()["pending"] == 15 - len(taken)


def test_a_batch_claim_takes_successive_turns_across_lanes(queue: Queue) -> None:
    for lane in ("x", "y", "z"):
        queue.enqueue_many([JobSpec(lane, lane=lane) for _ in range(5)])
    batch = [lease.payload for lease in queue.dequeue(count=6, worker="w")]
    assert Counter(batch) == {"x": 2, "y": 2, "z": 2}


def test_claim_never_returns_empty_while_a_lane_has_work(queue: Queue, valkey: Any) -> None:
    queue.enqueue_many([JobSpec(i, lane=f"l{i % 7}") for i in range(70)])
    seen = 0
    while batch := queue.dequeue(count=3, worker="w"):
        seen += len(batch)
    assert seen == 70 and valkey.llen("emq:{default}:ring") == 0


def test_unique_key_returns_the_live_job(queue: Queue) -> None:
    first = queue.enqueue("a", unique_key="order-991")
    again = queue.enqueue("b", unique_key="order-991")
    assert again.id == first.id and again.created is False and first.created is True
    assert queue.counts()["pending"] == 1


def test_caller_id_is_idempotent(queue: Queue) -> None:
    from jobqueue.ids import new_id

    job_id = new_id()
    assert queue.enqueue("a", job_id=job_id).created is True
    assert queue.enqueue("a", job_id=job_id).created is False


def test_pause_stops_claims_but_not_enqueue(queue: Queue) -> None:
    queue.pause()
    queue.enqueue("p")
    assert queue.is_paused() and claim_all(queue) == []
    queue.resume()
    assert len(claim_all(queue)) == 1


def test_resume_leaves_a_wake_token_on_every_shard(queue: Queue) -> None:
    # (a token wakes an idle worker; without one it finds the queue at its next maintenance turn)
    queue.pause()
    queue.resume()
    wakes = [queue.client.lrange(queue.shard(i).key("wake"), 0, -1) for i in range(queue.all_shards())]
    assert wakes and all(wake == ["1"] for wake in wakes)


def test_cancel_retry_reprioritize(queue: Queue) -> None:
    low = queue.enqueue("low", priority=0)
    high = queue.enqueue("high", priority=5)
    assert queue.reprioritize(low.id, 50) == "pending"
    assert queue.cancel(high.id) == "cancelled"
    with pytest.raises(InvalidTransition, match=r"cancel .* it is cancelled"):
        queue.cancel(high.id)
    assert queue.retry(high.id) == "pending"
    order = [lease.payload for lease in claim_all(queue)]
    assert order == ["low", "high"]
    with pytest.raises(InvalidTransition, match="retry"):
        queue.retry(low.id)
    with pytest.raises(JobNotFound):
        queue.cancel("JOB00000000001")


def test_cancel_of_an_active_job_is_recorded_at_its_ack(queue: Queue) -> None:
    ref = queue.enqueue("p")
    [lease] = claim_all(queue)
    assert queue.cancel(ref.id) == "active"
    assert queue.extend_many([lease], 10) == [2]
    assert queue.ack(lease) is True
    assert queue.get(ref.id).state == "cancelled"  # type: ignore[union-attr]


def test_operator_retry_gives_a_fresh_budget_and_keeps_counting(queue: Queue) -> None:
    ref = queue.enqueue("p", max_attempts=1)
    [lease] = claim_all(queue)
    queue.nack(lease, "x")
    assert queue.retry(ref.id) == "pending"
    [lease] = claim_all(queue)
    assert lease.token == 2
    assert queue.nack(lease, "y") == "dead"


def test_delay_and_run_after(queue: Queue) -> None:
    from datetime import UTC, datetime, timedelta

    a = queue.enqueue("a", delay=timedelta(seconds=30))
    b = queue.enqueue("b", run_after=datetime.now(UTC) + timedelta(seconds=30))
    c = queue.enqueue("c", run_after=datetime.now(UTC) - timedelta(seconds=30))
    assert queue.get(a.id).state == queue.get(b.id).state == "scheduled"  # type: ignore[union-attr]
    assert queue.get(c.id).state == "pending"  # type: ignore[union-attr]


def test_corrupt_payload_is_reported_on_the_lease(queue: Queue, valkey: Any) -> None:
    ref = queue.enqueue("p")
    valkey.hset(f"emq:{{default}}:job:{ref.id}", "payload", "{not json")
    [lease] = claim_all(queue)
    assert lease.payload is None and "corrupt" in (lease.problem or "")


def test_sharded_queue_spreads_jobs_and_claims_them_all(valkey: Any) -> None:
    queue = Queue("emails", client=valkey, shards=4)
    refs = queue.enqueue_many([JobSpec(i) for i in range(200)])
    per_shard = Counter(layouts.place(r.id, "", "", queue.shards) for r in refs)
    assert len(per_shard) == 4 and min(per_shard.values()) > 20
    laned = queue.enqueue_many([JobSpec(i, lane="player-7") for i in range(10)])
    assert len({queue.locate(r.id) for r in laned}) == 1
    got = []
    while batch := queue.dequeue(count=50, worker="w"):
        got += batch
    assert len(got) == 210 and queue.counts()["active"] == 210
    assert queue.get(refs[0].id) is not None


def test_a_claim_told_which_shard_woke_it_asks_only_that_shard(valkey: Any) -> None:
    """A worker's wake waiter knows where the new job is: one script call, not one per shard
    (it asked them all, in turn from a rotating start, before)."""
    queue = Queue("emails", client=valkey, shards=4)
    refs = queue.enqueue_many([JobSpec(i) for i in range(40)])
    where = {r.id: queue.locate(r.id) for r in refs}
    Queue("other", client=valkey).dequeue(count=1)  # (the claim script is loaded)
    every = {"target_nodes": RedisCluster.ALL_NODES} if isinstance(valkey, RedisCluster) else {}
    valkey.config_resetstat(**every)
    _, leases = queue.ack_and_dequeue([], count=40, worker="w", only=2)
    stats = valkey.info("commandstats", **every)
    per_node = stats.values() if every else [stats]
    assert sum(node.get("cmdstat_evalsha", {}).get("calls", 0) for node in per_node) == 1
    assert leases and {lease.shard for lease in leases} == {2}
    assert {lease.job_id for lease in leases} == {i for i, shard in where.items() if shard == 2}


def _idle_wait(queue: Queue, seconds: int, worker: str = "w", lease: float | None = None,
               override_lease: bool = False) -> list[tuple[Any, ...]]:
    """An idle worker's wait on shard 0, as the worker's waiters build it: an offer, then BLPOP."""
    offer = handoff.offer(queue.lease_ms(lease), override_lease)
    return handoff.wait_commands(queue.shard(0), seconds, worker, offer)


def _offer(queue: Queue, worker: str = "w", seconds: int = 5, **kw: Any) -> None:
    """An idle worker's offer alone (the first of its wait's commands), without the wait."""
    queue.client.execute_command(*_idle_wait(queue, seconds, worker, **kw)[0])


def test_an_idle_worker_gets_a_lone_new_job_handed_over_already_leased(valkey: Any) -> None:
    if isinstance(valkey, RedisCluster):
        pytest.skip("one server's connection (test_worker covers a cluster node's)")
    queue = Queue("emails", client=valkey)
    shard = queue.shard(0)
    conn = valkey.connection_pool.get_connection()
    try:
        wait = _idle_wait(queue, 1)
        assert handoff.after_wait(queue.shard(0), wire.call_on(conn, wait, 5)) is False  # timed out: nothing
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(wire.call_on, conn, _idle_wait(queue, 5), 10)
            wait_for(lambda: valkey.hexists(shard.key("idle"), "w")  # (its offer made, and
                     and valkey.info("clients")["blocked_clients"] >= 1)  # blocked)
            ref = queue.enqueue({"to": "a"}, lease=7)
            (lease,) = handoff.after_wait(queue.shard(0), waiting.result(timeout=5))
        assert (lease.job_id, lease.token, lease.payload, lease.lease) == (ref.id, 1, {"to": "a"}, 7.0)
        row = valkey.hgetall(shard.job(ref.id))
        assert (row["state"], row["attempts"], row["worker"]) == ("active", "1", "w")
        assert valkey.zscore(shard.key("active"), ref.id) == float(row["lease_until"])
        assert queue.counts()["pending"] == 0 and valkey.llen(shard.key("wake")) == 0
        assert valkey.hlen(shard.key("idle")) == 0  # (an offer takes one job)
        assert queue.ack(lease, "ok")  # (its token fences it as a claim's would)
    finally:
        valkey.connection_pool.release(conn)


def test_a_job_is_handed_over_only_when_nothing_else_could_come_first(valkey: Any) -> None:
    queue = Queue("emails", client=valkey)
    idle = queue.shard(0).key("idle")
    _offer(queue)
    first = queue.enqueue("first", delay=60)  # (scheduled: not handed over)
    queue.enqueue_many([JobSpec("a"), JobSpec("b")])  # (a batch: the claim's order decides)
    assert valkey.hlen(idle) == 1 and queue.counts()["active"] == 0
    queue.enqueue("c", priority=9)  # (other jobs are ready: they may come first)
    assert valkey.hlen(idle) == 1 and queue.counts()["pending"] == 3
    assert [lease.payload for lease in claim_all(queue)] == ["c", "a", "b"]
    assert valkey.hlen(idle) == 1  # (claim_all claims as no worker)
    queue.pause()
    queue.enqueue("d")
    assert queue.counts()["active"] == 3 and valkey.hlen(idle) == 1  # (paused: none taken)
    queue.resume()
    assert queue.dequeue(1, worker="other") and valkey.hlen(idle) == 1  # (another's claim)
    queue.enqueue("d2", delay=60)
    assert queue.dequeue(1, worker="w") == [] and valkey.hlen(idle) == 1  # (it found nothing)
    queue.enqueue_many([JobSpec("e1"), JobSpec("e2")])
    queue.dequeue(1, worker="w")  # a worker that claims a job is not idle any more
    assert valkey.hlen(idle) == 0
    claim_all(queue)
    _offer(queue, lease=3, override_lease=True)
    queue.enqueue("f", lease=60)
    (handed,) = handoff.withdraw(queue.client, queue.shard(0), "w")
    assert (handed.payload, handed.lease) == ("f", 3.0)  # (the worker's --lease overrides)
    assert queue.get(first.id).state == "scheduled"


def test_a_handed_job_a_worker_never_took_goes_back_or_waits_for_its_lease(valkey: Any) -> None:
    queue = Queue("emails", client=valkey)
    shard = queue.shard(0)
    _offer(queue, "gone", lease=2)
    ref = queue.enqueue("x")
    hand = shard.hand("gone")
    # (a dead worker's list outlives the lease, for the reaper to see the job was never taken)
    assert 2000 < valkey.pttl(hand) <= 602_000
    assert queue.release_many(handoff.withdraw(valkey, shard, "gone")) == [True]  # a stopping worker's
    assert valkey.exists(hand) == 0 and queue.counts()["pending"] == 1
    (lease,) = claim_all(queue)
    assert lease.job_id == ref.id and lease.token == 2  # (a new token fences the old)
    _offer(queue, "late", seconds=1)
    wait_for(lambda: not valkey.hexists(shard.key("idle"), "late"))  # it lasts as its wait does
    queue.enqueue("y")  # (expired, even while the server has yet to reclaim the field)
    assert queue.counts()["pending"] == 1
    wait_for(lambda: valkey.hlen(shard.key("idle")) == 0)


def test_growing_shards_moves_no_job(valkey: Any) -> None:
    before = Queue("grow", client=valkey, shards=1).enqueue("old")
    grown = Queue("grow", client=valkey, shards=8)
    assert grown.get(before.id) is not None
    grown.enqueue_many([JobSpec(i) for i in range(20)])
    assert grown.counts()["pending"] == 21
    assert len(grown.dequeue(count=50, worker="w")) == 21


def test_shrinking_drains_the_retired_shards(valkey: Any) -> None:
    Queue("shrink", client=valkey, shards=4).enqueue_many([JobSpec(i) for i in range(40)])
    small = Queue("shrink", client=valkey, shards=1)
    total = small.claim_shards()
    assert total == 4
    got = []
    while batch := small.dequeue(count=50, worker="w", shards=total):
        got += batch
    assert len(got) == 40


# -- the client's short path for script calls ------------------------------------------------

def test_script_calls_borrow_a_bounded_share_of_the_pool_and_survive_a_dropped_connection(
        valkey_server: Any) -> None:
    client = conf.client_for_url(valkey_server.url + "?max_connections=12")  # as users get it
    queue = Queue("default", client=client)
    with ThreadPoolExecutor(8) as pool:  # 8 callers at once: 3 borrow, the others use the pool
        refs = [r for rs in pool.map(lambda i: queue.enqueue_many([JobSpec(i)] * 20), range(60))
                for r in rs]
    assert len({r.id for r in refs}) == 1200 and queue.counts()["pending"] == 1200
    borrowed = wire._Borrowed.of(client)
    assert borrowed.room == 0 and len(borrowed.idle) == 3  # a quarter of 12, kept for later calls
    assert client.ping()  # other commands still find a connection
    client.connection_pool.disconnect()  # e.g. a restart: the borrowed ones are closed too
    assert queue.enqueue("after").created and queue.counts()["pending"] == 1201
    # Server side, this connection too, closed after its reply: the next command may find it
    # not yet closed and be reset (the client's one retry on a new connection covers it).
    client.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "no")
    assert queue.enqueue("after a kill").created and queue.counts()["pending"] == 1202
    client.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "no")
    assert client.ping() and queue.counts()["pending"] == 1202


def test_a_client_for_a_url_retries_once_on_a_new_connection(valkey_server: Any) -> None:
    import redis

    client = conf.client_for_url(valkey_server.url + "?client_name=retry-once")
    retry = client.connection_pool.connection_kwargs["retry"]
    assert retry.get_retries() == 1 and retry._supported_errors == (redis.ConnectionError,)
    for _ in range(200):  # on a loaded machine a few pings find their connection not yet closed
        client.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "no")
        assert client.ping()


def test_calls_go_on_after_valkey_forgets_its_scripts(queue: Queue, valkey: Any) -> None:
    queue.enqueue("loaded")
    valkey.script_flush()  # on a cluster: every primary
    assert not any(valkey.script_exists(scripts.source("enqueue").sha))
    refs = queue.enqueue_many([JobSpec(i) for i in range(1200)])  # chunks sent together
    assert len({r.id for r in refs}) == 1200 and queue.counts()["pending"] == 1201
    valkey.script_flush()
    assert len(claim_all(queue, 2000)) == 1201


def test_a_bulk_enqueue_whose_connection_drops_mid_stream_writes_each_job_once(
        valkey_server: Any) -> None:
    import redis

    client = redis.Redis.from_url(valkey_server.url, **conf.CLIENT_OPTIONS)
    killer = redis.Redis.from_url(valkey_server.url)
    queue = Queue("default", client=client)
    queue.enqueue("warm")  # the script is loaded and a connection borrowed
    jobs = [prepare(JobSpec(i), queue.options) for i in range(1500)]

    def calls() -> Any:  # chunks are sent as they are built: drop the connection after two
        for start in range(0, 1500, 500):
            if start == 1000:
                killer.client_kill_filter(_type="normal", skipme=True)
            args: list[Any] = ["", 500]
            for job in jobs[start:start + 500]:
                args.extend((job.job_id, job.payload, *twins.enqueue_tail(job, queue.options)))
            yield args

    replies = caller.run_many(queue.client, "enqueue", queue.shard(0), calls())
    # Sent again another way: the chunks that had arrived answer 'exists' (the same ids and
    # payloads), the last 'new'; every job is there once. (Each reply opens with the shard's
    # 'listed' flag.)
    assert [reply[2::2] for reply in replies] in (
        [["new"] * 500] * 3, [["exists"] * 500] * 2 + [["new"] * 500],
        [["exists"] * 500] * 3)
    assert [reply[1::2] for reply in replies] == [[j.job_id for j in jobs[s:s + 500]]
                                                 for s in range(0, 1500, 500)]
    assert queue.counts()["pending"] == 1501


FORK = """
import os, django
django.setup()
from jobqueue import Queue
queue = Queue("default")
queue.enqueue("parent")  # the parent holds a borrowed connection now
child = os.fork()  # as a preloading server (gunicorn --preload) forks its workers
wanted = [f"JOB{1 if child == 0 else 2}{i:010d}" for i in range(300)]
ok = [queue.enqueue(i, job_id=i).id for i in wanted] == wanted  # each its own reply
if child == 0:
    os._exit(0 if ok else 1)
assert os.waitpid(child, 0)[1] == 0 and ok
"""


def test_a_forked_child_never_shares_its_parents_connections(valkey_server: Any) -> None:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "VALKEY_URL": valkey_server.url}
    done = subprocess.run([sys.executable, "-c", FORK], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert Queue("default").counts()["pending"] == 601  # replies never crossed: each job once


# -- bad input --------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["a{b}", "has space", "", "x" * 65, "tab\t", None, "ü", "ok\n"])
def test_bad_queue_names_are_refused_before_anything_is_sent(name: Any) -> None:
    with pytest.raises(InvalidName, match="letters, digits"):
        Queue(name)


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"priority": 101}, InvalidPriority, "-100…100"),
        ({"priority": "high"}, InvalidPriority, "integer"),
        ({"priority": True}, InvalidPriority, "integer"),
        ({"lane": "a b"}, InvalidName, "lane"),
        ({"lane": "{x}"}, InvalidName, "lane"),
        ({"delay": -1}, InvalidOption, "delay"),
        ({"max_attempts": 0}, InvalidOption, "max_attempts"),
        ({"job_id": "JOB123"}, InvalidJobId, "malformed"),
        ({"unique_key": ""}, InvalidOption, "unique_key"),
        ({"run_after": "tomorrow"}, InvalidOption, "timezone-aware"),
    ],
)
def test_bad_options_are_refused_with_what_is_allowed(
    queue: Queue, options: dict, error: type, message: str
) -> None:
    with pytest.raises(error, match=message):
        queue.enqueue("p", **options)
    assert queue.counts()["pending"] == 0


def test_non_json_payload_is_refused_and_a_bad_batch_writes_nothing(queue: Queue) -> None:
    with pytest.raises(InvalidPayload, match="not JSON-serialisable"):
        queue.enqueue({"when": object()})
    with pytest.raises(InvalidPayload):
        queue.enqueue_many([JobSpec(1), JobSpec(float("nan"))])
    looped: list[Any] = []
    looped.append(looped)
    with pytest.raises(InvalidPayload, match="refers to itself"):
        queue.enqueue({"a": looped})
    with pytest.raises(InvalidPayload, match=r"not JSON-serialisable.*keys must be str"):
        queue.enqueue({(1, 2): "a tuple key"})
    assert queue.counts()["pending"] == 0
    # What JSON can say is kept as it was sent (a str subclass, non-ASCII text, big integers).
    sent = {"name": type("Name", (str,), {})("Zoë"), "big": 2**80, "f": 0.1, "nested": [[{}]]}
    job = queue.dequeue(worker="w") if queue.enqueue(sent) else []
    assert job[0].payload == {"name": "Zoë", "big": 2**80, "f": 0.1, "nested": [[{}]]}


def test_malformed_ids_are_refused_by_operator_calls(queue: Queue) -> None:
    for call in (queue.retry, queue.cancel, queue.get):
        with pytest.raises(InvalidJobId):
            call("nope")


def test_a_claim_that_fails_midway_puts_back_what_it_popped(queue: Queue) -> None:
    refs = queue.enqueue_many([JobSpec(i, lane="l") for i in range(3)])
    broken = [3, "not-a-number", "0", "w", 1000, 1000, 0, 0, 0, 0, 0, 0, "", 0]  # a bad lease
    with pytest.raises(Exception, match="arithmetic"):
        caller.run(queue.client, "claim", queue.shard(0), broken)
    assert queue.counts()["pending"] == 3  # nothing stranded: still on the lane and the ring
    assert [lease.job_id for lease in claim_all(queue)] == [r.id for r in refs]


def test_heads_are_the_first_job_of_each_priority_band_of_each_lane(queue: Queue) -> None:
    a = queue.enqueue("a")
    queue.enqueue("a2")
    b = queue.enqueue("b", lane="l1")
    low = queue.enqueue("low", lane="l1", priority=-5)
    queue.enqueue("c", delay=60)
    heads = backlog.heads(queue, 0)
    assert {(lane, job_id) for lane, job_id, _ in heads} == {("", a.id), ("l1", b.id), ("l1", low.id)}
    assert all(ready > 0 for _, _, ready in heads)
    wait = backlog.oldest_wait(queue)
    assert wait is not None and 0 <= wait < 5
    queue.cancel(b.id)
    queue.cancel(low.id)
    claim_all(queue)
    assert backlog.heads(queue, 0) == [] and backlog.oldest_wait(queue) is None


def test_outcomes_are_counted_per_minute(queue: Queue, valkey: Any) -> None:
    queue.enqueue("ok")
    queue.enqueue("bad", max_attempts=2)
    for lease in claim_all(queue):
        if lease.payload == "ok":
            queue.ack(lease)
        else:
            queue.nack(lease, "x", retry_in=0)
    [lease] = claim_all(queue)
    queue.nack(lease, "y")
    minute = int(time.time() // 60)
    [key] = [k for k in (f"emq:{{default}}:m:{m}" for m in (minute, minute - 1)) if valkey.exists(k)]
    assert valkey.hgetall(key) == {"succeeded": "1", "failed": "2", "dead": "1"}
    assert 0 < valkey.ttl(key) <= 7200


def test_an_oversized_payload_is_refused_with_the_limit(queue: Queue, settings: Any) -> None:
    settings.JOBQUEUE = {**settings.JOBQUEUE, "MAX_PAYLOAD": 1000}
    with pytest.raises(InvalidPayload, match="limit is 1,000"):
        Queue("default", client=queue.client).enqueue("x" * 2000)
    assert Queue("default", client=queue.client).enqueue("x" * 900).created


def test_after_a_shrink_jobs_on_retired_shards_stay_reachable(valkey: Any) -> None:
    wide = Queue("shrunk", client=valkey, shards=4)
    # Fixed ids (random ones left shard 3 without a pending job once in a few hundred runs).
    refs = wide.enqueue_many([JobSpec(i, job_id=f"JOB{i + 1:011d}", delay=0.05 if i % 2 else None)
                              for i in range(40)])
    far = next(r for r in refs if layouts.place(r.id, "", "", wide.shards) == 3
               and wide.get(r.id).state == "pending")  # type: ignore[union-attr]
    narrow = Queue("shrunk", client=valkey, shards=1)
    assert narrow.get(far.id) is not None  # get_job, retry, cancel find it on shard 3
    assert narrow.cancel(far.id) == "cancelled"
    wait_past(valkey, *(wide.shard(i).key("schedule") for i in range(4)))
    assert narrow.promote() == 20  # maintenance covers the retired shards too
    assert len(narrow.dequeue(count=100)) == 39
