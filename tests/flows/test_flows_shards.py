"""Flows across the shards of a queue (standalone Valkey and a cluster): a wide group or chord
spreads over the shards, a job depends on one on another shard, failures cascade from shard to
shard; "member done" crosses through the member's shard's `:outcomes` stream and a relay
(relay.py), once, whether the relay is replayed or left to another worker's maintenance."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from jobqueue import Queue, chain, chord, conf, flows, group
from jobqueue.engine.scripts import caller
from jobqueue.flows import relay
from jobqueue.keys import placement_hash
from tests.flows.conftest import FOUR, forward_entries, lane_on
from tests.flows.test_flows import run_all
from tests.jobapp import jobs
from tests.workers import run_burst


def test_a_chord_spread_over_four_shards_calls_back_once_with_its_results_in_order(
        four: Queue) -> None:
    header = [jobs.square_slowly.using(queue=FOUR).s(i, 0) for i in range(40)]
    ref = chord(header, jobs.total.using(queue=FOUR).s()).enqueue()
    infos = flows.members(ref.id, FOUR)
    assert len(infos) == 41 and infos[-1].id == ref.id
    assert {info.shard for info in infos[:-1]} == {0, 1, 2, 3}  # placed by their own ids
    ran = run_all(four, shuffle=lambda leases: leases.reverse())
    assert [lease.job_id for lease in ran].count(ref.id) == 1 and ran[-1].job_id == ref.id
    assert ran[-1].payload["args"][0] == [i * i for i in range(40)]
    assert ref.result(timeout=5) == sum(i * i for i in range(40))
    assert forward_entries(four) == 0 and four.counts()["waiting"] == 0


def test_a_group_spread_over_four_shards_answers_in_order_and_cancels_everywhere(
        four: Queue) -> None:
    ref = group([jobs.add.using(queue=FOUR).s(i, 1) for i in range(24)]).enqueue()
    assert len({four.locate(r.id) for r in ref.refs}) == 4
    assert [info.id for info in flows.members(ref.id, FOUR)] == [r.id for r in ref.refs]
    run_all(four)
    assert ref.result(timeout=5) == list(range(1, 25))
    other = group([jobs.add.using(queue=FOUR).s(i, 1) for i in range(24)]).enqueue()
    assert flows.cancel(other.id, FOUR) == 24
    assert {info.state for info in flows.members(other.id, FOUR)} == {"cancelled"}


def test_a_chain_and_a_dependent_without_lanes_keep_to_their_members_shard(four: Queue) -> None:
    """The fast path stays: released in the member's own ack, nothing forwarded."""
    ref = chain(*[jobs.add.using(queue=FOUR).s(1, 1)] + [jobs.mul.using(queue=FOUR).s(2)] * 3).enqueue()
    assert len({info.shard for info in flows.members(ref.id, FOUR)}) == 1
    a = jobs.add.using(queue=FOUR).enqueue(1, 2)
    d = jobs.add.using(queue=FOUR, depends_on=[a]).enqueue(5, 5)
    assert four.locate(d.id) == four.locate(a.id)
    leases = four.dequeue(count=5)
    assert [four.ack_encoded([(lease, "2")])[0] for lease in leases] == [1, 1]
    assert four.get(d.id).state == "pending" and forward_entries(four) == 0  # type: ignore[union-attr]


def test_a_job_waits_for_a_job_on_another_shard(four: Queue) -> None:
    a = jobs.add.using(queue=FOUR, lane=lane_on(0)).enqueue(1, 2)
    d = jobs.add.using(queue=FOUR, lane=lane_on(2), depends_on=[a]).enqueue(5, 5)
    assert four.locate(a.id) == 0 and four.locate(d.id) == 2
    assert flows.waits_for(four.get(d.id)) == [a.id]  # type: ignore[arg-type]
    [lease] = four.dequeue(count=5)
    assert lease.job_id == a.id
    assert four.ack_encoded([(lease, "3")]) == [2]  # recorded, and forwarded to shard 2
    assert four.get(d.id).state == "waiting"  # type: ignore[union-attr]
    assert relay.relay_shard(four, 0) == 1
    assert four.get(d.id).state == "pending"  # type: ignore[union-attr]
    run_all(four)
    assert d.result(timeout=5) == 10 and forward_entries(four) == 0


