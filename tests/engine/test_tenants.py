"""Tenant controls, script by script, on Valkey and Valkey Cluster: lane caps (a slot per running
job of a capped lane, freed once by whatever ends the attempt), lane rates, debounce and expiry.
The runs with real workers are in test_tenant_workers.py."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from jobqueue import Queue, conf
from jobqueue.engine import backlog, handoff, lanes
from jobqueue.exceptions import InvalidName, InvalidOption, InvalidTransition
from jobqueue.keys import placement_hash
from jobqueue.records import Lease
from jobqueue.spec import JobSpec
from tests.engine.test_resize import moved_lane, settle
from tests.servers import server_ms, wait_past
from tests.workers import wait_for

Make = Callable[..., Queue]


@pytest.fixture
def make(settings: Any, valkey: Any) -> Make:
    """A queue `t` with the given options, on the test's Valkey (standalone or cluster)."""
    def made(**options: Any) -> Queue:
        settings.JOBQUEUE = {**settings.JOBQUEUE, "QUEUES": {"default": {}, "t": options}}
        conf.reset()
        return Queue("t", client=valkey)
    return made


def claim(queue: Queue, n: int = 100, lease: float = 30) -> list[Lease]:
    return queue.dequeue(count=n, lease=lease, worker="w")


def lanes_of(leases: list[Lease]) -> Counter[str]:
    return Counter(lease.payload[0] for lease in leases)


def fill(queue: Queue, counts: dict[str, int]) -> None:
    queue.enqueue_many([JobSpec([lane, i], lane=lane) for lane, n in counts.items()
                        for i in range(n)])


def slots(queue: Queue) -> dict[str, int]:
    return {k: int(v) for k, v in queue.client.hgetall(queue.shard(0).key("slots")).items()}


def ring(queue: Queue) -> list[str]:
    return queue.client.lrange(queue.shard(0).key("ring"), 0, -1)


# -- lane caps --------------------------------------------------------------------------------

def test_a_lane_at_its_cap_leaves_the_ring_and_a_success_brings_it_back(make: Make) -> None:
    queue = make(lane_concurrency=2)
    fill(queue, {"a": 5, "b": 3})
    first = claim(queue)
    assert lanes_of(first) == {"a": 2, "b": 2} and slots(queue) == {"a": 2, "b": 2}
    assert ring(queue) == []  # both held at their cap (with work left): claims skip them
    assert queue.client.smembers(queue.shard(0).key("capped")) == {"a", "b"}
    assert claim(queue) == [] and queue.counts()["pending"] == 4  # held lanes still count
    done = next(lease for lease in first if lease.payload[0] == "a")
    assert queue.ack(done)
    assert ring(queue) == ["a"] and slots(queue) == {"a": 1, "b": 2}
    assert lanes_of(claim(queue)) == {"a": 1}


def test_a_replayed_ack_frees_no_second_slot(make: Make) -> None:
    queue = make(lane_concurrency=2)
    fill(queue, {"a": 4})
    one, two = claim(queue)
    assert queue.ack(one) and queue.ack(one)  # the second is the same success, sent again
    assert slots(queue) == {"a": 1}
    answers, leases = queue.ack_and_dequeue([(one, "null")], count=10, worker="w")
    assert answers == [True] and len(leases) == 1 and slots(queue) == {"a": 2}  # one slot, one job
    assert queue.nack(one, "late") is None and queue.release(one) is False
    assert slots(queue) == {"a": 2}
    assert queue.ack(two) and slots(queue) == {"a": 1}


