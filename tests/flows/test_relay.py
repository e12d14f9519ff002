"""The relay of flow outcomes across shards (flows/relay.py): a full batch of entries it must keep
does not stop it, nor make it read on from a wrong id."""

from __future__ import annotations

from jobqueue import Queue
from jobqueue.flows import relay
from tests.flows.conftest import FOUR, forward_entries, lane_on
from tests.jobapp import jobs


def test_a_full_batch_of_kept_entries_for_one_shard_does_not_break_the_relay(four: Queue) -> None:
    """201 entries for dependents not written yet (kept until stale): the relay keeps them all
    and reads on past the first batch (by the last entry's stream id)."""
    a = jobs.add.using(queue=FOUR, lane=lane_on(0)).enqueue(1, 2)
    [lease] = four.dequeue(count=1)
    edges = " ".join(f"JOB{n:011d}:0:f:2" for n in range(relay.BATCH + 1))
    four.client.hset(four.shard(0).job(a.id), "dependents", edges)
    assert four.ack_encoded([(lease, "3")]) == [2]
    assert forward_entries(four) == relay.BATCH + 1
    assert relay.relay_shard(four, 0) == 0  # main: redis ResponseError (XRANGE '(JOB…')
    assert forward_entries(four) == relay.BATCH + 1


def test_an_entry_behind_a_full_batch_of_kept_entries_is_delivered(four: Queue) -> None:
    """The first 200 entries are kept (their dependents are not written yet), split over two
    shards; the 201st is for a job waiting on shard 2: one relay delivers it."""
    a = jobs.add.using(queue=FOUR, lane=lane_on(0)).enqueue(1, 2)
    d = jobs.add.using(queue=FOUR, lane=lane_on(2), depends_on=[a]).enqueue(5, 5)
    [lease] = four.dequeue(count=5)
    assert lease.job_id == a.id
    key = four.shard(0).job(a.id)
    kept = " ".join(f"JOB{n:011d}:0:f:{2 + n % 2}" for n in range(relay.BATCH))
    four.client.hset(key, "dependents", f"{kept} {four.client.hget(key, 'dependents')}")
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
    assert sum(two.client.xlen(two.shard(i).key("forward")) for i in range(2)) == 0
