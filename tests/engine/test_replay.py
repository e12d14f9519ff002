"""Every script the connection layer may send again answers its replay as its first call did.

A command whose connection broke after it went out may have run: redis-py's retry (one server) or
the cluster client sends it once more. Each case here calls a script, then calls it again with
the same arguments, as such a re-send would (the first reply dropped), and checks that the second
answer is the first one and that the keyspace is as the first call left it. Where a replay may
differ, the case says why it is harmless: a clock read again (a renewed lease runs from the
replay), or a count of what the call did (a sweep's replay finds nothing left to do).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable
from typing import Any

from jobqueue import Queue, chord, conf, spec
from jobqueue.engine import handoff, layouts
from jobqueue.engine.leases import dead_retention_ms as _dead_retention_ms
from jobqueue.engine.leases import retention_ms as _retention_ms
from jobqueue.engine.scripts import caller, calls, operator_calls
from jobqueue.keys import placement_hash
from tests.jobapp import jobs

FOUR = "four"


def snapshot(client: Any) -> dict[str, Any]:
    """Every key and its value (a stream's entries with their ids)."""
    read: dict[str, Callable[[str], Any]] = {
        "hash": client.hgetall, "list": lambda k: client.lrange(k, 0, -1),
        "set": lambda k: sorted(client.smembers(k)), "string": client.get,
        "zset": lambda k: client.zrange(k, 0, -1, withscores=True), "stream": client.xrange}
    return {key: read[client.type(key)](key) for key in client.scan_iter(count=1000)}


def without(state: dict[str, Any], fields: Iterable[tuple[str, str]]) -> dict[str, Any]:
    """`state` less the hash fields named (key, field), and the zset scores of ('zset', key)."""
    out = dict(state)
    for key, field in fields:
        if key == "zset":
            out[field] = [member for member, _ in out.get(field, [])]
        elif key in out:
            out[key] = {k: v for k, v in out[key].items() if k != field}
    return out


def replayed(queue: Queue, name: str, index: int, args: list[Any],
             clock: Iterable[tuple[str, str]] = ()) -> Any:
    """Call `name` twice as a re-send would; assert the same answer and the same keyspace
    (less the `clock` fields the replay writes from its own clock reading); the answer."""
    shard = queue.shard(index)
    first = caller.run(queue.client, name, shard, list(args))
    after_first = snapshot(queue.client)
    second = caller.run(queue.client, name, shard, list(args))
    assert second == first, f"{name}: the replay answered {second!r}, the first call {first!r}"
    assert without(snapshot(queue.client), clock) == without(after_first, clock), name
    return first


def enqueue_args(queue: Queue, payload: Any, **options: Any) -> list[Any]:
    job = spec.prepare(spec.JobSpec(payload, **options), queue.options, 1 << 20)
    return ["", 1, job.job_id, job.payload, *calls.enqueue_tail(job, queue.options)]


def claimed(queue: Queue, **options: Any) -> Any:
    queue.enqueue("x", **options)
    [lease] = queue.dequeue(worker="w")
    return lease


def test_enqueue(queue: Queue) -> None:
    for options in ({}, {"unique_key": "k1"}, {"delay": 60}, {"lane": "a", "priority": 5}):
        assert replayed(queue, "enqueue", 0, enqueue_args(queue, "x", **options))[2] == "new"


def test_enqueue_handed_to_an_idle_worker(queue: Queue) -> None:
    offer = handoff.wait_commands(queue.shard(0), 5, "idle-w", handoff.offer(30_000, False))[0]
    queue.client.execute_command(*offer[:3], *offer[3:])
    assert replayed(queue, "enqueue", 0, enqueue_args(queue, "x"))[2] == "new"
    assert queue.counts()["active"] == 1


def test_ack(queue: Queue) -> None:
    lease = claimed(queue)
    assert replayed(queue, "ack", 0, [_retention_ms(), 1, lease.job_id, lease.token, '"r"']) == [1]


def test_ack_of_a_job_an_operator_asked_to_cancel(queue: Queue) -> None:
    lease = claimed(queue)
    queue.cancel(lease.job_id)
    assert replayed(queue, "ack", 0, [_retention_ms(), 1, lease.job_id, lease.token, '"r"']) == [3]
    assert queue.get(lease.job_id).state == "cancelled"  # type: ignore[union-attr]


def test_ack_that_forwarded_to_another_shard(valkey_url: str, settings: Any) -> None:
    settings.JOBQUEUE = {**settings.JOBQUEUE,
                         "QUEUES": {**settings.JOBQUEUE["QUEUES"], FOUR: {"shards": 4}}}
    conf.reset()
    four = Queue(FOUR)
    lane = {i: next(f"l{n}" for n in range(1000) if placement_hash(f"l{n}") % 4 == i)
            for i in (0, 3)}
    chord([jobs.add.using(queue=FOUR, lane=lane[0]).s(1, 1)],
          jobs.total.using(queue=FOUR, lane=lane[3]).s()).enqueue()
    [lease] = four.dequeue(count=5)
    args = [_retention_ms(), 1, lease.job_id, lease.token, "2"]
    assert replayed(four, "ack", 0, args) == [2]  # (forwarded: the worker relays at once)


def test_nack(queue: Queue) -> None:
    for retry_in, fatal, state in ((0, "0", "pending"), (60_000, "0", "scheduled"), (-1, "1", "dead")):
        lease = claimed(queue)
        args = [lease.job_id, lease.token, "boom", retry_in, fatal, _retention_ms(),
                _dead_retention_ms(), queue.options.max_attempts, 0]
        assert replayed(queue, "nack", 0, args) == state
        if state == "pending":
            queue.cancel(lease.job_id)


def test_nack_many(queue: Queue) -> None:
    leases = [claimed(queue, max_attempts=m) for m in (1, 3)]
    args = [_retention_ms(), _dead_retention_ms(), queue.options.max_attempts, 1000, 2,
            *(x for lease in leases for x in (lease.job_id, lease.token, "boom", -1, "0"))]
    assert replayed(queue, "nack_many", 0, args) == ["dead", "scheduled"]


def test_batch(queue: Queue) -> None:
    leases = [claimed(queue, lane=lane) for lane in (None, "t1")]
    args = [f"2 {leases[0].job_id}", 2, *(x for lease in leases for x in (lease.job_id, lease.token))]
    assert replayed(queue, "batch", 0, args) == ["", "t1"]


def test_reseal(queue: Queue) -> None:
    lease = claimed(queue)
    row = queue.shard(0).job(lease.job_id)
    queue.client.hset(row, "result", "old")
    args = ["job", lease.job_id, 2, "result", "old", "new", "progress", "gone", "x"]
    assert replayed(queue, "reseal", 0, args) == 1  # (a field that moved on is left alone)
    assert queue.client.hget(row, "result") == "new"


def test_extend_checkpoint_progress(queue: Queue) -> None:
    lease = claimed(queue)
    row = queue.shard(0).job(lease.job_id)
    renewed = [(row, "lease_until"), ("zset", queue.shard(0).key("active"))]
    assert replayed(queue, "extend", 0, [1, lease.job_id, lease.token, 30_000], renewed) == [1]
    assert replayed(queue, "checkpoint", 0, [lease.job_id, lease.token, "[1]", 30_000],
                    renewed) == 1
    assert replayed(queue, "progress", 0, [1, lease.job_id, lease.token, "50"]) == [1]


def test_release(queue: Queue) -> None:
    lease = claimed(queue)
    assert replayed(queue, "release", 0, [_retention_ms(), 1, lease.job_id, lease.token]) == [1]
    flagged = claimed(queue, lane="other")
    queue.cancel(flagged.job_id)
    assert replayed(queue, "release", 0, [_retention_ms(), 1, flagged.job_id,
                                          flagged.token]) == [1]


def test_operator_transitions(queue: Queue) -> None:
    lease = claimed(queue, max_attempts=1)
    queue.nack(lease, "boom")
    assert replayed(queue, "retry", 0, [lease.job_id, secrets.token_hex(8)]) == "ok:pending"
    assert replayed(queue, "reprioritize", 0, [lease.job_id, 9]) == "ok:pending"
    assert replayed(queue, "cancel", 0, [lease.job_id, _retention_ms(),
                                         secrets.token_hex(8)]) == "ok:cancelled"
    running = claimed(queue)
    assert replayed(queue, "cancel", 0, [running.job_id, _retention_ms(),
                                         secrets.token_hex(8)]) == "ok:active"


def test_retry_that_releases_a_dependent_whose_members_are_all_done(valkey_url: str) -> None:
    queue = Queue("default")
    ref = chord([jobs.add.s(1, 1)], jobs.total.s()).enqueue()
    assert queue.cancel(ref.id) == "cancelled"  # while it waits: its sets take the outcome still
    [member] = queue.dequeue(count=5)
    assert queue.ack(member, 2)
    assert replayed(queue, "retry", 0, [ref.id, secrets.token_hex(8)]) == "ok:pending"


def test_cancel_of_a_dependent_a_members_failure_cancelled(valkey_url: str) -> None:
    queue = Queue("default")
    ref = chord([jobs.add.s(1, 1)], jobs.total.s()).enqueue()
    [member] = queue.dequeue(count=5)
    assert queue.nack(member, "boom", fatal=True) == "dead"
    assert queue.client.hget(queue.shard(0).job(ref.id), "blocked_by") == member.job_id
    assert replayed(queue, "cancel", 0, [ref.id, _retention_ms(),
                                         secrets.token_hex(8)]) == "ok:cancelled"


def test_an_operators_refusal_replayed_after_the_job_moved_answers_as_it_did(
        queue: Queue) -> None:
    """Every exit of an operator script keeps its answer: a refusal too, though the job has
    moved on by the time the call is sent again."""
    ref = queue.enqueue("x")
    shard, retry_call = queue.shard(0), [ref.id, secrets.token_hex(8)]
    assert caller.run(queue.client, "retry", shard, retry_call) == "state:pending"
    cancel_call = ["JOB00000000042", _retention_ms(), secrets.token_hex(8)]
    assert caller.run(queue.client, "cancel", shard, cancel_call) == "missing"
    queue.enqueue("y", job_id="JOB00000000042")
    assert {lease.job_id for lease in queue.dequeue(count=5)} == {ref.id, "JOB00000000042"}
    assert caller.run(queue.client, "retry", shard, retry_call) == "state:pending"
    assert caller.run(queue.client, "cancel", shard, cancel_call) == "missing"


def test_a_reprioritize_sent_again_after_its_job_moved_answers_as_its_first_call(
        queue: Queue) -> None:
    """`run_answered` sends an operator's call again when its reply is lost; the job may have
    moved meanwhile (here: claimed). The replay answers from the answer kept under the call's
    id, as retry's and cancel's do."""
    ref = queue.enqueue("x")
    args = [ref.id, 9, secrets.token_hex(8)]
    first = caller.run(queue.client, "reprioritize", queue.shard(0), args)
    assert first == "ok:pending"
    queue.dequeue(worker="w")
    assert caller.run(queue.client, "reprioritize", queue.shard(0), args) == first


def test_flow(queue: Queue) -> None:
    from jobqueue.flows import graph

    nodes = [graph.Node(spec.JobSpec("a")), graph.Node(spec.JobSpec("b"))]
    prepared = graph.checked(queue, nodes)
    first, second = (str(job.job_id) for job in prepared)
    args = ["F1", _retention_ms(), "new", 2]
    for job, members in ((prepared[0], []), (prepared[1], [[first, 0, "f", ""]])):
        args += [job.job_id, job.payload, job.priority, job.lane, "", "", job.lease_ms,
                 job.delay_ms, "first" if members else "", len(members), 0, len(members)]
        for member in members:
            args += member
        args += [0, 0]  # (its expires_ms: never; spent: no tokens used before)
    args += [0, 0]
    assert replayed(queue, "flow", 0, args)[1:] == ["ok", 2, 0]
    assert queue.get(second).state == "waiting"  # type: ignore[union-attr]


def test_watch_and_reads(queue: Queue) -> None:
    ref = queue.enqueue("x")
    # (a replayed watch counts its caller twice: one wake token more, which the caller's next
    # wait slice would add anyway, and which expires unread)
    notify = [(queue.shard(0).job(ref.id), "notify")]
    assert replayed(queue, "watch", 0, [ref.id], notify) == ["pending"]
    replayed(queue, "counts", 0, [])
    replayed(queue, "heads", 0, [10, 3])
    assert replayed(queue, "set_lane_concurrency", 0, ["a", 2]) == 0


def test_permits_of_a_global_cap_sent_again_hold_what_the_first_call_held(queue: Queue) -> None:
    """`want` is what the holder holds from now on, not how many more: a replay takes none
    twice (only the holder's deadline moves, read from the replay's clock)."""
    from jobqueue.keys import cap_keys

    cap = cap_keys(queue.name)
    for args in (["h1", 3, 0, 30_000, 5], ["h2", 4, 0, 30_000, 5], ["h1", 1, 1, 30_000, 5]):
        first = caller.run(queue.client, "permits", cap, args)
        held = queue.client.hgetall(cap.key("permits"))
        assert caller.run(queue.client, "permits", cap, args) == first
        assert queue.client.hgetall(cap.key("permits")) == held
    assert held == {"h1": "1", "h2": "2", "": "3"}  # (h2 got the room h1 left: 5 - 3)


def test_sweeps_do_nothing_twice(queue: Queue) -> None:
    """A sweep's answer counts what it did: its replay did nothing, and says so."""
    queue.enqueue("later", delay=0.001)
    lapsed = claimed(queue, lease=0.001)
    shard = queue.shard(0)
    for name, args in (("promote", [100]), ("reap", [100, _retention_ms(), _dead_retention_ms(),
                                                       queue.options.max_attempts, 1000])):
        first = caller.run(queue.client, name, shard, args)
        state = snapshot(queue.client)
        caller.run(queue.client, name, shard, args)
        assert snapshot(queue.client) == state, name
        assert first
    assert queue.get(lapsed.job_id).state == "pending"  # type: ignore[union-attr]


def test_a_claim_replayed_would_lease_more_so_it_is_never_sent_again(queue: Queue) -> None:
    """The one script whose replay cannot answer as its first call: a claim leases what is ready
    now. It is sent once (`caller.run_once`); a lost reply hands its jobs back by the claim's id
    (tests/engine/test_faults.py)."""
    queue.enqueue_many([spec.JobSpec(i) for i in range(2)])
    args = [1, *queue.leases.head(None, False, "w"), "c1", 0]
    first = caller.run(queue.client, "claim", queue.shard(0), args)
    second = caller.run(queue.client, "claim", queue.shard(0), args)
    assert first[2] != second[2]  # two jobs leased
    assert caller.run(queue.client, "release", queue.shard(0),
                      [_retention_ms(), 0, "w", "c1"]) == 2  # both found by the claim's id


def test_a_resize_compare_and_set(valkey: Any) -> None:
    keys = [layouts.LAYOUT_KEY, layouts.REGISTRY_KEY, "{emq}:resize-op:q"]
    args = ["q", "", "2 1 2", 2, secrets.token_hex(8)]
    cas = valkey.register_script(operator_calls.LAYOUT_CAS)
    assert cas(keys=keys, args=args) == 1
    assert cas(keys=keys, args=args) == 1  # its own write: not "resized by someone else"
    assert cas(keys=keys, args=[*args[:4], "another"]) == 0


def test_every_transition_script_has_a_case() -> None:
    from jobqueue.engine.scripts import TRANSITIONS

    covered = {"enqueue", "claim", "ack", "nack", "extend", "checkpoint", "release", "reap",
               "promote", "retry", "reprioritize", "cancel", "counts", "heads",
               "set_lane_concurrency", "flow", "watch", "progress",
               "deliver",  # (tests/flows/test_flows_shards.py: a replayed delivery releases nothing twice)
               "permits", "nack_many", "batch", "reseal"}
    assert set(TRANSITIONS) == covered  # (a new script: add its case here)