@pytest.mark.parametrize("how", ["nack", "release", "cancel", "reap", "fatal"])
def test_every_end_of_an_attempt_frees_its_slot_once(make: Make, how: str) -> None:
    queue = make(lane_concurrency=1, lease=0.2)
    fill(queue, {"a": 2})
    [lease] = claim(queue, lease=0.2 if how == "reap" else 30)
    assert claim(queue) == [] and slots(queue) == {"a": 1}
    if how == "nack":
        assert queue.nack(lease, "boom", retry_in=0) == "pending"
    elif how == "fatal":
        assert queue.nack(lease, "boom", fatal=True) == "dead"
    elif how == "release":
        assert queue.release(lease)
    elif how == "cancel":
        assert queue.cancel(lease.job_id) == "active"
        assert slots(queue) == {"a": 1}  # flagged: the slot is freed by the run's outcome
        assert queue.ack(lease)
        assert queue.get(lease.job_id).state == "cancelled"  # type: ignore[union-attr]
    else:
        wait_past(queue.client, queue.shard(0).key("active"))
        assert queue.reap() == 1
    assert slots(queue) == {}
    assert len(claim(queue)) == 1 and slots(queue) == {"a": 1}  # the lane goes on
    # The old token frees nothing (after `cancel` this ack is the one that recorded it, sent
    # again: answered as it was).
    assert queue.ack(lease) is (how == "cancel") and slots(queue) == {"a": 1}


def wake_tokens(queue: Queue) -> int:
    return queue.client.llen(queue.shard(0).key("wake"))


def test_an_ack_wakes_a_worker_per_lane_it_brings_back_and_a_claim_only_for_what_it_leaves(
        make: Make) -> None:
    queue = make(lane_concurrency=1)
    fill(queue, {"a": 3, "b": 3, "c": 3, "d": 1})
    first = claim(queue)
    assert lanes_of(first) == {"a": 1, "b": 1, "c": 1, "d": 1} and ring(queue) == []
    queue.client.delete(queue.shard(0).key("wake"))  # (the enqueue's tokens)
    by_lane = {lease.payload[0]: lease for lease in first}
    assert queue.ack(by_lane["d"]) and wake_tokens(queue) == 0  # its lane was not held
    queue.ack_many([(by_lane[lane], None) for lane in "abc"])  # one call, three lanes back
    assert sorted(ring(queue)) == ["a", "b", "c"] and wake_tokens(queue) == 3
    queue.client.delete(queue.shard(0).key("wake"))
    second = claim(queue)
    assert lanes_of(second) == {"a": 1, "b": 1, "c": 1} and ring(queue) == []
    # Successes riding a claim that takes every lane they bring back: nobody else to wake ...
    answers, third = queue.ack_and_dequeue([(lease, "null") for lease in second], count=10,
                                           worker="w")
    assert answers == [True] * 3 and lanes_of(third) == {"a": 1, "b": 1, "c": 1}
    assert wake_tokens(queue) == 0 and ring(queue) == []
    # ... and one that takes one of three: a token for each lane it leaves on the ring.
    fill(queue, {"x": 2, "y": 2, "z": 2})
    fourth = claim(queue)
    assert lanes_of(fourth) == {"x": 1, "y": 1, "z": 1} and ring(queue) == []
    queue.client.delete(queue.shard(0).key("wake"))
    _, fifth = queue.ack_and_dequeue([(lease, "null") for lease in fourth], count=1, worker="w")
    assert len(fifth) == 1 and len(ring(queue)) == 2 and wake_tokens(queue) == 2


def test_a_slot_mark_left_by_an_earlier_attempt_frees_nothing_once_the_lane_is_uncapped(
        make: Make) -> None:
    queue = make()
    queue.set_lane_concurrency("a", 1)
    fill(queue, {"a": 1})
    [first] = claim(queue)
    assert queue.nack(first, "boom", retry_in=0) == "pending" and slots(queue) == {}
    queue.set_lane_concurrency("a", None)
    [again] = claim(queue)  # uncapped now: this attempt takes no slot
    assert again.job_id == first.job_id and slots(queue) == {}
    queue.set_lane_concurrency("a", 1)
    fill(queue, {"a": 2})
    [held] = claim(queue)
    assert slots(queue) == {"a": 1}
    assert queue.ack(again) and slots(queue) == {"a": 1}  # the other job's slot stays taken
    assert claim(queue) == []  # so the cap holds
    assert queue.ack(held) and slots(queue) == {} and len(claim(queue)) == 1


