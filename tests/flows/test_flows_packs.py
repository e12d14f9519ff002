"""Outcomes sent to another shard in one pack (a worker's batch of acks) against the same
outcomes sent one an entry (acks one at a time), under each operator action (cancel,
retry, reprioritize, flows.cancel, resize), taken while the outcomes wait to be relayed or
after: two chords side by side, the same answers and the same end states (standalone and
cluster)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from jobqueue import Queue, chord, flows
from jobqueue.engine import layouts
from jobqueue.exceptions import InvalidTransition, JobNotFound
from jobqueue.flows import relay
from jobqueue.records import Lease
from tests.flows.conftest import FOUR, forward_entries, lane_on
from tests.flows.test_flows import run_all
from tests.jobapp import jobs

pytestmark = [pytest.mark.django_db(transaction=True)]
ACTIONS = ["none", "cancel", "retry", "reprioritize", "flows.cancel", "resize"]


@pytest.mark.parametrize("policy", ["fail", "ignore"])
@pytest.mark.parametrize("failed", [False, True], ids=["all-succeed", "one-cancelled"])
@pytest.mark.parametrize("when", ["pending", "relayed"])
@pytest.mark.parametrize("action", ACTIONS)
def test_a_pack_of_outcomes_ends_as_the_same_outcomes_one_by_one(
        four: Queue, action: str, when: str, failed: bool, policy: str) -> None:
    # Members on shard 3 (the one a resize to 3 shards retires), callbacks on shard 1.
    def enqueued() -> Any:
        return chord([jobs.add.using(queue=FOUR, lane=lane_on(3)).s(i, 10) for i in range(3)],
                     jobs.total.using(queue=FOUR, lane=lane_on(1)).s(),
                     on_failure=policy).enqueue()

    packed, single = enqueued(), enqueued()
    leases = four.dequeue(count=20)
    held = {ref.id: sorted((lease for lease in leases if _flow(four, lease) == ref.id),
                           key=lambda lease: lease.payload["args"][0])
            for ref in (packed, single)}
    assert [len(held[ref.id]) for ref in (packed, single)] == [3, 3]
    if failed:  # (its run is recorded cancelled: a failure in the pack)
        for ref in (packed, single):
            assert four.cancel(held[ref.id][0].job_id) == "active"
    results = {ref.id: [(lease, str(lease.payload["args"][0] + 10)) for lease in held[ref.id]]
               for ref in (packed, single)}
    four.ack_encoded(results[packed.id])  # one call: one entry for shard 1
    for item in results[single.id]:  # one call each: an entry each
        four.ack_encoded([item])
    assert forward_entries(four) == 1 + 3

    answers: dict[str, list[str]] = {packed.id: [], single.id: []}
    if when == "relayed":
        relay.relay_queue(four)
    if action == "resize":
        four.resize(3)
    for ref in (packed, single):
        answers[ref.id].append(_act(four, action, ref.id, held[ref.id][0].job_id))
    if when == "pending":
        relay.relay_queue(four)
    run_all(four, relays="idle")
    relay.relay_queue(four)

    assert _ends(four, packed.id) == _ends(four, single.id)
    assert answers[packed.id] == answers[single.id]
    assert forward_entries(four) == 0
    if action == "resize":  # (its retired shard's outcomes relayed: the resize settles)
        assert layouts.settle(four.client, FOUR, four.configured) is not None
    if action == "none" and not failed:
        assert four.get(packed.id).result == 33  # type: ignore[union-attr]


def _flow(queue: Queue, lease: Lease) -> str | None:
    info = queue.get(lease.job_id)
    return info.flow if info else None


def _act(queue: Queue, action: str, callback: str, member: str) -> str:
    """The operator's action on one chord; its answer (or the error it raised, by name)."""
    try:
        if action == "cancel":
            return queue.cancel(callback)
        if action == "retry":
            return queue.retry(member)
        if action == "reprioritize":
            return queue.reprioritize(callback, 7)
        if action == "flows.cancel":
            return str(flows.cancel(callback, FOUR))
    except (InvalidTransition, JobNotFound) as exc:
        return type(exc).__name__
    return ""


def _ends(queue: Queue, flow_id: str) -> list[tuple[str, str, int]]:
    """Each job of the flow, in its order: state, result (its jobs' ids by their places) and
    priority."""
    found = flows.members(flow_id, FOUR)
    text = [json.dumps(info.result) for info in found]
    for place, info in enumerate(found):
        text = [t.replace(info.id, f"#{place}") for t in text]
    return [(info.state, t, info.priority) for info, t in zip(found, text, strict=True)]
