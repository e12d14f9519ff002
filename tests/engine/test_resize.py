"""Live resize (`Queue.resize`, `manage.py jobqueue resize`): grow, shrink, drain and retire,
lanes keep their order and unique keys their single live job, on one Valkey and on a cluster."""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Any

import pytest

from jobqueue import Queue
from jobqueue.engine import layouts
from jobqueue.exceptions import InvalidOption
from jobqueue.keys import placement_hash
from jobqueue.spec import JobSpec


def settle(queue: Queue) -> layouts.Layout | None:
    """What a worker's maintenance does while a resize settles (`layouts.settle`)."""
    return layouts.settle(queue.client, queue.name, queue.configured)


def drain(queue: Queue, batch: int = 7, limit: int = 10**9) -> list[tuple[str, str, int]]:
    """Claim and ack (up to `limit`), in claim order: (lane, job id, shard) per job; a laned
    job's payload is its lane."""
    seen: list[tuple[str, str, int]] = []
    while len(seen) < limit and (leases := queue.dequeue(count=batch, worker="w")):
        for lease in leases:
            seen.append((lease.payload if isinstance(lease.payload, str) else "", lease.job_id,
                         lease.shard))
        queue.ack_many([(lease, None) for lease in leases])
    return seen


def per_shard(queue: Queue) -> dict[int, int]:
    return {i: queue.shard_counts(i)["pending"] for i in range(queue.all_shards())}


def moved_lane(before: int, after: int, skip: int = 0) -> str:
    """A lane name whose shard differs between the two counts."""
    names = (f"player-{i}" for i in range(10_000))
    found = [n for n in names if placement_hash(n) % before != placement_hash(n) % after]
    return found[skip]


def test_growing_spreads_new_jobs_over_every_shard_at_once(valkey: Any) -> None:
    queue = Queue("grow", client=valkey)
    old = queue.enqueue_many([JobSpec(i) for i in range(20)])
    assert queue.resize(4).live == 4 and queue.shards == 4
    new = queue.enqueue_many([JobSpec(i) for i in range(200)])
    assert all(n > 20 for n in list(per_shard(queue).values())[1:])
    assert Counter(job_id for _, job_id, _ in drain(queue)) == Counter(r.id for r in old + new)
    assert settle(queue) is not None and not queue.layout(fresh=True).settling


def test_shrinking_drains_then_retires_shards_and_new_jobs_avoid_them(valkey: Any) -> None:
    queue = Queue("shrink", client=valkey, shards=4)
    old = queue.enqueue_many([JobSpec(i) for i in range(100)])
    queue.resize(2)
    new = queue.enqueue_many([JobSpec(i) for i in range(100)])
    layout = queue.layout(fresh=True)
    assert (layout.live, layout.span) == (2, 4) and layout.status(3) == "draining"
    assert sum(per_shard(queue)[i] for i in (2, 3)) == sum(1 for r in old if queue.locate(r.id) >= 2)
    assert settle(queue) is None  # shards 2 and 3 still hold jobs
    ran = drain(queue)
    assert Counter(job_id for _, job_id, _ in ran) == Counter(r.id for r in old + new)
    settled = settle(queue)
    assert settled is not None and (settled.live, settled.span, settled.prior) == (2, 2, 0)
    assert settled.status(3) == "retired" and queue.claim_shards() == 2 and queue.all_shards() == 4
    assert queue.counts()["succeeded"] == 200  # counters of retired shards still count


def test_a_producer_that_has_not_seen_a_shrink_is_turned_away_not_stranded(valkey: Any) -> None:
    producer = Queue("stale", client=valkey, shards=4)
    producer.layout()  # cached: four live shards
    operator = Queue("stale", client=valkey, shards=4)
    operator.resize(1)
    stale = layouts.Layout(4, 0, 4, 4, "")
    layouts._cache[valkey][("stale", 4)] = (time.monotonic() + 60, stale)
    refs = producer.enqueue_many([JobSpec(i) for i in range(50)])
    assert {producer.locate(r.id) for r in refs} == {0}
    assert producer.layout().live == 1  # it re-read the layout when a shard turned jobs away


def test_one_job_at_a_time_from_a_stale_producer_is_turned_away_too(valkey: Any) -> None:
    # (a single job skips the batching: it must still fall back to reading the layout again)
    producer = Queue("stale1", client=valkey, shards=4)
    producer.layout()
    Queue("stale1", client=valkey, shards=4).resize(1)
    for _ in range(20):
        layouts._cache[valkey][("stale1", 4)] = (time.monotonic() + 60, layouts.Layout(4, 0, 4, 4, ""))
        ref = producer.enqueue({"n": 1})
        assert producer.locate(ref.id) == 0


