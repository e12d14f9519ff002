"""The global cap (`global_concurrency`), through `Queue` on Valkey and Valkey Cluster: permits of
one cap, held by each claimer (a `Queue`'s `Leases`), bound what its claims lease on any shard;
a dead holder's come back within 1.5 leases; a cap set live reaches every claimer at its next
claim. The runs with real workers are in tests/worker/test_global_cap_workers.py."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis

from jobqueue import Queue, conf
from jobqueue.engine import permits
from jobqueue.exceptions import InvalidOption
from jobqueue.keys import cap_keys
from jobqueue.options import queue_options
from jobqueue.records import Lease
from jobqueue.spec import JobSpec
from tests.workers import wait_for

Make = Callable[..., Queue]

PEAK = """local n = redis.call('INCRBY', KEYS[1], ARGV[1])
if n > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], n) end
return n"""
"""Counts jobs running at once (KEYS[1]) and the most ever (KEYS[2]), in one slot."""


@pytest.fixture
def make(settings: Any, valkey: Any) -> Make:
    """A queue `g` with the given options, on the test's Valkey (standalone or cluster)."""
    def made(**options: Any) -> Queue:
        settings.JOBQUEUE = {**settings.JOBQUEUE, "QUEUES": {"default": {}, "g": options}}
        conf.reset()
        return Queue("g", client=valkey)
    return made


def claimer(queue: Queue) -> Queue:
    """Another holder of the same queue (a worker of its own)."""
    return Queue(queue.name, client=queue.client)


def claim(queue: Queue, n: int = 100, lease: float = 30) -> list[Lease]:
    return queue.dequeue(count=n, lease=lease, worker="w")


def fill(queue: Queue, n: int, lane: str | None = None) -> None:
    queue.enqueue_many([JobSpec([lane, i], lane=lane) for i in range(n)])


def test_a_cap_below_one_is_a_clear_error(make: Make) -> None:
    for bad in (0, -3, 1.5, "3", True):
        with pytest.raises(InvalidOption, match="global_concurrency must be an integer"):
            queue_options({"global_concurrency": bad})
    with pytest.raises(InvalidOption, match="global cap must be an integer"):
        make().set_global_concurrency(0)


def test_claims_over_every_shard_and_claimer_never_lease_more_than_the_cap(make: Make) -> None:
    queue = make(shards=4, global_concurrency=3)
    fill(queue, 20)
    other = claimer(queue)
    first = claim(queue)
    assert len(first) == 3 and claim(other) == []
    assert queue.ack(first[0])
    assert len(claim(queue)) == 1  # the freed permit stays with its holder for its next claim
    assert claim(other) == []
    assert permits.state(queue.client, "g", queue.options).held == 3


def test_a_claimer_gives_its_permits_back_once_the_queue_is_drained(make: Make) -> None:
    queue = make(shards=4, global_concurrency=3)
    fill(queue, 2)
    leases = claim(queue)
    assert len(leases) == 2
    assert all(queue.ack_many([(lease, None) for lease in leases]))
    assert claim(queue) == []  # nothing left and nothing running: its permits go back
    assert permits.state(queue.client, "g", queue.options) == permits.CapState(3, False, 0)
    fill(queue, 5)
    assert len(claim(claimer(queue))) == 3


def test_a_dead_claimers_permits_come_back_when_its_lease_ends(make: Make) -> None:
    queue = make(shards=2, global_concurrency=2)
    fill(queue, 4)
    assert len(claim(queue, lease=1)) == 2  # then it dies: nothing acks or renews
    other, got = claimer(queue), []
    assert claim(other) == []
    wait_for(lambda: got.extend(claim(other)) or len(got) == 2, timeout=20)
    holders = queue.client.zrange(cap_keys("g").key("holders"), 0, -1)
    assert holders == [other.leases.permits.holder]


def test_a_cap_set_live_reaches_a_claimer_that_knew_of_none(make: Make) -> None:
    queue = make(shards=4)
    fill(queue, 10)
    worker = claimer(queue)
    running = claim(worker, 1)  # no cap: no permit is asked for
    assert not queue.client.exists(cap_keys("g").key("permits"))
    queue.set_global_concurrency(2)
    assert len(claim(worker)) == 2  # (the job it ran before the cap holds no permit)
    assert claim(worker) == [] and claim(claimer(queue)) == []
    assert queue.ack(running[0]) and claim(worker) == []
    queue.set_global_concurrency(None)  # lifted: the rest go at once
    assert len(claim(worker)) == 7


