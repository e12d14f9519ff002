"""Encryption at rest meets worker-side batches: a batch handler on a sealed queue gets each
job's args opened, and each job's result, error and progress are stored sealed under its own
id."""

from __future__ import annotations

from typing import Any

import pytest

from jobqueue import Queue, get_job, sealing
from jobqueue.exceptions import JobFailed
from jobqueue.models import Job
from tests.jobapp import batch_jobs
from tests.servers import ValkeyProcess
from tests.workers import run_burst, wait_for

from .conftest import NEW, SECRET, client, database_dump, kid, sealed_settings, valkey_dump

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_batch_on_a_sealed_queue_opens_each_items_args_and_seals_each_outcome_under_its_own_id(
    settings: Any, valkey_server: ValkeyProcess
) -> None:
    env = {**sealed_settings(settings, valkey_server.url, [NEW]), "JOBQUEUE_TEST_BATCHES": "1"}
    handler = batch_jobs.confide_batch.using(queue="vault")
    refs = [handler.enqueue(f"{SECRET}-{i}") for i in range(3)]
    failing = handler.enqueue(f"{SECRET}-bad", fail=True)
    assert run_burst(valkey_server.url, "--queues", "vault", env=env) == 0
    for i, ref in enumerate(refs):
        assert ref.result(5) == {"echo": f"{SECRET}-{i}".upper(), "id": ref.id}
    with pytest.raises(JobFailed, match=f"cannot use {SECRET}-bad"):
        failing.result(5)
    ids = [ref.id for ref in refs] + [failing.id]
    wait_for(lambda: Job.objects.filter(pk__in=ids, state__in=["succeeded", "dead"]).count() == 4)
    stored = database_dump() + valkey_dump(client())
    for text in (SECRET, SECRET.upper()):
        assert text not in stored, f"{text!r} is stored in the clear"
    for i, ref in enumerate(refs):
        raw = Queue("vault").get(ref.id)
        assert raw is not None and sealing.sealed_key(raw.result) == kid(NEW)
        assert sealing.sealed_key(raw.progress) == kid(NEW)
        info = get_job(ref.id, "vault")  # (each opens under its own id only)
        assert info is not None and info.payload["args"] == [f"{SECRET}-{i}"]
        assert f"{SECRET}-{i}" in info.progress["at"] and info.result["id"] == ref.id
    dead = Queue("vault").get(failing.id)
    assert dead is not None and sealing.is_sealed(dead.last_error)