def test_a_chain_over_three_shards_passes_each_result_on(four: Queue) -> None:
    ref = chain(jobs.add.using(queue=FOUR, lane=lane_on(1)).s(2, 3),
                jobs.mul.using(queue=FOUR, lane=lane_on(3)).s(4),
                jobs.mul.using(queue=FOUR, lane=lane_on(0)).s(10)).enqueue()
    assert [info.shard for info in flows.members(ref.id, FOUR)] == [1, 3, 0]
    run_all(four)
    assert ref.result(timeout=5) == 200


def test_a_job_waits_for_a_job_that_finished_on_another_shard_before_it_was_written(
        four: Queue) -> None:
    a = jobs.add.using(queue=FOUR, lane=lane_on(1)).enqueue(20, 1)
    run_all(four)
    d = jobs.add.using(queue=FOUR, lane=lane_on(3), depends_on=[a]).enqueue(1, 1)
    # The link on shard 1 found it finished: forwarded and relayed in the enqueue.
    assert four.get(d.id).state == "pending" and forward_entries(four) == 0  # type: ignore[union-attr]
    run_all(four)
    assert d.result(timeout=5) == 2


def test_a_failure_cascades_from_shard_to_shard_as_the_policies_say(four: Queue) -> None:
    a = jobs.fails_with.using(queue=FOUR, lane=lane_on(0)).enqueue("planned")
    b = jobs.noop.using(queue=FOUR, lane=lane_on(1), depends_on=[a]).enqueue()
    c = jobs.noop.using(queue=FOUR, lane=lane_on(2), depends_on=[b]).enqueue()
    e = jobs.noop.using(queue=FOUR, lane=lane_on(3), depends_on=[b], on_failure="ignore").enqueue()
    ran = [lease.job_id for lease in run_all(four)]
    assert ran == [a.id, e.id]
    info_b, info_c = four.get(b.id), four.get(c.id)
    assert info_b.state == "cancelled" and a.id in info_b.last_error  # type: ignore[union-attr]
    assert info_c.state == "cancelled" and b.id in info_c.last_error  # type: ignore[union-attr]
    assert four.get(e.id).state == "succeeded"  # type: ignore[union-attr]
    assert forward_entries(four) == 0


def _entries(queue: Queue, index: int) -> list[list[Any]]:
    """The outcomes waiting in shard `index`'s stream, each as a pack holds it."""
    return [outcome for _, fields in queue.client.xrange(queue.shard(index).key("outcomes"))
            for outcome in json.loads(fields["pack"])]


def test_a_replayed_delivery_releases_nothing_twice(four: Queue) -> None:
    ref = chord([jobs.add.using(queue=FOUR, lane=lane_on(0)).s(1, 1),
                 jobs.add.using(queue=FOUR, lane=lane_on(1)).s(2, 2)],
                jobs.total.using(queue=FOUR, lane=lane_on(3)).s()).enqueue()
    leases = four.dequeue(count=5)
    assert sorted(four.ack_encoded([(lease, json.dumps(2 if lease.shard == 0 else 4))])[0]
                  for lease in leases) == [2, 2]
    # A relay that delivered and died before deleting its entries: each is delivered again.
    entries = _entries(four, 0) + _entries(four, 1)
    for _ in range(2):
        for entry in entries:
            assert caller.run(four.client, "deliver", four.shard(3),
                              [60_000, 1, json.dumps([entry])]) == [0, 0, 1]
        assert four.counts()["pending"] == 1 and four.counts()["waiting"] == 0
    assert relay.relay_queue(four) == 2 and forward_entries(four) == 0  # and by the next relay
    [callback] = four.dequeue(count=5)
    assert callback.job_id == ref.id and callback.payload["args"] == [[2, 4]]
    assert four.ack(callback, 6) and four.dequeue(count=5) == []