def test_a_lowered_cap_holds_once_the_jobs_above_it_end(make: Make) -> None:
    queue = make(shards=4, global_concurrency=3)
    fill(queue, 10)
    a, b = claimer(queue), claimer(queue)
    on_a, on_b = claim(a, 2), claim(b)
    assert len(on_a) == 2 and len(on_b) == 1
    queue.set_global_concurrency(1)
    assert a.ack(on_a[0]) and claim(a) == []  # its freed permit goes back, not to a new job
    assert b.ack(on_b[0]) and claim(b) == []  # a still runs one: the cap is full
    assert a.ack(on_a[1]) and len(claim(a)) == 1 and claim(b) == []  # one at a time now
    assert permits.state(queue.client, "g", queue.options) == permits.CapState(1, True, 1)


def test_the_cap_composes_with_lane_caps_and_weights(make: Make) -> None:
    queue = make(global_concurrency=3, lane_concurrency=1, lane_weights={"a": 3})
    for lane in "abcd":
        fill(queue, 3, lane)
    leases = claim(queue)
    assert len(leases) == 3 and len({lease.payload[0] for lease in leases}) == 3  # one a lane


def test_the_cap_composes_with_a_rate(make: Make) -> None:
    queue = make(global_concurrency=5, rate="2/m", shards=1)
    fill(queue, 9)
    assert len(claim(queue)) == 2 and claim(queue) == []  # the rate binds first
    assert queue.rate_wait > 0


def test_a_resize_gives_the_shards_it_adds_the_live_cap(make: Make) -> None:
    queue = make(shards=1)
    queue.set_global_concurrency(2)
    queue.resize(3)
    assert queue.client.hget(queue.shard(2).key("meta"), "gcap") == "2"
    fill(queue, 9)
    assert len(claim(claimer(queue))) == 2


def test_many_claimers_at_once_never_run_more_than_the_cap(make: Make) -> None:
    queue = make(shards=4, global_concurrency=3)
    fill(queue, 120)
    counter, peak = "{gcap-test}:running", "{gcap-test}:peak"

    def work(n: int) -> None:
        mine = claimer(queue)
        while mine.counts()["pending"] or mine.counts()["active"]:
            leases = claim(mine, 1 + n % 4)
            if leases:  # (held from the claim until just before each ack frees its permit)
                queue.client.eval(PEAK, 2, counter, peak, len(leases))
            for lease in leases:
                queue.client.eval(PEAK, 2, counter, peak, -1)
                mine.ack(lease)

    with ThreadPoolExecutor(6) as pool:
        for done in [pool.submit(work, n) for n in range(6)]:
            done.result(120)  # (a claimer's error fails the test)
    assert queue.counts()["succeeded"] == 120
    assert 1 <= int(queue.client.get(peak)) <= 3


def test_a_claim_without_a_cap_makes_one_call_and_reads_no_key_of_a_cap(make: Make) -> None:
    queue = make(shards=1)
    if not isinstance(queue.client, redis.Redis):
        pytest.skip("one server's command counts (a cluster's are per node)")
    fill(queue, 3)
    claim(queue, 1)  # (the claim's head is built and its script loaded)
    queue.client.config_resetstat()
    assert len(claim(queue, 2)) == 2
    stats = queue.client.info("commandstats")
    assert stats["cmdstat_evalsha"]["calls"] == 1 and "cmdstat_get" not in stats
    assert not queue.client.keys("emq:{g#cap}*") and queue.leases.permits.held == 0


def test_permits_cover_a_jobs_own_longer_lease(make: Make) -> None:
    """A job enqueued with its own lease (60 s) longer than the queue's (1 s): its holder's
    permit does not lapse while the job's lease is live."""
    queue = make(global_concurrency=1, lease=1)
    queue.enqueue_many([JobSpec([i], lease=60) for i in range(2)])
    first = queue.dequeue(count=1)
    assert len(first) == 1 and first[0].lease == 60
    other = claimer(queue)
    assert other.dequeue(count=1) == []
    lapse = queue.client.zscore(cap_keys("g").key("holders"), queue.leases.permits.holder)
    assert lapse is not None and lapse / 1000 > time.time() + 50  # (server clock ~ ours)
    assert other.dequeue(count=1) == [], "cap 1 exceeded: two leased jobs at once"


def test_a_job_leased_late_on_kept_permits_is_covered_by_them(make: Make) -> None:
    """Permits kept across claims: a claim made a while after the holder's last permits call
    leases a job for a whole lease; the holder's permits last at least as long as that lease."""
    queue = make(global_concurrency=1, lease=2)
    fill(queue, 3)
    first = queue.dequeue(count=1)
    assert len(first) == 1 and queue.ack(first[0])
    start = time.monotonic()
    wait_for(lambda: time.monotonic() >= start + 1.0)
    second = queue.dequeue(count=1)
    assert len(second) == 1
    lapse = queue.client.zscore(cap_keys("g").key("holders"), queue.leases.permits.holder)
    assert lapse / 1000 >= time.time() + 1.9  # (the job's whole lease; one machine's clock)
    assert claimer(queue).dequeue(count=1) == [], "cap 1 exceeded"