@pytest.mark.parametrize(("before", "after"), [(2, 3), (3, 2), (1, 4), (4, 1)])
def test_a_lane_keeps_its_order_across_a_resize(valkey: Any, before: int, after: int) -> None:
    queue = Queue("lanes", client=valkey, shards=before)
    lanes = [moved_lane(before, after, k) for k in range(3)] if before > 1 and after > 1 \
        else ["a", "b", "c"]
    queue.enqueue_many([JobSpec(lane, lane=lane) for _ in range(10) for lane in lanes])
    first = drain(queue, batch=2, limit=4)  # a few ran before the resize
    queue.resize(after)
    queue.enqueue_many([JobSpec(lane, lane=lane) for _ in range(10) for lane in lanes])
    ran = first + drain(queue, batch=3)
    queue.enqueue_many([JobSpec(lane, lane=lane) for _ in range(5) for lane in lanes])
    assert settle(queue) is not None  # every moved lane drained from its prior shard
    ran += drain(queue, batch=3)
    for lane in lanes:
        order = [job_id for name, job_id, _ in ran if name == lane]
        assert len(order) == 25 and order == sorted(order), lane  # ids are minted in order
    last = [shard for name, _, shard in ran[-15:]]
    assert all(s == placement_hash(lane) % after for lane, s in zip(
        [name for name, _, _ in ran[-15:]], last, strict=True))


def test_a_unique_key_keeps_its_single_live_job_across_a_resize(valkey: Any) -> None:
    queue = Queue("uniq", client=valkey, shards=2)
    key = next(k for k in (f"order-{i}" for i in range(100))
               if placement_hash(k) % 2 != placement_hash(k) % 5)
    first = queue.enqueue("x", unique_key=key)
    queue.resize(5)
    again = queue.enqueue("y", unique_key=key)
    assert again.id == first.id and not again.created
    assert settle(queue) is None  # the key's live job is still on its prior shard
    drain(queue)
    assert settle(queue) is not None


def test_the_scripts_keep_each_shards_set_of_live_unique_keys(valkey: Any) -> None:
    # A settling resize reads these sets instead of scanning the keyspace.
    queue = Queue("uniqs", client=valkey, shards=2)
    refs = {key: queue.enqueue(key, unique_key=key, lane="l" if key == "k3" else None,
                               max_attempts=1) for key in ("k1", "k2", "k3", "k4")}

    def indexed() -> set[str]:
        return {k for i in range(2) for k in valkey.smembers(queue.shard(i).key("uniqs"))}

    assert indexed() == {"k1", "k2", "k3", "k4"}
    for i in range(2):  # each key sits in the set of the shard its job is on
        for key in valkey.smembers(queue.shard(i).key("uniqs")):
            assert queue.locate(refs[key].id) == i
    leases = {lease.payload: lease for lease in queue.dequeue(count=4, worker="w", shards=2)}
    queue.ack(leases["k1"])  # succeeded
    queue.nack(leases["k2"], "boom")  # its only attempt: dead
    queue.cancel(refs["k4"].id)
    queue.release(leases["k4"])  # the cancel is recorded when the job comes back
    assert indexed() == {"k3"}  # still running
    assert queue.retry(refs["k2"].id) == "pending"  # live again: back in the set
    assert indexed() == {"k2", "k3"}


def test_a_live_unique_job_from_before_the_index_still_holds_a_resize_open(valkey: Any) -> None:
    # Written before the scripts kept the sets (an upgrade): the first resize indexes it.
    queue = Queue("olduniq", client=valkey, shards=2)
    key = next(k for k in (f"order-{i}" for i in range(100))
               if placement_hash(k) % 2 != placement_hash(k) % 5)
    first = queue.enqueue("x", unique_key=key)
    for i in range(2):
        valkey.delete(queue.shard(i).key("uniqs"))
    valkey.hdel(queue.shard(0).key("meta"), "uniqs_indexed")
    queue.resize(5)
    assert queue.enqueue("y", unique_key=key).id == first.id
    assert settle(queue) is None  # the key's live job is still on its prior shard
    drain(queue)
    assert settle(queue) is not None