def test_a_relay_keeps_an_entry_whose_job_is_not_written_yet(four: Queue) -> None:
    a = jobs.add.using(queue=FOUR, lane=lane_on(0)).enqueue(1, 2)
    [lease] = four.dequeue(count=1)
    four.client.hset(four.shard(0).job(a.id), "dependents", "JOB0000000000a:0:f:2")
    assert four.ack_encoded([(lease, "3")]) == [2]
    assert relay.relay_shard(four, 0) == 0 and forward_entries(four) == 1  # kept


@pytest.mark.django_db(transaction=True)
def test_an_outcome_a_finisher_never_relayed_is_delivered_by_a_workers_maintenance(
        four: Queue, valkey_url: str) -> None:
    """The finisher recorded its members' outcomes (acks answered 2) and died before relaying
    them: a worker's maintenance turn relays them, and the callback runs once."""
    ref = chord([jobs.add.using(queue=FOUR, lane=lane_on(i)).s(i, i) for i in range(3)],
                jobs.total.using(queue=FOUR, lane=lane_on(3)).s()).enqueue()
    answers = [four.ack_encoded([(lease, json.dumps(lease.payload["args"][0] * 2))])[0]
               for lease in four.dequeue(count=5)]
    assert answers == [2, 2, 2] and four.get(ref.id).state == "waiting"  # type: ignore[union-attr]
    env = {"JOBQUEUE_TEST_QUEUES": json.dumps({FOUR: {"shards": 4}})}
    assert run_burst(valkey_url, "--queues", FOUR, env=env) == 0
    assert ref.result(timeout=5) == 6
    assert four.get(ref.id).attempts == 1 and forward_entries(four) == 0  # type: ignore[union-attr]


def test_entries_a_finisher_never_relayed_survive_a_valkey_restart_from_its_aof(
        settings: Any) -> None:
    from tests.servers import ValkeyProcess

    server = ValkeyProcess().start()
    try:
        settings.JOBQUEUE = {"URL": server.url, "QUEUES": {FOUR: {"shards": 4}}}
        conf.reset()
        queue = Queue(FOUR)
        ref = chord([jobs.add.using(queue=FOUR, lane=lane_on(i)).s(i, i) for i in range(3)],
                    jobs.total.using(queue=FOUR, lane=lane_on(3)).s()).enqueue()
        for lease in queue.dequeue(count=5):  # recorded, never relayed
            assert queue.ack_encoded([(lease, json.dumps(lease.payload["args"][0] * 2))]) == [2]
        server.stop(kill=True)  # Valkey dies (its AOF synced at each write)
        server.start()
        conf.reset()
        queue = Queue(FOUR)
        assert forward_entries(queue) == 3 and queue.get(ref.id).state == "waiting"  # type: ignore[union-attr]
        assert relay.relay_queue(queue) == 3  # (as the next maintenance turn does)
        [callback] = queue.dequeue(count=5)
        assert callback.job_id == ref.id and callback.payload["args"] == [[0, 2, 4]]
    finally:
        server.cleanup()
        conf.reset()


DURABLE = {"durable4": {"durable": True, "shards": 4}}


def _durable_chord(settings: Any, url: str, members: int) -> Any:
    settings.JOBQUEUE = {**settings.JOBQUEUE, "URL": url,
                         "QUEUES": {**settings.JOBQUEUE["QUEUES"], **DURABLE}}
    conf.reset()
    header = [jobs.square_slowly.using(queue="durable4").s(i, 0) for i in range(members)]
    return header, jobs.record_chord.using(queue="durable4").s(url)


