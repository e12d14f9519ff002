"""The Lua state machine against a small Python model (hypothesis, stateful): random sequences of
enqueue, claim, ack, nack, extend, release, checkpoint, lease expiry, reap, promote, retry,
cancel and reprioritize, on a real Valkey and a real cluster. After every step:

- every job is in the state the model says, and sits in exactly the structures that state implies;
- `attempts` (the fencing token) never goes back, and a stale token changes nothing;
- the ring holds exactly the lanes that have ready work.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from jobqueue import Queue
from jobqueue.exceptions import InvalidTransition
from jobqueue.records import Lease
from tests.servers import flush_all

LANES = ["", "a", "b"]
TERMINAL = {"succeeded", "dead", "cancelled"}


@dataclass
class Model:
    """What the model believes of one job."""

    state: str
    lane: str
    priority: int
    max_attempts: int
    attempts: int = 0
    uncharged: int = 0
    cancel_flag: bool = False
    recorded: tuple[str, int] | None = None
    """The worker's call that last recorded an outcome of the job, and its token: the same call
    sent again (its reply lost) answers as it did."""


def machine_for(client: Any) -> type[RuleBasedStateMachine]:
    class JobStateMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            flush_all(client)
            self.queue = Queue("default", client=client)
            self.shard = self.queue.shard(0)
            self.jobs: dict[str, Model] = {}
            self.leases: list[Lease] = []

        # -- producer ------------------------------------------------------------------------

        @rule(lane=st.sampled_from(LANES), priority=st.sampled_from([-5, 0, 7]),
              delayed=st.booleans(), max_attempts=st.integers(1, 3))
        def enqueue(self, lane: str, priority: int, delayed: bool, max_attempts: int) -> None:
            ref = self.queue.enqueue("p", lane=lane or None, priority=priority, backoff=0,
                                     max_attempts=max_attempts, delay=3600 if delayed else None)
            self.jobs[ref.id] = Model("scheduled" if delayed else "pending", lane, priority,
                                      max_attempts)

        # -- worker --------------------------------------------------------------------------

        @rule(count=st.integers(1, 3))
        def claim(self, count: int) -> None:
            for lease in self.queue.dequeue(count=count, lease=30, worker="w"):
                job = self.jobs[lease.job_id]
                assert job.state == "pending", f"claimed a {job.state} job"
                job.state, job.attempts = "active", job.attempts + 1
                assert lease.token == job.attempts
                self.leases.append(lease)

        def _current(self, lease: Lease) -> bool:
            job = self.jobs[lease.job_id]
            return job.state == "active" and job.attempts == lease.token

        @precondition(lambda self: self.leases)
        @rule(pick=st.integers(0, 100))
        def ack(self, pick: int) -> None:
            lease = self.leases[pick % len(self.leases)]
            job = self.jobs[lease.job_id]
            again = job.attempts == lease.token and (job.state == "succeeded" or (
                job.state == "cancelled" and job.recorded == ("ack", lease.token)))  # a replay
            expected = self._current(lease)
            assert self.queue.ack(lease, "r") is (expected or again)
            if expected:
                job = self.jobs[lease.job_id]
                job.state = "cancelled" if job.cancel_flag else "succeeded"
                job.recorded = ("ack", lease.token)

        @precondition(lambda self: self.leases)
        @rule(pick=st.integers(0, 100))
        def nack(self, pick: int) -> None:
            lease = self.leases[pick % len(self.leases)]
            job = self.jobs[lease.job_id]
            expected = None
            if self._current(lease):
                if job.cancel_flag:
                    expected = "cancelled"
                elif job.attempts - job.uncharged >= job.max_attempts:
                    expected = "dead"
                else:
                    expected = "pending"  # backoff 0: ready again at once
            elif job.recorded == ("nack", lease.token) and job.attempts == lease.token:
                expected = job.state  # its own nack sent again: answered as the job stands
            assert self.queue.nack(lease, "boom") == expected
            if expected and self._current(lease):
                job.state = expected
                job.recorded = ("nack", lease.token)

        @precondition(lambda self: self.leases)
        @rule(pick=st.integers(0, 100))
        def extend(self, pick: int) -> None:
            lease = self.leases[pick % len(self.leases)]
            assert self.queue.extend(lease, 30) is self._current(lease)

        @precondition(lambda self: self.leases)
        @rule(pick=st.integers(0, 100))
        def checkpoint(self, pick: int) -> None:
            lease = self.leases[pick % len(self.leases)]
            assert self.queue.checkpoint(lease, {"step": pick}) is self._current(lease)

        @precondition(lambda self: self.leases)
        @rule(pick=st.integers(0, 100))
        def release(self, pick: int) -> None:
            lease = self.leases[pick % len(self.leases)]
            expected = self._current(lease)
            job = self.jobs[lease.job_id]
            again = (job.recorded == ("release", lease.token) and job.attempts == lease.token
                     and job.state in ("pending", "cancelled"))  # its own release sent again
            assert self.queue.release(lease) is (expected or again)
            if expected:
                job.uncharged += 1
                job.state = "cancelled" if job.cancel_flag else "pending"
                job.recorded = ("release", lease.token)

        # -- time passing and maintenance -----------------------------------------------------

        @rule(pick=st.integers(0, 100))
        def lease_expires_and_reap(self, pick: int) -> None:
            active = [i for i, job in self.jobs.items() if job.state == "active"]
            if active:  # time passes for one running job: its lease is now in the past
                client.zadd(self.shard.key("active"), {active[pick % len(active)]: 1})
            expired = [i for i in active if client.zscore(self.shard.key("active"), i) == 1]
            assert self.queue.reap() == len(expired)
            for job_id in expired:
                job = self.jobs[job_id]
                if job.cancel_flag:
                    job.state = "cancelled"
                elif job.attempts - job.uncharged >= job.max_attempts:
                    job.state = "dead"
                else:
                    job.state = "pending"

        @rule(pick=st.integers(0, 100))
        def schedule_falls_due_and_promote(self, pick: int) -> None:
            scheduled = [i for i, job in self.jobs.items() if job.state == "scheduled"]
            if scheduled:
                client.zadd(self.shard.key("schedule"), {scheduled[pick % len(scheduled)]: 1})
            due = [i for i in scheduled if client.zscore(self.shard.key("schedule"), i) == 1]
            assert self.queue.promote() == len(due)
            for job_id in due:
                self.jobs[job_id].state = "pending"

        # -- operator ------------------------------------------------------------------------

        def _operate(self, action: str, pick: int, allowed: set[str], *args: Any) -> str | None:
            if not self.jobs:
                return None
            job_id = list(self.jobs)[pick % len(self.jobs)]
            job = self.jobs[job_id]
            if job.state not in allowed:
                with pytest.raises(InvalidTransition):
                    getattr(self.queue, action)(job_id, *args)
                return None
            getattr(self.queue, action)(job_id, *args)
            return job_id

        @rule(pick=st.integers(0, 100))
        def retry(self, pick: int) -> None:
            if job_id := self._operate("retry", pick, {"dead", "cancelled"}):
                job = self.jobs[job_id]
                job.state, job.uncharged, job.cancel_flag = "pending", job.attempts, False

        @rule(pick=st.integers(0, 100))
        def cancel(self, pick: int) -> None:
            if job_id := self._operate("cancel", pick, {"pending", "scheduled", "active"}):
                job = self.jobs[job_id]
                if job.state == "active":
                    job.cancel_flag = True
                else:
                    job.state = "cancelled"

        @rule(pick=st.integers(0, 100), priority=st.sampled_from([-9, 0, 9]))
        def reprioritize(self, pick: int, priority: int) -> None:
            allowed = {"pending", "scheduled", "active"}
            if job_id := self._operate("reprioritize", pick, allowed, priority):
                self.jobs[job_id].priority = priority

        # -- invariants ----------------------------------------------------------------------

        @invariant()
        def every_job_sits_exactly_where_its_state_says(self) -> None:
            key = self.shard.key
            sets = {name: set(client.zrange(key(name), 0, -1))
                    for name in ("schedule", "active", "dead")}
            lanes = {lane: set(client.zrange(self.shard.lane(lane), 0, -1)) for lane in LANES}
            for job_id, job in self.jobs.items():
                row = client.hmget(self.shard.job(job_id), "state", "attempts", "priority")
                assert row[0] == job.state, (job_id, row, job)
                # A row holds only what differs from a default: no attempts or priority while 0.
                assert int(row[1] or 0) == job.attempts and int(row[2] or 0) == job.priority
                where = {name for name, members in sets.items() if job_id in members}
                where |= {f"lane:{lane}" for lane, members in lanes.items() if job_id in members}
                expected = {"pending": {f"lane:{job.lane}"}, "scheduled": {"schedule"},
                            "active": {"active"}, "dead": {"dead"}}.get(job.state, set())
                assert where == expected, (job_id, job.state, where)

        @invariant()
        def the_ring_holds_exactly_the_lanes_with_ready_work(self) -> None:
            ring = client.lrange(self.shard.key("ring"), 0, -1)
            ready = {job.lane for job in self.jobs.values() if job.state == "pending"}
            assert sorted(ring) == sorted(ready), (ring, ready)

    return JobStateMachine


@pytest.mark.slow
def test_the_scripts_follow_the_model(valkey: Any) -> None:
    machine = machine_for(valkey)
    run_state_machine_as_test(machine, settings=settings(
        max_examples=40, stateful_step_count=40, deadline=None, derandomize=True,
        suppress_health_check=list(HealthCheck)))