def test_a_turn_keeps_only_the_slots_of_the_jobs_it_leased(make: Make, valkey: Any) -> None:
    queue = make(lane_concurrency=3)
    refs = queue.enqueue_many([JobSpec(["a", i], lane="a", expires=timedelta(hours=1))
                               for i in range(6)])
    valkey.delete(queue.shard(0).job(refs[0].id))  # a stale entry: its row is gone
    valkey.hset(queue.shard(0).job(refs[1].id), "expires_at", 1)  # past its expiry
    first = claim(queue)  # the lane alone: one turn takes its room (3 slots) at once
    assert [lease.job_id for lease in first] == [r.id for r in refs[2:5]]
    assert slots(queue) == {"a": 3}
    assert queue.get(refs[1].id).state == "expired"  # type: ignore[union-attr]
    assert claim(queue) == [] and slots(queue) == {"a": 3}  # held: nothing reserved in vain
    queue.ack_many([(lease, None) for lease in first])
    assert slots(queue) == {} and len(claim(queue)) == 1 and slots(queue) == {"a": 1}


def test_a_lane_rate_below_the_caps_room_leaves_the_rest_of_the_room_free(make: Make) -> None:
    queue = make(lane_concurrency=5, lane_rate="2/m")
    fill(queue, {"a": 6})
    assert len(claim(queue)) == 2 and slots(queue) == {"a": 2}  # two tokens: two slots
    assert ring(queue) == [] and queue.client.zscore(queue.shard(0).key("rated"), "a")


def test_a_dict_of_caps_names_lanes_and_every_other_named_lane(make: Make) -> None:
    queue = make(lane_concurrency={"vip": 3, "*": 1})
    fill(queue, {"vip": 5, "x": 5, "y": 5})
    queue.enqueue_many([JobSpec(["", i]) for i in range(5)])  # the default lane: uncapped here
    assert lanes_of(claim(queue)) == {"vip": 3, "x": 1, "y": 1, "": 5}


def test_caps_hold_with_weighted_lanes_and_the_ring_stays_exact(make: Make) -> None:
    queue = make(lane_concurrency=2, lane_weights={"vip": 3})
    fill(queue, {"vip": 6, "x": 6, "y": 1})
    taken = []
    while batch := claim(queue, 1):  # single claims, as a --concurrency 1 worker does
        taken += batch
    assert lanes_of(taken) == {"vip": 2, "x": 2, "y": 1}
    assert ring(queue) == [] and queue.client.smembers(queue.shard(0).key("capped")) == {"vip", "x"}
    queue.ack_many([(lease, None) for lease in taken])
    assert sorted(ring(queue)) == ["vip", "x"]  # each once: back with work, held no more
    assert lanes_of(claim(queue)) == {"vip": 2, "x": 2}


def test_a_lane_at_its_cap_leaves_the_ring_at_the_next_look_and_claims_skip_it_after(
        make: Make) -> None:
    queue = make(lane_concurrency=1)
    fill(queue, {f"t{i}": 2 for i in range(1000)})
    first = claim(queue, 900)
    assert len(first) == 900  # 900 lanes at their cap, each with a job waiting
    assert len(ring(queue)) == 1000  # (still on the ring: a slot may free before the next look)
    assert len(claim(queue, 150)) == 100  # the 100 with room; each held lane left as it was met
    assert ring(queue) == [] and queue.client.scard(queue.shard(0).key("capped")) == 1000
    assert claim(queue, 100) == []  # nothing left to look at until a slot frees
    assert queue.ack(first[5]) and ring(queue) == [first[5].payload[0]]
    assert lanes_of(claim(queue, 100)) == {first[5].payload[0]: 1}


def test_lanes_met_at_their_cap_do_not_cut_a_claim_short(make: Make) -> None:
    queue = make(lane_concurrency=1)
    fill(queue, {f"t{i}": 2 for i in range(7)})
    held = [lease for _ in range(7) for lease in claim(queue, 1)]  # each lane at its cap
    assert len(held) == 7 and ring(queue) == [f"t{i}" for i in range(7)]
    assert queue.ack(held[5])  # t5 has room again, behind five lanes at their cap
    assert lanes_of(claim(queue, 1)) == {"t5": 1}  # (those five left the ring on the way)
    assert ring(queue) == ["t6"] and queue.client.scard(queue.shard(0).key("capped")) == 5


