"""The hops between a flow's last member and the job waiting for it, against a real server
(standalone and cluster): a success whose ack releases the next job claims it in the same call,
though the worker's last claim found the queue empty; a chord's callback reads every slot; a
released job goes straight to an idle worker of its queue, leased; one delivery applies a run
of a job's outcomes as one by one would; a chord across queues with a taken id writes nothing;
the relay runs on the worker's thread, or on the caller's when that thread does not run."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from jobqueue import Queue, chain, chord
from jobqueue.engine import handoff
from jobqueue.engine.scripts import caller
from jobqueue.exceptions import InvalidFlow
from jobqueue.flows import relay
from jobqueue.records import Lease
from jobqueue.worker import Worker, WorkerConfig
from jobqueue.worker.relaying import Relayer
from jobqueue.worker.serving import Served
from tests.jobapp import jobs
from tests.workers import wait_for

pytestmark = [pytest.mark.django_db(transaction=True)]


def _worker(*queues: str, **options: Any) -> Worker:
    """A worker serving `queues`, driven turn by turn by the test (no waiter, no maintenance)."""
    worker = Worker(WorkerConfig(queues=queues, mirror=False, name="w-1", **options))
    for name in queues:
        worker.served.add(Queue(name), Queue(name).claim_shards())
    worker.start_runners()
    worker.maintenance.hold()
    return worker


def test_the_ack_of_a_chains_step_claims_the_next_step_though_the_queue_looked_empty(
        valkey_url: str) -> None:
    ref = chain(jobs.add.s(2, 3), jobs.mul.s(4)).enqueue()
    worker = _worker("default", concurrency=2)
    try:
        assert worker.turn()  # the first step (and the claim came back short: the queue is
        wait_for(worker.outcomes.unrecorded)  # skipped a moment by the main loop's claims)
        # Its success rides a claim all the same, which takes the step its ack released.
        assert worker.turn()  # main: False (acked alone; the next step waited for a token)
        wait_for(worker.outcomes.unrecorded)
        worker.turn()
        assert ref.result(timeout=10) == 20
    finally:
        assert worker.runners is not None
        worker.runners.stop(wait=True)


def test_a_chord_of_more_members_than_one_read_takes_calls_back_with_every_result_in_order(
        valkey_url: str) -> None:
    # Its release reads the members' outcomes SLOTS_AT_ONCE (1000) at a time (_flows.lua).
    members = 2345
    ref = chord([jobs.add.s(i, 1) for i in range(members)], jobs.total.s()).enqueue()
    queue = Queue("default")
    while (leases := queue.dequeue(count=500)) and leases[0].job_id != ref.id:
        queue.ack_encoded([(lease, str(lease.payload["args"][0] + 1)) for lease in leases])
    assert [lease.job_id for lease in leases] == [ref.id]  # released once every member is done
    assert leases[0].payload["args"][0] == list(range(1, members + 1))


def test_a_chord_across_queues_whose_callbacks_id_is_taken_writes_nothing(two: Queue) -> None:
    taken = jobs.add.using(queue="two").enqueue(1, 1)
    with pytest.raises(InvalidFlow, match=f"job id {taken.id} is taken"):
        chord([jobs.add.s(i, 1) for i in range(20)],
              jobs.total.using(queue="two", job_id=taken.id).s()).enqueue()
    assert Queue("default").counts()["pending"] == 0 and two.counts()["pending"] == 1


def _offer(queue: Queue, index: int, worker: str = "w", offer_id: str = "") -> None:
    """An idle worker's offer on shard `index` of `queue` (as its waiter makes it)."""
    wait = handoff.wait_commands(queue.shard(index), 5, worker,
                                 handoff.offer(queue.lease_ms(), False, offer_id))
    queue.client.execute_command(*wait[0])


def _chord_offered(two: Queue, members: int, offer_id: str = "") -> tuple[str, int]:
    """A chord of `members` on `default` whose callback is on `two`, where a worker "w" offers
    itself: the callback's id and shard."""
    ref = chord([jobs.add.s(i, 0) for i in range(members)], jobs.total.using(queue="two").s()
                ).enqueue()
    index = two.locate(ref.id)
    assert index is not None
    _offer(two, index, offer_id=offer_id)
    return ref.id, index