def test_a_lost_reply_of_a_give_back_leaves_no_permit_believed_held(
        make: Make, monkeypatch: Any) -> None:
    """permits.lua ran (the holder's permits went back) but its reply was lost: the holder does
    not go on leasing on the permits it still believes it holds."""
    from jobqueue.engine.scripts import calls
    queue = make(global_concurrency=3)
    fill(queue, 3)
    first = queue.dequeue(count=3)
    assert len(first) == 3 and all(queue.ack_many([(lease, None) for lease in first]))
    real = calls.permits

    def lost_when_giving_back(client: Any, shard: Any, holder: str, want: int,
                              *rest: Any) -> Any:
        answer = real(client, shard, holder, want, *rest)
        if want == 0:
            raise redis.exceptions.ConnectionError("reply lost")
        return answer
    monkeypatch.setattr(calls, "permits", lost_when_giving_back)
    assert queue.dequeue(count=3) == []  # drained: it gives its 3 permits back; no reply
    monkeypatch.setattr(calls, "permits", real)
    fill(queue, 6)
    assert len(claimer(queue).dequeue(count=3)) == 3
    assert queue.dequeue(count=3) == [], "cap 3 exceeded: 6 leased jobs at once"


def test_a_set_cap_interrupted_before_its_marks_does_not_stall_the_queue(make: Make) -> None:
    """`set_cap` writes the cap's key, then each shard's mark: a process killed in between (or a
    node that lost its data) leaves marks that differ from the key. Claims still lease."""
    queue = make(shards=2, global_concurrency=5)
    fill(queue, 4)
    queue.client.set(cap_keys("g").key("limit"), "3")  # set_cap's first write; no mark came
    assert len(queue.dequeue(count=3)) == 3, "claims lease nothing: the queue is stalled"
    assert queue.dequeue(count=3) == []  # (the cap of 3 holds)
    queue.client.delete(cap_keys("g").key("limit"))  # (a lost key: the marks say 3)
    assert len(claimer(queue).dequeue(count=3)) == 1


def test_a_permits_error_after_a_claim_keeps_what_the_claim_leased(
        make: Make, monkeypatch: Any) -> None:
    """The permits call that covers a job's own longer lease (made after the claim) fails: the
    claim still returns what it leased, and the holder asks for its permits again next time."""
    from jobqueue.engine.scripts import calls
    queue = make(global_concurrency=2, lease=1)
    queue.enqueue_many([JobSpec([i], lease=60) for i in range(3)])
    real, sent = calls.permits, []

    def failing_after_the_first(*args: Any) -> Any:
        sent.append(args)
        if len(sent) > 1:
            raise redis.exceptions.ConnectionError("down")
        return real(*args)
    monkeypatch.setattr(calls, "permits", failing_after_the_first)
    leased = queue.dequeue(count=1)
    assert len(leased) == 1 and len(sent) == 2  # (the claim's reserve, then settle's renewal)
    assert queue.leases.permits.held == 1  # (only what runs: the call's answer never came)
    monkeypatch.setattr(calls, "permits", real)
    assert len(queue.dequeue(count=1)) == 1  # (it asks again, then claims)
    assert claimer(queue).dequeue(count=1) == []


def test_a_cap_reset_live_is_the_settings_cap_again(make: Make) -> None:
    queue = make(shards=2, global_concurrency=2)
    fill(queue, 6)
    queue.set_global_concurrency(None)
    worker = claimer(queue)
    assert len(claim(worker, 3)) == 3
    queue.reset_global_concurrency()
    assert len(claim(worker)) == 2  # (the settings' 2: jobs leased with no cap hold no permit)
    assert claim(claimer(queue)) == []
    assert permits.state(queue.client, "g", queue.options) == permits.CapState(2, False, 2)


def test_the_state_of_a_queue_without_a_cap_is_one_read(make: Make) -> None:
    queue = make(shards=1)
    if not isinstance(queue.client, redis.Redis):
        pytest.skip("one server's command counts (a cluster's are per node)")
    queue.client.config_resetstat()
    assert permits.state(queue.client, "g", queue.options) == permits.CapState(None, False, 0)
    stats = queue.client.info("commandstats")
    assert stats["cmdstat_get"]["calls"] == 1 and "cmdstat_zrangebyscore" not in stats