def _chord_runs(queue: Queue) -> list[Any]:
    return [json.loads(run) for run in queue.client.lrange("chord:runs", 0, -1)]


@pytest.mark.django_db(transaction=True)
def test_a_spread_durable_chord_restores_after_valkey_lost_its_data(
        settings: Any, valkey_server: Any) -> None:
    from jobqueue.history import outbox
    from jobqueue.history.mirror import Mirror
    from jobqueue.models import Job

    header, callback = _durable_chord(settings, valkey_server.url, 16)
    ref = chord(header, callback).enqueue()
    queue = Queue("durable4")
    assert len({row.shard for row in Job.objects.filter(flow__isnull=False)}) == 4
    for lease in queue.dequeue(count=6):  # six members finish (and their outcomes are relayed)
        if queue.ack_encoded([(lease, json.dumps(lease.payload["args"][0] ** 2))]) == [2]:
            relay.relay_shard(queue, lease.shard)
    assert Mirror([queue], "test").step() == 6
    queue.client.flushall()  # Valkey lost its data
    assert outbox.restore([queue]) == 16 - 6 + 1
    assert flows.waits_for(queue.get(ref.id)) == sorted(  # type: ignore[arg-type]
        Job.objects.filter(flow__isnull=False, state="pending").values_list("pk", flat=True))
    run_all(queue)
    assert _chord_runs(queue) == [[i * i for i in range(16)]]


@pytest.mark.django_db(transaction=True)
def test_a_spread_durable_chord_whose_writer_died_between_its_calls_is_sent_again(
        settings: Any, valkey_server: Any) -> None:
    """The rows are committed; of the flow script's calls only the first one (the callback's
    shard, with the members placed there) reached Valkey: the worker's resend of unsent rows
    writes the rest, and the callback runs once with every result in order."""
    from django.db import transaction

    from jobqueue.flows import graph
    from jobqueue.history import outbox

    header, callback = _durable_chord(settings, valkey_server.url, 12)
    queue = Queue("durable4")
    nodes = [sig.node() for sig in header]
    edges = tuple((str(node.spec.job_id), slot, "f") for slot, node in enumerate(nodes))
    nodes.append(callback.node(edges, "list", "f"))
    flow = str(nodes[-1].spec.job_id)
    prepared = graph.checked(queue, nodes)
    with transaction.atomic():
        shards = outbox.write_flow(queue, nodes, prepared, flow)
    writing = graph.Writing(queue, list(zip(nodes, prepared, strict=True)), flow, {}, True)
    where = graph.placement(writing.todo, {queue.name: 4}, shards, writing.locate, home=queue.name)
    assert writing.call(graph.order(writing.todo, where)[0], where)  # ... and the writer died
    assert 0 < writing.written < 13 and queue.get(flow).state == "waiting"  # type: ignore[union-attr]
    env = {"JOBQUEUE_TEST_QUEUES": json.dumps(DURABLE)}
    assert run_burst(valkey_server.url, "--queues", "durable4", env=env) == 0
    assert _chord_runs(queue) == [[i * i for i in range(12)]]


@pytest.mark.django_db(transaction=True)  # (in a test's transaction a flow waits for its commit)
def test_the_console_shows_a_spread_flow_from_every_shard(four: Queue, client: Any) -> None:
    from django.contrib.auth.models import User

    User.objects.create_superuser("root", "root@example.com", "pw")
    client.login(username="root", password="pw")
    ref = chord([jobs.add.using(queue=FOUR, lane=lane_on(i % 4)).s(i, 1) for i in range(8)],
                jobs.total.using(queue=FOUR).s()).enqueue()
    page = client.get(f"/admin/jobqueue/job/live/flows/{FOUR}/{ref.id}/").content.decode()
    assert "pending: <b>8</b>" in page and "waiting: <b>1</b>" in page
    assert f'id="flow-callback">{ref.id}' in page
    header = [info.id for info in flows.members(ref.id, FOUR)][:-1]  # in order, from 4 shards
    assert [page.index(job_id) for job_id in header] == sorted(page.index(j) for j in header)