def test_a_cap_set_live_wins_outlives_the_queue_object_and_can_be_dropped(make: Make) -> None:
    queue = make()
    fill(queue, {"a": 6})
    queue.set_lane_concurrency("a", 1)
    assert len(claim(queue)) == 1
    again = Queue("t", client=queue.client)  # (a restart reads the same caps)
    assert claim(again) == [] and lanes.live_caps(queue.client, "t") == {"a": 1}
    again.set_lane_concurrency("a", 3)  # raised: the held lane comes back at once
    assert len(claim(again)) == 2
    again.set_lane_concurrency("a", None)
    assert len(claim(again)) == 3 and slots(queue) == {"a": 3}  # uncapped: slots still freed
    assert lanes.live_caps(queue.client, "t") == {}


def test_a_live_star_cap_and_the_settings_caps_combine(make: Make) -> None:
    queue = make(lane_concurrency={"vip": 2})
    queue.set_lane_concurrency("*", 1)
    fill(queue, {"vip": 5, "x": 5})
    assert lanes_of(claim(queue)) == {"vip": 2, "x": 1}
    states = {s.lane: s for s in lanes.states(queue.client, "t", 1, queue.options)}
    assert (states["vip"].cap, states["vip"].live, states["vip"].active) == (2, False, 2)
    assert (states["x"].cap, states["x"].live, states["x"].held) == (1, True, "cap")


def test_a_cap_set_live_holds_on_the_shards_a_raised_shards_setting_adds(make: Make) -> None:
    make().set_lane_concurrency("a", 1)
    wider = make(shards=4)  # (a deploy raised the setting: no resize)
    wider.enqueue_many([JobSpec(i, lane="a") for i in range(3)])
    shard = wider.shard(placement_hash("a") % 4)
    assert shard.index != 0 and wider.client.hgetall(shard.key("caps")) == {"a": "1"}
    assert len(claim(wider)) == 1  # the cap holds on the lane's new shard
    wider.client.hset(shard.key("idle"), "idle-worker", "30000:0")  # an idle offer there
    ref = wider.enqueue("x", lane="a")
    assert wider.get(ref.id).state == "pending"  # type: ignore[union-attr]  # no hand-off


@pytest.mark.parametrize(("lane", "cap", "error"), [
    ("a", 0, InvalidOption), ("a", -1, InvalidOption), ("a", 1.5, InvalidOption),
    ("a b", 2, InvalidName),
])
def test_a_bad_live_cap_is_refused_and_changes_nothing(make: Make, lane: str, cap: Any,
                                                      error: type) -> None:
    queue = make()
    with pytest.raises(error):
        queue.set_lane_concurrency(lane, cap)
    assert lanes.live_caps(queue.client, "t") == {}


def test_a_live_cap_stops_hand_offs(make: Make) -> None:
    queue = make()
    queue.client.hset(queue.shard(0).key("idle"), "idle-worker", "30000:0")  # an idle offer
    queue.set_lane_concurrency("a", 1)
    ref = queue.enqueue("x", lane="a")
    assert queue.get(ref.id).state == "pending"  # type: ignore[union-attr]
    queue.set_lane_concurrency("a", None)
    assert len(claim(queue)) == 1  # (nothing else ready, so the next job may be handed over)
    handed = queue.enqueue("y", lane="b")
    assert queue.get(handed.id).state == "active"  # type: ignore[union-attr]


def test_queues_with_lane_limits_never_offer_hand_offs(make: Make) -> None:
    assert not make().options.claim_only
    assert make(lane_concurrency=2).options.claim_only and make(lane_rate="5/s").options.claim_only


@pytest.mark.parametrize("held", ["cap", "rate"])
def test_a_held_lanes_jobs_count_in_the_oldest_wait_and_the_lane_heads(make: Make,
                                                                       held: str) -> None:
    queue = make(**{"lane_concurrency": 1} if held == "cap" else {"lane_rate": "1/m"})
    waiting = [ref.id for ref in queue.enqueue_many([JobSpec(i, lane="a") for i in range(2)])]
    assert len(claim(queue)) == 1 and ring(queue) == []  # held back, one job still waiting
    assert [(lane, job_id) for lane, job_id, _ in backlog.heads(queue, 0)] == [("a", waiting[1])]
    wait = backlog.oldest_wait(queue)
    assert wait is not None and wait >= 0


