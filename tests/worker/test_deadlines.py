"""The deadlines of plain runs (worker/deadlines.py) on their own: a run's outcome past its
deadline is never a success, an overrunning run keeps its slot until its thread returns, and the
worker holds no more jobs than its free threads can start (serving.HeldJobs)."""

from __future__ import annotations

import time

from jobqueue.records import Lease
from jobqueue.worker.deadlines import Deadlines
from jobqueue.worker.executor import Outcome
from jobqueue.worker.serving import HeldJobs
from tests.workers import wait_for


def _lease(timeout: float) -> Lease:
    return Lease("JOB0000000000A", 1, None, None, 30.0, "default", 0, None, timeout,
                 time.monotonic() + timeout)


def _watched(capacity: int, concurrency: int = 1) -> tuple[HeldJobs, Deadlines, list[Outcome]]:
    """Held jobs (with room, as a worker's start sets it), their deadlines, and the outcomes
    handed over."""
    handed: list[Outcome] = []
    held = HeldJobs(capacity, concurrency)
    held.room.set()
    return held, Deadlines(lambda lease, outcome: handed.append(outcome), held), handed


def test_a_run_that_returns_past_its_deadline_is_its_timeout_whoever_sees_it_first() -> None:
    held, deadlines, handed = _watched(2)
    lease = _lease(0.001)
    run = deadlines.start(lease)
    wait_for(lambda: time.monotonic() > lease.deadline)  # (the timer may not have seen it yet)
    outcome = deadlines.returned(run, Outcome(True, result='"late"'))
    recorded = [outcome] if outcome is not None else handed
    assert len(recorded) == 1 and not recorded[0].ok
    assert recorded[0].error.startswith("jobqueue.exceptions.JobTimeout:")
    assert held.overrunning == 0 and held.room.is_set()


def test_an_overrunning_run_holds_its_slot_until_its_thread_returns() -> None:
    held, deadlines, handed = _watched(1)
    run = deadlines.start(_lease(0.05))
    wait_for(lambda: handed, timeout=5)  # the timer records the timeout at the deadline ...
    assert "JobTimeout" in handed[0].error and held.overrunning == 1 and held.free == 0
    assert not held.room.is_set()  # ... and the slot stays taken
    assert deadlines.returned(run, Outcome(True)) is None  # the late return is dropped
    assert held.overrunning == 0 and held.room.is_set() and len(handed) == 1


def test_each_overrunning_thread_takes_its_runner_and_its_share_of_prefetch_from_the_room() -> None:
    held = HeldJobs(capacity=4, concurrency=2)  # (2 runners, 2 prefetched)
    held.room.set()
    held.add([_lease(0)._replace(job_id="JOB0000000000B")])
    assert held.free == 3
    held.overrun()  # one thread of two overruns: room for one running and one prefetched
    assert held.free == 1 and held.room.is_set()
    held.add([_lease(0)._replace(job_id="JOB0000000000C")])
    assert held.free == 0 and not held.room.is_set()
    held.overrun()  # no thread left to start anything: no room at all, and once it holds no
    held.forget(held.leases())  # job, no offer to take a job handed over either
    assert held.free == 0 and not held.room.is_set() and not held.idle
    held.overrun_returned()
    assert held.free == 2 and held.room.is_set() and held.idle


def test_a_started_run_counts_its_limit_from_its_start_and_the_held_lease_says_so() -> None:
    held = HeldJobs(capacity=2, concurrency=1)
    claimed = _lease(1)._replace(deadline=0.0)  # (as a claim gives it: not started)
    held.add([claimed])
    before = time.monotonic()
    run = held.start(claimed)
    assert before + 1 <= run.deadline <= time.monotonic() + 1
    assert held.leases() == [run]  # (the heartbeat renews it with its time left: extend.lua)
    assert held.start(claimed._replace(timeout=0.0)).deadline == 0.0  # (no limit: no deadline)


def test_a_run_that_returns_in_time_hands_its_own_outcome() -> None:
    held, deadlines, _ = _watched(1)
    run = deadlines.start(_lease(60))
    done = Outcome(True, result="1")
    assert deadlines.returned(run, done) is done and held.overrunning == 0