def test_a_resize_while_the_last_one_settles_is_refused_but_undo_is_allowed(valkey: Any) -> None:
    queue = Queue("busy", client=valkey, shards=2)
    lane = moved_lane(2, 4)
    queue.enqueue("x", lane=lane)
    queue.resize(4)
    with pytest.raises(InvalidOption, match="still settling"):
        queue.resize(8)
    assert queue.resize(2).live == 2  # back to where it came from
    for bad in (0, 1025, "3", 2.5, True):
        with pytest.raises(InvalidOption, match="shard count"):
            queue.resize(bad)  # type: ignore[arg-type]


def test_retrying_a_dead_job_on_a_retired_shard_claims_from_it_again(valkey: Any) -> None:
    queue = Queue("dead", client=valkey, shards=3)
    refs = queue.enqueue_many([JobSpec(i, max_attempts=1) for i in range(30)])
    victim = next(r for r in refs if queue.locate(r.id) == 2)
    for lease in queue.dequeue(count=30, worker="w"):
        if lease.job_id == victim.id:
            queue.nack(lease, "boom")
        else:
            queue.ack(lease)
    queue.resize(1)
    assert settle(queue) is not None and queue.claim_shards() == 1
    queue.retry(victim.id)
    assert queue.claim_shards() == 3
    assert [job_id for _, job_id, _ in drain(queue)] == [victim.id]


def test_a_lowered_setting_drains_its_old_shards_for_good_without_a_resize(valkey: Any) -> None:
    """Producers still running with the old setting may place jobs beyond the new count: only a
    resize (which turns them away) retires shards."""
    Queue("legacy", client=valkey, shards=4).enqueue_many([JobSpec(i) for i in range(20)])
    lowered = Queue("legacy", client=valkey, shards=2)
    assert len(drain(lowered)) == 20
    assert settle(lowered) is None and lowered.claim_shards() == 4
    assert lowered.layout().status(3) == "draining"


def test_new_shards_of_a_paused_queue_start_paused(valkey: Any) -> None:
    queue = Queue("quiet", client=valkey)
    queue.pause()
    queue.resize(3)
    queue.enqueue_many([JobSpec(i) for i in range(30)])
    assert queue.dequeue(count=30, worker="w") == []
    queue.resume()
    assert len(drain(queue)) == 30


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("where", ["standalone", "cluster"])
def test_resizing_under_load_loses_nothing_and_runs_nothing_twice(
        where: str, request: pytest.FixtureRequest, settings: Any) -> None:
    """Two real workers drain while a producer enqueues; the queue grows 1 → 4, settles, then
    shrinks 4 → 2: every job runs once, the shrink retires shards 2 and 3, and their rows say so."""
    import threading

    from jobqueue.history.mirror import record_shards
    from jobqueue.models import Job, Shard
    from tests.jobapp import jobs
    from tests.workers import start_worker, wait_for

    server = request.getfixturevalue("valkey_server" if where == "standalone" else "valkey_cluster")
    settings.JOBQUEUE = {"URL": server.url, "QUEUES": {"default": {}}}
    queue = Queue("default")
    if where == "cluster":
        queue.client.flushall(target_nodes="primaries")
    enqueued: list[Any] = []
    stop = threading.Event()

    def produce() -> None:  # 40 jobs every 20 ms or so, until told to stop
        n = 0
        while not stop.is_set():
            enqueued.extend(jobs.add.using(lane=f"p{n % 3}").enqueue_many([(i, 0) for i in range(20)]))
            enqueued.extend(jobs.add.enqueue_many([(i, 1) for i in range(20)]))
            n += 1
            time.sleep(0.02)  # (a producer's pace, not a wait for anything)

    jobs.add.enqueue(0, 0)  # registers the queue, so workers serve it from the start
    workers = [start_worker(server.url, "--concurrency", "4") for _ in range(2)]
    try:
        producer = threading.Thread(target=produce)
        producer.start()
        wait_for(lambda: len(enqueued) >= 120)  # a few rounds before the grow
        queue.resize(4)
        wait_for(lambda: not queue.layout(fresh=True).settling, timeout=60, every=0.1)
        queue.resize(2)
        shrunk_at = len(enqueued)
        wait_for(lambda: len(enqueued) >= shrunk_at + 400)  # still producing while 2 and 3 drain
        stop.set()
        producer.join()
        total = len(enqueued)
        wait_for(lambda: Job.objects.filter(state="succeeded").count() == total + 1, timeout=90)
        wait_for(lambda: not queue.layout(fresh=True).settling, timeout=60, every=0.1)
    finally:
        for worker in workers:
            worker.terminate()
        for worker in workers:
            worker.wait(30)
    rows = Job.objects.all()
    assert total >= 400 and {r.id for r in enqueued} <= {row.id for row in rows}
    assert rows.count() == total + 1 and {row.attempts for row in rows} == {1}
    assert len({row.shard for row in rows}) == 4  # the grown shards did take jobs
    claimed: dict[str, list[tuple[str, Any]]] = {}
    for row in rows.exclude(lane=""):
        claimed.setdefault(row.lane, []).append((row.id, row.started_at))
    for lane, runs in claimed.items():  # under real workers too, each lane is claimed in the
        starts = [started for _, started in sorted(runs)]  # order its ids were minted, across
        assert len(runs) > 100 and starts == sorted(starts), lane  # both resizes
    record_shards(queue)
    assert list(Shard.objects.filter(queue="default").values_list("status", flat=True)) == [
        "active", "active", "retired", "retired"]