def _finish_members(count: int) -> None:
    """Claim and ack a chord's `count` members on `default`, then relay what they forwarded."""
    default = Queue("default")
    leases = default.dequeue(count=count + 1)
    assert len(leases) == count
    default.ack_encoded([(lease, str(lease.payload["args"][0])) for lease in leases])
    relay.relay_queue(default)


@pytest.mark.parametrize("paused", [False, True])
def test_a_callback_its_last_member_releases_goes_to_an_idle_worker_of_its_queue_leased(
        two: Queue, paused: bool) -> None:
    callback, index = _chord_offered(two, 3)
    shard = two.shard(index)
    if paused:
        two.pause()
    _finish_members(3)
    if paused:  # (paused: its offer stands, the callback waits for a claim as any job)
        assert two.get(callback).state == "pending"  # type: ignore[union-attr]
        assert two.client.hexists(shard.key("idle"), "w")
        return
    # Handed over as an enqueue hands a lone new job: leased (token 1), no wake token pushed.
    (lease,) = handoff.withdraw(two.client, shard, "w")  # main: [] (pending, a wake token)
    assert (lease.job_id, lease.token, lease.payload["args"]) == (callback, 1, [[0, 1, 2]])
    row = two.client.hgetall(shard.job(callback))
    assert (row["state"], row["attempts"], row["worker"]) == ("active", "1", "w")
    assert two.client.zscore(shard.key("active"), callback) == float(row["lease_until"])
    assert two.client.llen(shard.key("wake")) == 0 and two.counts()["pending"] == 0
    assert two.ack(lease, 3) and two.get(callback).state == "succeeded"  # type: ignore[union-attr]


def test_a_callback_handed_over_says_it_became_ready_at_its_release_as_one_claimed_does(
        two: Queue) -> None:
    # A released job that goes to a lane gets its `run_after` then (make_ready): the console's
    # "ready / due" says when it could run, not when its flow was written. One handed straight
    # to an idle worker became ready in the same call that started it.
    callback, index = _chord_offered(two, 2)
    _finish_members(2)
    row = two.client.hgetall(two.shard(index).job(callback))
    assert row["state"] == "active" and row.get("run_after") == row["started_at"]


@pytest.mark.parametrize("popped", [True, False])
def test_a_hand_off_whose_wait_lost_its_reply_goes_back_uncharged_by_its_offers_id(
        two: Queue, popped: bool) -> None:
    # The waiter's connection failed during a wait with an offer: a job handed over then may
    # have been popped by its BLPOP (the reply lost) or still be on its list. The job carries
    # the offer's id as a claim's does, and the worker hands it back as it does a lost claim's
    # jobs (its budget counts runs: nobody ran it), off the list too (else a later wait would
    # run it a second time).
    callback, index = _chord_offered(two, 2, "o1")
    shard = two.shard(index)
    _finish_members(2)
    if popped:
        assert two.client.lpop(shard.hand("w"))  # (its BLPOP took it; the reply never came)
    assert handoff.recover(two.client, shard, "w", "o1") == 1  # (the worker's, before its next wait)
    row = two.client.hgetall(shard.job(callback))
    assert (row["state"], row["attempts"], row["uncharged"]) == ("pending", "1", "1")
    assert two.client.llen(shard.hand("w")) == 0
    [lease] = two.dequeue(count=5)  # (its one attempt is whole: max_attempts 1)
    assert lease.job_id == callback and lease.token == 2
    assert two.nack(lease, "boom") == "dead"  # (the run it had counted, not the lost one)


def _forwarded(members: int) -> tuple[str, list[list[str]]]:
    """A chord of `members` on `default` whose callback is on `two`, its members acked: the
    callback's id and the entries they forwarded (as deliver takes them, token last)."""
    ref = chord([jobs.add.s(i, 0) for i in range(members)], jobs.total.using(queue="two").s()
                ).enqueue()
    default = Queue("default")
    leases = default.dequeue(count=members)
    default.ack_encoded([(lease, str(10 + lease.payload["args"][0])) for lease in leases])
    entries = [outcome for _, fields in default.client.xrange(default.shard(0).key("outcomes"))
               for outcome in json.loads(fields["pack"])]
    return ref.id, sorted(entries, key=lambda entry: int(entry[1]))