def test_a_malformed_entry_is_dropped_and_holds_up_nothing(four: Queue) -> None:
    four.client.xadd(four.shard(1).key("forward"), {"dep": "x"})  # (an earlier version's)
    for fields in ({"shard": "2"}, {"shard": "2", "pack": "[[1, 2]]"},
                   {"shard": "2", "pack": "not json"}, {"shard": "2", "pack": "[]"}):
        four.client.xadd(four.shard(1).key("outcomes"), fields)
    a = jobs.add.using(queue=FOUR, lane=lane_on(1)).enqueue(1, 2)
    d = jobs.add.using(queue=FOUR, lane=lane_on(2), depends_on=[a]).enqueue(5, 5)
    run_all(four, relays="never")
    assert four.get(d.id).state == "waiting"  # type: ignore[union-attr]
    assert relay.relay_queue(four) == 6 and forward_entries(four) == 0
    run_all(four)
    assert d.result(timeout=5) == 10


def _chain_nodes(queue: Queue, lane: str) -> tuple[list[Any], list[Any]]:
    """chain(M, D) with D on `lane`, as dag's nodes and their prepared jobs."""
    from jobqueue.flows import graph

    member = jobs.add.using(queue=FOUR).s(2, 3).node()
    dependent = jobs.mul.using(queue=FOUR, lane=lane).s(10).node(
        ((str(member.spec.job_id), 0, "f"),), "first")
    nodes = [member, dependent]
    return nodes, graph.checked(queue, nodes)


def test_a_member_placed_on_its_dependents_shard_after_a_resize_turned_it_away_is_linked(
        four: Queue) -> None:
    """D was written on shard 2 naming M on shard 3; M's call was turned away (a shrink) and
    M placed again on shard 2: its call still writes M's edge to D, and M's success releases D."""
    from jobqueue.flows import graph

    nodes, prepared = _chain_nodes(four, lane_on(2))
    m, d = (str(node.spec.job_id) for node in nodes)
    two, three = graph.Place(FOUR, 2), graph.Place(FOUR, 3)
    writing = graph.Writing(four, list(zip(nodes, prepared, strict=True)), "", {}, False)
    assert writing.call(two, {m: three, d: two})  # the dependent first, its member then on 3 ...
    assert writing.call(two, {m: two, d: two})  # ... placed again on shard 2 at the next turn
    writing.links_left({m: two, d: two})
    [lease] = four.dequeue(count=5)
    assert lease.job_id == m and four.ack_encoded([(lease, "5")]) == [1]  # released in its ack
    assert four.get(d).state == "pending"  # type: ignore[union-attr]
    run_all(four)
    assert four.get(d).result == 50 and forward_entries(four) == 0  # type: ignore[union-attr]


def test_a_spread_flow_with_a_taken_id_writes_nothing(four: Queue) -> None:
    from jobqueue.exceptions import InvalidFlow

    taken = jobs.add.using(queue=FOUR, lane=lane_on(0)).enqueue(1, 1)
    with pytest.raises(InvalidFlow, match=f"job id {taken.id} is taken"):
        group([jobs.add.using(queue=FOUR, lane=lane_on(0), job_id=taken.id).s(1, 2),
               jobs.add.using(queue=FOUR, lane=lane_on(1)).s(2, 2)]).enqueue()
    assert four.counts()["pending"] == 1 and four.dequeue(count=5)[0].job_id == taken.id


def _copies(queue: Queue, job_id: str) -> int:
    return sum(queue.client.exists(queue.shard(i).job(job_id)) for i in range(4))