def test_a_corrupt_autoscale_state_starts_counting_afresh(valkey_server: Any, settings: Any) -> None:
    from jobqueue.conf import AutoShards
    from jobqueue.operations import autoscale

    settings.JOBQUEUE = {**settings.JOBQUEUE, "QUEUES": {"elastic": {"shards": "auto"}}}
    queue = Queue("elastic")
    for corrupt in ("not json", "[1, 2]"):
        queue.client.hset(autoscale.STATE_KEY, "elastic", corrupt)
        queue.client.delete(autoscale.TURN_KEY + "elastic")
        assert autoscale.check(queue, AutoShards()) is None  # no error, no resize
        assert "at" in json.loads(queue.client.hget(autoscale.STATE_KEY, "elastic"))


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_an_automatic_queue_grows_with_a_burst_and_shrinks_when_quiet(valkey_server: Any,
                                                                     settings: Any) -> None:
    """`"shards": "auto"` (max 4): a burst doubles the count twice, the quiet after it halves it
    twice; every job still runs once, and each change is logged, counted and shown."""
    from django.test import Client

    from jobqueue.models import Job
    from tests.jobapp import jobs
    from tests.workers import start_worker, wait_for

    settings.JOBQUEUE = {**settings.JOBQUEUE, "QUEUES": {"elastic": {"shards": "auto", "max_shards": 4}}}
    queue = Queue("elastic")
    assert queue.options.auto_shards and queue.options.max_shards == 4 and queue.shards == 1
    limits = {"every": 0.2, "grow_backlog": 40, "shrink_backlog": 2, "grow_rate": 1e9,
              "shrink_rate": 1, "grow_after": 2, "shrink_after": 4}
    refs = jobs.sleep.using(queue="elastic").enqueue_many([(0.005,)] * 3000)
    worker = start_worker(valkey_server.url, "--concurrency", "2", "--queues", "elastic",
                          env={"JOBQUEUE_TEST_AUTO_SHARDS": json.dumps(limits)})
    try:
        wait_for(lambda: queue.layout(fresh=True).live == 4, timeout=60, every=0.05)
        wait_for(lambda: Job.objects.filter(queue="elastic").count() == len(refs), timeout=90)
        wait_for(lambda: queue.layout(fresh=True) == layouts.Layout(1, 0, 1, 4, "1 0 1"),
                 timeout=60, every=0.1)
    finally:
        worker.terminate()
        worker.wait(30)
    steps = [(e["from"], e["to"]) for e in reversed(layouts.history(queue.client, "elastic"))]
    assert steps == [(1, 2), (2, 4), (4, 2), (2, 1)]
    assert all(e["by"].startswith("auto: backlog") for e in layouts.history(queue.client))
    rows = Job.objects.filter(queue="elastic")
    assert {row.state for row in rows} == {"succeeded"} and {row.attempts for row in rows} == {1}
    client = Client()
    from django.contrib.auth.models import User

    User.objects.create_superuser("root", "root@example.com", "pw")
    client.login(username="root", password="pw")
    page = client.get("/admin/jobqueue/job/live/queues/elastic/").content.decode()
    assert "Automatic: workers resize it with its load, up to 4." in page and "auto: backlog" in page
    metrics = client.get("/metrics").content.decode()
    assert 'jobqueue_shard_resizes_total{direction="grow",queue="elastic"} 2.0' in metrics
    assert 'jobqueue_shards{queue="elastic",status="retired"} 3.0' in metrics
