"""The deadlines of plain runs (worker/deadlines.py) on their own: a run's outcome past its
deadline is never a success, and an abandoned run keeps its slot until its thread returns."""

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


def _watched(capacity: int) -> tuple[HeldJobs, Deadlines, list[Outcome]]:
    """Held jobs (with room, as a worker's start sets it), their deadlines, and the outcomes
    handed over."""
    handed: list[Outcome] = []
    held = HeldJobs(capacity)
    held.room.set()
    return held, Deadlines(lambda lease, outcome: handed.append(outcome), held), handed


def test_a_run_that_returns_past_its_deadline_is_its_timeout_whoever_sees_it_first() -> None:
    held, deadlines, handed = _watched(2)
    run = deadlines.start(_lease(0.001))
    time.sleep(0.01)  # (past the deadline; the timer may or may not have seen it yet)
    outcome = deadlines.returned(run, Outcome(True, result='"late"'))
    recorded = [outcome] if outcome is not None else handed
    assert len(recorded) == 1 and not recorded[0].ok
    assert recorded[0].error.startswith("jobqueue.exceptions.JobTimeout:")
    assert held.abandoned == 0 and held.room.is_set()


def test_an_abandoned_run_holds_its_slot_until_its_thread_returns() -> None:
    held, deadlines, handed = _watched(1)
    run = deadlines.start(_lease(0.05))
    wait_for(lambda: handed, timeout=5)  # the timer records the timeout at the deadline ...
    assert "JobTimeout" in handed[0].error and held.abandoned == 1 and held.taken == 1
    assert not held.room.is_set()  # ... and the slot stays taken
    assert deadlines.returned(run, Outcome(True)) is None  # the late return is dropped
    assert held.abandoned == 0 and held.room.is_set() and len(handed) == 1


def test_a_run_that_returns_in_time_hands_its_own_outcome() -> None:
    held, deadlines, _ = _watched(1)
    run = deadlines.start(_lease(60))
    done = Outcome(True, result="1")
    assert deadlines.returned(run, done) is done and held.abandoned == 0