@pytest.mark.django_db(transaction=True)
def test_a_durable_flow_is_written_once_whatever_its_shards_after_a_resize(
        settings: Any, valkey_server: Any) -> None:
    """Its push marks its rows relayed (a resend sends nothing again); sent again all the
    same after a shrink re-placed its lane (and with rows naming other shards), each job Valkey
    holds stays where it is: one copy of each, and the chain runs once."""
    from jobqueue.flows import graph
    from jobqueue.history import outbox
    from jobqueue.models import Job

    _durable_chord(settings, valkey_server.url, 1)
    queue = Queue("durable4")
    ref = chain(jobs.add.using(queue="durable4", lane=lane_on(3)).s(2, 3),
                jobs.mul.using(queue="durable4").s(10)).enqueue()  # (pushed at once: no transaction)
    ids = [info.id for info in flows.members(ref.id, "durable4")]
    assert not Job.objects.filter(pk__in=ids, relayed=False).exists()
    assert outbox.resend([queue], grace=0) == 0
    queue.resize(3)
    Job.objects.filter(pk__in=ids).update(relayed=False, shard=1)
    assert outbox.resend([Queue("durable4")], grace=0) == 0
    assert [_copies(queue, job_id) for job_id in ids] == [1, 1]
    nodes = [outbox._node(row) for row in Job.objects.filter(pk__in=ids).order_by("enqueued_at")]
    assert graph.write(queue, nodes, graph.checked(queue, nodes), ref.id, again=True,
                     prefer={job_id: 2 for job_id in ids})[1] == 0
    assert [_copies(queue, job_id) for job_id in ids] == [1, 1]
    run_all(queue)
    assert ref.result(timeout=5) == 50


@pytest.mark.parametrize("policy", ["ignore", "fail"])
def test_a_stale_delivery_changes_nothing_after_a_retried_members_newer_outcome(
        four: Queue, policy: str) -> None:
    """Relay B reads the entry of m1's death; relay A delivers and deletes it; an operator
    retries m1 (and under "fail" the callback it cancelled), m1 succeeds and that is delivered;
    then relay B delivers what it read: older than the slot's last outcome, it changes nothing."""
    ref = chord([jobs.add.using(queue=FOUR, lane=lane_on(0)).s(1, 1),
                 jobs.add.using(queue=FOUR, lane=lane_on(1)).s(2, 2)],
                jobs.total.using(queue=FOUR, lane=lane_on(3)).s(), on_failure=policy).enqueue()
    leases = {lease.shard: lease for lease in four.dequeue(count=5)}
    assert four.nack(leases[0], "boom", fatal=True) == "dead"
    read_by_b = _entries(four, 0)
    assert relay.relay_shard(four, 0) == 1  # relay A
    if policy == "fail":
        assert four.get(ref.id).state == "cancelled"  # type: ignore[union-attr]
        four.retry(ref.id)
    four.retry(leases[0].job_id)
    [again] = four.dequeue(count=5)
    assert four.ack_encoded([(again, "100")]) == [2] and relay.relay_shard(four, 0) == 1
    for entry in read_by_b:  # relay B, late
        assert caller.run(four.client, "deliver", four.shard(3),
                          [60_000, 1, json.dumps([entry])]) == [0, 0, 1]
    assert four.get(ref.id).state == "waiting"  # type: ignore[union-attr]
    assert four.ack_encoded([(leases[1], "7")]) == [2] and relay.relay_shard(four, 1) == 1
    [callback] = four.dequeue(count=5)
    assert callback.job_id == ref.id and callback.payload["args"] == [[100, 7]]


def test_a_failure_answers_whether_it_forwarded_to_another_shard(four: Queue) -> None:
    """The worker relays after a terminal nack only when it forwarded (as after an ack)."""

    a = jobs.fails_with.using(queue=FOUR, lane=lane_on(0)).enqueue("x")
    jobs.noop.using(queue=FOUR, lane=lane_on(2), depends_on=[a]).enqueue()
    b = jobs.fails_with.using(queue=FOUR, lane=lane_on(1)).enqueue("y")
    jobs.noop.using(queue=FOUR, lane=lane_on(1), depends_on=[b]).enqueue()
    leases = {lease.job_id: lease for lease in four.dequeue(count=5)}
    assert four.leases.nack(leases[a.id], "x", fatal=True) == ("dead", True)
    assert four.leases.nack(leases[b.id], "y", fatal=True) == ("dead", False)
    assert forward_entries(four) == 1