# -- lane rates -------------------------------------------------------------------------------

def test_a_lane_out_of_tokens_leaves_the_ring_until_its_next_token(make: Make) -> None:
    queue = make(lane_rate="2/s")
    fill(queue, {"a": 6, "b": 6})
    queue.enqueue_many([JobSpec(["", i]) for i in range(3)])  # the default lane has no lane rate
    assert lanes_of(claim(queue)) == {"a": 2, "b": 2, "": 3}
    assert ring(queue) == [] and 0 < queue.rate_wait <= 0.5  # the worker sleeps until then
    rated = queue.client.zrange(queue.shard(0).key("rated"), 0, -1)
    assert sorted(rated) == ["a", "b"] and queue.counts()["pending"] == 8
    start, taken = server_ms(queue.client), []
    wait_for(lambda: taken.extend(claim(queue)) or len(taken) >= 2)
    elapsed = (server_ms(queue.client) - start) / 1000
    assert len(taken) <= 2 * (2 * elapsed + 1)  # each lane: 2 a second on the server clock


def test_promote_brings_a_rated_lane_back_and_says_when_the_next_is_due(make: Make) -> None:
    queue = make(lane_rate="1/s")
    fill(queue, {"a": 3})
    assert len(claim(queue)) == 1
    _, wait = queue.promote_shard(0)
    assert wait is not None and 0 < wait <= 1.0
    wait_past(queue.client, queue.shard(0).key("rated"))
    assert queue.promote_shard(0)[1] is None and ring(queue) == ["a"]


# -- resize -----------------------------------------------------------------------------------

@pytest.mark.parametrize("held", ["cap", "rate"])
def test_a_resize_does_not_settle_while_a_held_lane_still_waits_on_its_prior_shard(
        make: Make, held: str) -> None:
    queue = make(**{"lane_concurrency": 1} if held == "cap" else {"lane_rate": "1/m"})
    lane = moved_lane(1, 2)
    waiting = [ref.id for ref in queue.enqueue_many([JobSpec(i, lane=lane) for i in range(3)])]
    [lease] = claim(queue)
    assert ring(queue) == [] and queue.counts()["pending"] == 2  # held off the ring, waiting
    queue.resize(2)
    assert settle(queue) is None  # its jobs still wait on shard 0, their prior shard
    for job_id in waiting[1:]:
        queue.cancel(job_id)
    assert settle(queue) is not None  # (its running job holds nothing back)
    assert queue.ack(lease)


# -- debounce ---------------------------------------------------------------------------------

def test_debounce_replaces_the_waiting_job_and_moves_its_start(queue: Queue) -> None:
    first = queue.enqueue({"v": 1}, unique_key="k", debounce=60)
    again = queue.enqueue({"v": 2}, unique_key="k", debounce=60)
    assert again.id == first.id and first.created and not again.created
    info = queue.get(first.id)
    assert info and info.state == "scheduled" and info.payload == {"v": 2}
    assert queue.counts()["scheduled"] == 1


def test_a_debounced_job_once_started_leaves_the_key_to_a_new_job(queue: Queue, valkey: Any) -> None:
    first = queue.enqueue({"v": 1}, unique_key="k", debounce=0.05)
    wait_past(valkey, queue.shard(0).key("schedule"))
    queue.promote()
    [lease] = claim(queue)
    second = queue.enqueue({"v": 2}, unique_key="k", debounce=60)
    assert second.id != first.id and second.created
    assert queue.ack(lease)  # the first finishes: the key (and its index) stay the second's
    assert valkey.get(queue.shard(0).key("uniq:k")) == second.id
    assert valkey.sismember(queue.shard(0).key("uniqs"), "k")
    assert queue.enqueue({"v": 3}, unique_key="k", debounce=60).id == second.id


