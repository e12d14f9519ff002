"""The buffers of batch handlers on their own (worker/batches.py `Gathering`), on a clock the
test moves: a buffer is handed on full or once its oldest job waited its handler's batch_wait,
the wait counted from the arrival of the jobs a full batch left behind, not from an older
job that went with that batch."""

from __future__ import annotations

from jobqueue.records import Lease
from jobqueue.worker.batches import Batch, Gathering
from tests.jobapp import batch_jobs

HANDLER = batch_jobs.count_full  # (batch=100, batch_wait=60)


def _leases(n: int, start: int = 0) -> list[Lease]:
    payload = {"handler": HANDLER.name, "args": [0]}
    return [
        Lease(f"JOB{i:011d}", 1, payload, None, 30.0, batch_jobs.QUEUE, 0) for i in range(start, start + n)
    ]


def test_the_jobs_a_full_batch_leaves_behind_wait_their_own_batch_wait() -> None:
    handed: list[Batch] = []
    clock = [1000.0]
    gathering = Gathering(handed.append, clock=lambda: clock[0])
    gathering.add([(HANDLER, lease) for lease in _leases(1)])
    clock[0] += 50  # (the first job waited 50 of its 60 s)
    gathering.add([(HANDLER, lease) for lease in _leases(100, start=1)])
    assert [len(batch.leases) for batch in handed] == [100]
    clock[0] += 20  # (70 s after the first job, 20 s after the one left behind came)
    assert gathering.due() == []
    clock[0] += 41
    assert [len(batch.leases) for batch in gathering.due()] == [1]
    assert gathering.take_unstarted() == []


def test_a_stopping_worker_takes_every_buffered_job_back() -> None:
    clock = [0.0]
    gathering = Gathering([].append, clock=lambda: clock[0])
    leases = _leases(30)
    gathering.add([(HANDLER, lease) for lease in leases])
    assert gathering.take_unstarted() == leases
    clock[0] += 3600
    assert gathering.due() == []
