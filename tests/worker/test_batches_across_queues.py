"""Batch handlers in flows across queues, each queue with its own `runworker`: a chord whose
members are a batch handler's jobs on its queue calls back once on another queue, and a chain
from a plain job on one queue hands its result to a batch handler's job on another."""

from __future__ import annotations

import signal

import pytest

from jobqueue import Queue, chain, chord
from tests.jobapp import batch_jobs, jobs
from tests.worker.test_batches import ENV, url  # noqa: F401  (the fixture)
from tests.workers import start_worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_a_batch_handlers_jobs_feed_and_are_fed_by_jobs_of_another_queue(url: str) -> None:  # noqa: F811
    fanned = chord([batch_jobs.count.s(i) for i in range(25)], jobs.total.s()).enqueue()
    fed = chain(jobs.add.s(2, 3), batch_jobs.double.s()).enqueue()
    assert fanned.queue == "default" and fed.queue == batch_jobs.QUEUE
    procs = [
        start_worker(url, "--queues", queue, "--no-mirror", env=ENV)
        for queue in (batch_jobs.QUEUE, "default")
    ]
    try:
        assert fanned.result(timeout=60) == sum(range(25))
        assert fed.result(timeout=60)["double"] == 10
        assert Queue(batch_jobs.QUEUE).counts()["active"] == 0
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