@pytest.mark.parametrize("again", ["retry later", "retry now", "release", "reap", "operator"])
def test_a_debounced_enqueue_never_replaces_a_job_that_started(queue: Queue, valkey: Any,
                                                              again: str) -> None:
    first = queue.enqueue({"v": 1}, unique_key="k", debounce=0.05)
    wait_past(valkey, queue.shard(0).key("schedule"))
    queue.promote()
    [lease] = queue.dequeue(count=1, lease=0.05 if again == "reap" else 30, worker="w")
    if again == "retry later":
        assert queue.nack(lease, "boom", retry_in=60) == "scheduled"
    elif again == "retry now":
        assert queue.nack(lease, "boom", retry_in=0) == "pending"
    elif again == "release":
        assert queue.release(lease)
    elif again == "reap":
        wait_past(valkey, queue.shard(0).key("active"))
        assert queue.reap() == 1
    else:
        assert queue.nack(lease, "boom", fatal=True) == "dead"
        assert queue.retry(first.id) == "pending"
    waiting = queue.get(first.id)
    second = queue.enqueue({"v": 2}, unique_key="k", debounce=60)
    assert second.id != first.id and second.created  # a job of its own, with the new arguments
    assert queue.get(first.id) == waiting  # the started job goes on as it was
    assert valkey.get(queue.shard(0).key("uniq:k")) == second.id
    assert queue.enqueue({"v": 3}, unique_key="k", debounce=60).id == second.id  # debounces it
    assert queue.get(second.id).payload == {"v": 3}  # type: ignore[union-attr]
    if waiting and waiting.state == "pending":
        assert [(lease.job_id, lease.payload) for lease in claim(queue)] == [(first.id, {"v": 1})]


def test_a_pending_job_debounced_again_leaves_its_lane(queue: Queue, valkey: Any) -> None:
    first = queue.enqueue("a", unique_key="k", lane="l", debounce=0.05)
    wait_past(valkey, queue.shard(0).key("schedule"))
    queue.promote()
    assert ring(queue) == ["l"]
    assert queue.enqueue("b", unique_key="k", lane="l", debounce=60).id == first.id
    assert ring(queue) == [] and queue.counts()["pending"] == 0 and claim(queue) == []


def test_a_debounced_enqueue_replaces_the_expiry_too(queue: Queue, valkey: Any) -> None:
    first = queue.enqueue({"v": 1}, unique_key="k", debounce=0.05, expires=0.1)
    queue.enqueue({"v": 2}, unique_key="k", debounce=0.2)  # no expiry: the job has none now
    assert valkey.hget(queue.shard(0).job(first.id), "expires_at") is None
    wait_past(valkey, queue.shard(0).key("schedule"))  # past the first enqueue's expiry too
    queue.promote()
    assert [(lease.job_id, lease.payload) for lease in claim(queue)] == [(first.id, {"v": 2})]
    queue.enqueue({"v": 3}, unique_key="j", debounce=0.05, expires=60)
    again = queue.enqueue({"v": 4}, unique_key="j", debounce=0.05, expires=0.1)
    due = int(valkey.hget(queue.shard(0).job(again.id), "run_after"))
    assert due < int(valkey.hget(queue.shard(0).job(again.id), "expires_at")) <= due + 100


def test_a_batch_that_debounces_its_own_job_leaves_no_job_of_that_lane_off_the_ring(
        queue: Queue) -> None:
    first, again, other = queue.enqueue_many([
        JobSpec("a", lane="l", unique_key="k"),
        JobSpec("b", lane="l", unique_key="k", debounce=60),  # takes the first off its lane
        JobSpec("c", lane="l"),  # the lane has work again: it must be back on the ring
    ])
    assert again.id == first.id and other.created
    assert ring(queue) == ["l"] and queue.counts()["pending"] == 1
    assert [lease.job_id for lease in claim(queue)] == [other.id]


@pytest.mark.parametrize(("options", "message"), [
    ({"debounce": 5}, "debounce needs a unique_key"),
    ({"debounce": 5, "unique_key": "k", "delay": 1}, "debounce or delay/run_after"),
    ({"debounce": 0, "unique_key": "k"}, "debounce must be within"),
    ({"expires": -1}, "expires must be within"),
    ({"expires": datetime(2020, 1, 1, tzinfo=UTC)}, "expires is in the past"),
    ({"expires": datetime(2999, 1, 1)}, "timezone-aware"),
    ({"expires": 5, "delay": 10}, "could never run"),
    ({"expires": "soon"}, "expires must be a number of seconds"),
])
def test_bad_debounce_and_expiry_are_refused(queue: Queue, options: dict, message: str) -> None:
    with pytest.raises(InvalidOption, match=message):
        queue.enqueue("p", **options)
    assert queue.counts() == dict.fromkeys(queue.counts(), 0)


