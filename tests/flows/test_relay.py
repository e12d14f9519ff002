"""The relay of flow outcomes across shards (flows/relay.py): a full batch of entries it must keep
does not stop it, nor make it read on from a wrong id."""

from __future__ import annotations

import json

from jobqueue import Queue
from jobqueue.flows import relay
from tests.flows.conftest import FOUR, forward_entries, lane_on
from tests.jobapp import jobs


def _kept(four: Queue, count: int) -> None:
    """`count` entries in shard 0's stream, each for a job not written yet on shard 2 or 3
    (kept until stale), as finishes a batch apart write them: a pack of one outcome each."""
    for n in range(count):
        outcome = [f"JOB{n:011d}", "0", "f", "JOB00000000zz", "succeeded", "3", "1"]
        four.client.xadd(four.shard(0).key("outcomes"),
                         {"shard": str(2 + n % 2), "pack": json.dumps([outcome])})


def test_a_full_batch_of_kept_entries_for_one_shard_does_not_break_the_relay(four: Queue) -> None:
    """201 entries for dependents not written yet (kept until stale): the relay keeps them all
    and reads on past the first batch (by the last entry's stream id)."""
    _kept(four, relay.BATCH + 1)
    assert relay.relay_shard(four, 0) == 0  # main: redis ResponseError (XRANGE '(JOB…')
    assert forward_entries(four) == relay.BATCH + 1


def test_an_entry_behind_a_full_batch_of_kept_entries_is_delivered(four: Queue) -> None:
    """The first 200 entries are kept (their dependents are not written yet), split over two
    shards; the 201st is for a job waiting on shard 2: one relay delivers it."""
    a = jobs.add.using(queue=FOUR, lane=lane_on(0)).enqueue(1, 2)
    d = jobs.add.using(queue=FOUR, lane=lane_on(2), depends_on=[a]).enqueue(5, 5)
    [lease] = four.dequeue(count=5)
    assert lease.job_id == a.id
    _kept(four, relay.BATCH)
    assert four.ack_encoded([(lease, "3")]) == [2]
    relay.relay_shard(four, 0)
    assert four.get(d.id).state == "pending"  # type: ignore[union-attr]  (main: 'waiting')


def test_cancelling_a_wide_chord_over_two_shards_does_not_raise(two: Queue) -> None:
    """flows.cancel of a chord whose ~250 members on the callback's other shard each forward
    their cancel: the relay that follows reads past its first full batch."""
    from jobqueue import chord, flows

    ref = chord([jobs.add.using(queue="two").s(i, 1) for i in range(500)],
                jobs.total.using(queue="two").s()).enqueue()
    assert flows.cancel(ref.id, "two") == 501  # main: redis ResponseError from the relay
    assert sum(two.client.xlen(two.shard(i).key("outcomes")) for i in range(2)) == 0


def test_a_batch_of_acks_sends_a_shard_its_outcomes_in_one_entry(four: Queue) -> None:
    """A chord's members on shard 0 acked in one call, its callback and one more dependent on
    shards 2 and 3: one entry a shard, each holding its outcomes in the order they were acked;
    one relay delivers both."""
    from jobqueue import chord

    ref = chord([jobs.add.using(queue=FOUR, lane=lane_on(0)).s(i, 0) for i in range(5)],
                jobs.total.using(queue=FOUR, lane=lane_on(2)).s()).enqueue()
    leases = [lease for lease in four.dequeue(count=10) if lease.shard == 0]
    assert len(leases) == 5
    other = jobs.add.using(queue=FOUR, lane=lane_on(3),
                           depends_on=[leases[0].job_id]).enqueue(1, 1)
    assert four.ack_encoded([(lease, str(lease.payload["args"][0])) for lease in leases]
                            ) == [2] * 5
    entries = four.client.xrange(four.shard(0).key("outcomes"))
    assert sorted(fields["shard"] for _, fields in entries) == ["2", "3"]
    packs = {fields["shard"]: json.loads(fields["pack"]) for _, fields in entries}
    assert [outcome[3] for outcome in packs["2"]] == [lease.job_id for lease in leases]
    assert [outcome[0] for outcome in packs["3"]] == [other.id]
    assert relay.relay_shard(four, 0) == 2 and forward_entries(four) == 0
    [callback] = [lease for lease in four.dequeue(count=5) if lease.job_id == ref.id]
    assert callback.payload["args"] == [[0, 1, 2, 3, 4]]
    assert four.get(other.id).state in ("pending", "active")  # type: ignore[union-attr]