def test_an_ack_answers_whether_it_recorded_a_cancel_and_whether_it_forwarded(
        four: Queue) -> None:
    """An ack of a run an operator flagged records it cancelled (answer 3, 4 when it forwarded
    to another shard: the worker relays and signals `cancelled` by them)."""
    a = jobs.add.using(queue=FOUR, lane=lane_on(0)).enqueue(1, 2)
    d = jobs.noop.using(queue=FOUR, lane=lane_on(2), depends_on=[a]).enqueue()
    b = jobs.add.using(queue=FOUR, lane=lane_on(1)).enqueue(1, 2)
    leases = {lease.job_id: lease for lease in four.dequeue(count=5)}
    assert four.cancel(a.id) == four.cancel(b.id) == "active"
    assert four.ack_encoded([(leases[a.id], "3"), (leases[b.id], "3")]) == [4, 3]
    assert relay.relay_shard(four, 0) == 1
    assert four.get(d.id).state == "cancelled"  # type: ignore[union-attr]


def test_a_shrink_settles_only_once_the_retired_shards_entries_are_relayed(four: Queue) -> None:
    from jobqueue.engine import layouts

    a = jobs.add.using(queue=FOUR, lane=lane_on(3)).enqueue(1, 2)
    stays = next(f"l{n}" for n in itertools.count() if placement_hash(f"l{n}") % 12 == 0)
    d = jobs.add.using(queue=FOUR, lane=stays, depends_on=[a]).enqueue(5, 5)  # (shard 0 of 4 or 3)
    [lease] = four.dequeue(count=5)
    four.resize(3)
    assert four.ack_encoded([(lease, "3")]) == [2]  # recorded on shard 3, never relayed
    assert layouts.settle(four.client, FOUR, 4) is None  # its entry holds the resize open
    assert relay.relay_queue(four, four.claim_shards()) == 1
    assert layouts.settle(four.client, FOUR, 4) is not None
    assert four.get(d.id).state == "pending"  # type: ignore[union-attr]


def test_a_relay_across_cluster_nodes_waits_for_the_dependents_aof_before_deleting(
        settings: Any) -> None:
    """On a cluster whose nodes keep an AOF, the delivery on the dependent's node is on its
    disk (WAITAOF) before the entry is deleted on the member's node."""
    import redis

    from tests.servers import ValkeyCluster

    cluster = ValkeyCluster(appendonly=True).start()
    try:
        settings.JOBQUEUE = {"URL": cluster.url, "QUEUES": {FOUR: {"shards": 4}}}
        conf.reset()
        queue = Queue(FOUR)
        node = {i: queue.client.get_node_from_key(queue.shard(i).key("meta")) for i in range(4)}
        far = next(i for i in range(1, 4) if node[i] != node[0])
        a = jobs.add.using(queue=FOUR, lane=lane_on(0)).enqueue(1, 2)
        d = jobs.add.using(queue=FOUR, lane=lane_on(far), depends_on=[a]).enqueue(5, 5)
        [lease] = queue.dequeue(count=5)
        assert queue.ack_encoded([(lease, "3")]) == [2]
        assert relay.relay_shard(queue, 0) == 1 and forward_entries(queue) == 0
        assert queue.get(d.id).state == "pending"  # type: ignore[union-attr]
        stats = redis.Redis(host=node[far].host, port=node[far].port).info("commandstats")
        assert stats["cmdstat_waitaof"]["calls"] == 1
    finally:
        cluster.cleanup()
        conf.reset()