# -- expiry -----------------------------------------------------------------------------------

def test_a_job_past_its_expiry_ends_expired_in_the_claim(queue: Queue, valkey: Any) -> None:
    late = queue.enqueue("late", expires=0.05)
    ok = queue.enqueue("ok", expires=timedelta(hours=1))
    wait_for(lambda: server_ms(valkey) > int(valkey.hget(queue.shard(0).job(late.id), "expires_at")))
    assert [lease.job_id for lease in claim(queue)] == [ok.id]
    info = queue.get(late.id)
    assert info and info.state == "expired" and info.started_at is None
    assert queue.counts()["expired"] == 1 and queue.counts()["pending"] == 0
    event = valkey.xrange(queue.shard(0).key("done"))[-1][1]
    assert event["state"] == "expired"
    assert queue.retry(late.id) == "pending"  # an operator may still run it: without an expiry
    assert [lease.job_id for lease in claim(queue)] == [late.id]


def test_a_paused_queue_never_runs_its_expired_jobs(queue: Queue, valkey: Any) -> None:
    queue.pause()
    ref = queue.enqueue("x", expires=0.05, lane="l")
    wait_for(lambda: server_ms(valkey) > int(valkey.hget(queue.shard(0).job(ref.id), "expires_at")))
    queue.resume()
    assert claim(queue) == [] and queue.get(ref.id).state == "expired"  # type: ignore[union-attr]


def test_a_job_handed_over_keeps_its_expiry(queue: Queue, valkey: Any) -> None:
    shard = queue.shard(0)
    valkey.hset(shard.key("idle"), "w1", "30000:0")
    ref = queue.enqueue("x", expires=0.3)
    assert queue.get(ref.id).state == "active"  # type: ignore[union-attr]
    [handed] = handoff.withdraw(valkey, shard, "w1")  # the worker stopped before taking it: released
    assert queue.release(handed)
    wait_for(lambda: server_ms(valkey) > int(valkey.hget(shard.job(ref.id), "expires_at")))
    assert claim(queue) == [] and queue.get(ref.id).state == "expired"  # type: ignore[union-attr]


def runs_observed(queue: Queue) -> int:
    """How many run durations the shard's histogram holds (jobqueue_job_duration_seconds)."""
    hist = queue.client.hgetall(queue.shard(0).key("hist"))
    return sum(int(n) for le, n in hist.items() if le != "sum_ms")


def test_only_a_run_that_ends_adds_a_duration_not_a_wait_that_ends(queue: Queue, valkey: Any) -> None:
    late = queue.enqueue("late", expires=0.3)
    [lease] = claim(queue)
    assert queue.nack(lease, "boom", retry_in=0) == "pending" and runs_observed(queue) == 1
    wait_for(lambda: server_ms(valkey) > int(valkey.hget(queue.shard(0).job(late.id), "expires_at")))
    assert claim(queue) == [] and queue.get(late.id).state == "expired"  # type: ignore[union-attr]
    assert runs_observed(queue) == 1  # the wait for the retry was no run
    retried = queue.enqueue("retried")
    [lease] = claim(queue)
    assert queue.nack(lease, "boom", retry_in=60) == "scheduled" and runs_observed(queue) == 2
    assert queue.cancel(retried.id) == "cancelled" and runs_observed(queue) == 2
    ran = queue.enqueue("ran")
    [lease] = claim(queue)
    assert queue.ack(lease) and runs_observed(queue) == 3
    assert queue.get(ran.id).state == "succeeded"  # type: ignore[union-attr]


def test_an_expired_job_cannot_be_cancelled(queue: Queue, valkey: Any) -> None:
    ref = queue.enqueue("x", expires=0.05)
    wait_for(lambda: server_ms(valkey) > int(valkey.hget(queue.shard(0).job(ref.id), "expires_at")))
    claim(queue)
    with pytest.raises(InvalidTransition, match="expired"):
        queue.cancel(ref.id)