def test_an_earlier_versions_entry_is_delivered_by_the_maintenance_relay(four: Queue) -> None:
    """During a rolling upgrade a worker of the earlier version writes its outcome to `:forward`
    (one an entry, in fields of its own): the finisher's relay reads `:outcomes` only, a
    maintenance turn's (`relay_queue`) both."""
    a = jobs.add.using(queue=FOUR, lane=lane_on(0)).enqueue(1, 2)
    d = jobs.add.using(queue=FOUR, lane=lane_on(2), depends_on=[a]).enqueue(5, 5)
    [lease] = four.dequeue(count=5)
    four.client.hset(four.shard(0).job(a.id), "dependents", "")  # (as if it forwarded below)
    assert four.ack_encoded([(lease, "3")]) == [1]
    four.client.xadd(four.shard(0).key("forward"),
                     {"dep": d.id, "shard": "2", "slot": "0", "policy": "f", "member": a.id,
                      "state": "succeeded", "value": "3", "token": "1"})
    assert relay.relay_shard(four, 0) == 0
    assert four.get(d.id).state == "waiting"  # type: ignore[union-attr]
    assert relay.relay_queue(four) == 1 and forward_entries(four) == 0
    assert four.get(d.id).state == "pending"  # type: ignore[union-attr]


def test_a_packs_outcomes_applied_are_not_applied_again_while_one_waits_for_its_job(
        four: Queue) -> None:
    """One ack's pack holds a run an operator cancelled (its dependent cancelled under "fail")
    and an outcome for a job not written yet: the applied one goes, the other stays in an entry
    of its own (as old as the first); the dependent, retried by an operator meanwhile, is not
    cancelled again by the next relays; the kept outcome is dropped once stale."""
    a = jobs.add.using(queue=FOUR, lane=lane_on(0)).enqueue(1, 2)
    d = jobs.noop.using(queue=FOUR, lane=lane_on(2), depends_on=[a]).enqueue()
    [lease] = four.dequeue(count=5)
    key = four.shard(0).job(a.id)
    four.client.hset(key, "dependents", f"{four.client.hget(key, 'dependents')} JOB0000000000a:0:f:2")
    assert four.cancel(a.id) == "active"
    assert four.ack_encoded([(lease, "3")]) == [4]
    [(first, fields)] = four.client.xrange(four.shard(0).key("outcomes"))
    assert len(json.loads(fields["pack"])) == 2
    assert relay.relay_shard(four, 0) == 1 and forward_entries(four) == 1  # (its rest stays)
    assert four.get(d.id).state == "cancelled"  # type: ignore[union-attr]
    [(_, kept)] = four.client.xrange(four.shard(0).key("outcomes"))
    assert [o[0] for o in json.loads(kept["pack"])] == ["JOB0000000000a"]
    assert kept["since"] == first.split("-")[0] and kept["shard"] == "2"
    four.retry(d.id)
    for _ in range(2):
        relay.relay_shard(four, 0)
        relay.relay_queue(four)
        assert four.get(d.id).state == "waiting"  # type: ignore[union-attr]
    old = "1"  # (long past any retention)
    four.client.delete(four.shard(0).key("outcomes"))
    four.client.xadd(four.shard(0).key("outcomes"), {**kept, "since": old})
    assert relay.relay_shard(four, 0) == 1 and forward_entries(four) == 0  # (stale: dropped)