def _deliver(queue: Queue, callback: str, entries: list[list[str]]) -> list[int]:
    index = queue.locate(callback)
    assert index is not None
    return caller.run(queue.client, "deliver", queue.shard(index),
                      [60_000, 1, json.dumps(entries)])


def test_one_delivery_of_a_jobs_outcomes_applies_each_in_turn(two: Queue) -> None:
    # A relay delivers a run of entries for one job at once: replays in it change nothing, an
    # outcome older than its slot's changes nothing, and the job is released once, when the
    # last member's entry empties its set: what comes after in the run finds it released.
    callback, (e0, e1, e2) = _forwarded(3)
    older = [*e1[:5], "999", "0"]  # (token 0: older than the member's attempt 1)
    newer = [*e2[:5], "555", "5"]  # (after the release: too late)
    run = [e0, e0, older, e1, older, e2, newer, e1]
    assert _deliver(two, callback, run) == [0, 0, 1]
    assert _deliver(two, callback, run) == [0, 0, 1]  # (a replay of the whole)
    assert two.counts()["pending"] == 1 and two.counts()["waiting"] == 0
    [lease] = two.dequeue(count=5)
    assert lease.job_id == callback and lease.payload["args"] == [[10, 11, 12]]


def test_a_delivery_of_part_of_a_jobs_outcomes_leaves_it_waiting_for_the_rest(two: Queue) -> None:
    callback, (e0, e1, e2) = _forwarded(3)
    assert _deliver(two, callback, [e2, e0, e2]) == [0, 0, 1]
    assert two.get(callback).state == "waiting"  # type: ignore[union-attr]
    assert _deliver(two, callback, [[*e0[:5], "7", "0"], e1]) == [0, 0, 1]  # (e0's: older)
    [lease] = two.dequeue(count=5)
    assert lease.payload["args"] == [[10, 11, 12]]


def test_one_pack_of_more_successes_than_a_script_can_unpack_at_once_releases_its_job(
        two: Queue) -> None:
    # 2,500 members acked in one call: one pack, one run of 2,500 successes for the callback,
    # applied a thousand at a time (Lua's unpack takes ~8,000 values: 4 an outcome).
    callback, entries = _forwarded(2500)
    assert len(entries) == 2500
    assert relay.relay_shard(Queue("default"), 0) == 1
    [lease] = two.dequeue(count=5)
    assert lease.job_id == callback and lease.payload["args"] == [[10 + i for i in range(2500)]]


def test_a_relay_of_many_packs_delivers_them_a_few_at_a_time(
        two: Queue, monkeypatch: pytest.MonkeyPatch) -> None:
    # Each deliver call takes about DELIVER_BYTES of packs (here: one pack a call).
    monkeypatch.setattr(relay, "DELIVER_BYTES", 1)
    calls: list[int] = []
    deliver = relay.calls.deliver
    monkeypatch.setattr(relay.calls, "deliver",
                        lambda *args, **kw: calls.append(len(args[3])) or deliver(*args, **kw))
    ref = chord([jobs.add.s(i, 0) for i in range(20)], jobs.total.using(queue="two").s()).enqueue()
    default = Queue("default")
    leases = default.dequeue(count=20)
    for at in range(0, 20, 4):
        default.ack_encoded([(lease, str(lease.payload["args"][0])) for lease in leases[at:at + 4]])
    assert relay.relay_shard(default, 0) == 5 and calls == [1] * 5
    [lease] = two.dequeue(count=5)
    assert lease.job_id == ref.id and lease.payload["args"] == [list(range(20))]


def test_a_stopping_worker_relays_what_its_last_runs_forwarded_before_it_ends(two: Queue) -> None:
    # The member still runs when the worker is asked to stop: its ack, recorded by the drain,
    # forwards its outcome, which the worker's relay thread (stopped only after the drain)
    # delivers before the worker ends (its maintenance turn comes only at the start here).
    ref = chord([jobs.square_slowly.s(3, 0.5)], jobs.total.using(queue="two").s()).enqueue()
    default = Queue("default")
    worker = Worker(WorkerConfig(queues=("default",), concurrency=2, mirror=False, name="w-1",
                                 maintenance_every=3600))
    with _running(worker) as thread:
        wait_for(lambda: default.counts()["active"] == 1)
        worker.request_stop()
        thread.join(30)
    assert worker.processed == 1
    assert default.client.xlen(default.shard(0).key("outcomes")) == 0
    assert two.get(ref.id).state == "pending"  # type: ignore[union-attr]


@contextlib.contextmanager
def _running(worker: Worker) -> Iterator[threading.Thread]:
    """`worker.run` on a thread of its own, stopped and joined on the way out."""
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        yield thread
    finally:
        worker.request_stop()
        thread.join(30)
        assert not thread.is_alive()


def test_the_relayer_relays_on_the_callers_thread_when_its_thread_does_not_run_or_now(
        two: Queue) -> None:
    default = Queue("default")
    served, stop = Served(), threading.Event()
    served.add(default, 1)
    relayer = Relayer(served, stop)

    def finished_member() -> tuple[str, Lease]:
        ref = chord([jobs.add.s(1, 2)], jobs.total.using(queue="two").s()).enqueue()
        [lease] = default.dequeue(count=2)
        assert default.ack_encoded([(lease, "3")]) == [2]  # (it forwarded)
        return ref.id, lease

    thread = threading.Thread(target=relayer.run, daemon=True)
    try:
        for when in ("before", "now", "after"):
            if when == "now":  # (its thread runs: `now`, the worker's last outcomes, here)
                thread.start()
                wait_for(lambda: relayer.running)
            if when == "after":  # (its thread ended with the worker's stop)
                stop.set()
                relayer.wake()
                thread.join(10)
                assert not thread.is_alive()
            callback, lease = finished_member()
            relayer.after([lease], now=when == "now")  # (relayed here, before it returns)
            assert default.client.xlen(default.shard(0).key("outcomes")) == 0
            assert two.get(callback).state == "pending"  # type: ignore[union-attr]
    finally:
        stop.set()
        relayer.wake()


def _callback_active(two: Queue, handed: bool) -> tuple[str, Lease]:
    """A chord's callback on `two`, its members done, active: handed straight to the idle worker
    "w" (offer "o1"), or claimed as any job is (no offer stood). Its id and its lease."""
    if handed:
        callback, index = _chord_offered(two, 2, "o1")
        _finish_members(2)
        (lease,) = handoff.withdraw(two.client, two.shard(index), "w")
        return callback, lease
    ref = chord([jobs.add.s(i, 0) for i in range(2)], jobs.total.using(queue="two").s()).enqueue()
    _finish_members(2)
    (lease,) = two.dequeue(count=5, worker="w")
    return ref.id, lease


def _act(two: Queue, action: str, callback: str) -> Any:
    """An operator's action on the active callback: its answer, or the refusal's type."""
    from jobqueue import flows

    try:
        if action == "cancel":
            return two.cancel(callback)
        if action == "retry":
            return two.retry(callback)
        if action == "reprioritize":
            return two.reprioritize(callback, 7)
        if action == "flows.cancel":
            return flows.cancel(callback, "two")
        assert action == "resize"
        return two.resize(3).shards
    except Exception as exc:  # noqa: BLE001 - a refusal is part of what is compared
        return type(exc).__name__


def _ends(two: Queue, callback: str) -> tuple[Any, ...]:
    info = two.get(callback)
    assert info is not None
    return info.state, info.attempts, info.priority, info.result


@pytest.mark.parametrize("finish", ["acked", "lost reply"])
@pytest.mark.parametrize("action", ["cancel", "retry", "reprioritize", "flows.cancel", "resize"])
def test_a_handed_over_callback_meets_each_operator_action_as_a_claimed_one_does(
        two: Queue, action: str, finish: str) -> None:
    # The hand-off is a new way for a flow's job to become active (no claim call): every
    # operator action on it, and then its end (the worker's ack, or a wait whose reply was
    # lost handing it back), must come out as for the same callback claimed the usual way.
    seen = []
    for handed in (False, True):
        two.client.flushall()
        two.resize(2)
        callback, lease = _callback_active(two, handed)
        answer = _act(two, action, callback)
        if finish == "acked":
            acked = two.ack(lease, 21)
        else:  # (the job never reached the worker: handed back uncharged, or its lease lapses)
            index = two.locate(callback)
            assert index is not None
            acked = two.release(lease) if not handed else handoff.recover(
                two.client, two.shard(index), "w", "o1")
        seen.append((answer if action != "resize" else "resized", bool(acked),
                     _ends(two, callback)))
    assert seen[0] == seen[1], seen
