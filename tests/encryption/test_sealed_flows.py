"""Encryption at rest meets flows across queues: a chord whose members and callback are on a
sealed queue and a plain one is sealed throughout (one sealed job or queue seals the flow), so
its callback gets plain results and neither queue stores a byte of them (on a cluster the two
queues' slots may lie on two nodes: a member's result then goes through the relay's stream)."""

from __future__ import annotations

from typing import Any

import pytest

from jobqueue import Queue, chord, sealing
from jobqueue.models import Job
from tests.jobapp import jobs
from tests.workers import run_burst, wait_for

from .conftest import NEW, SECRET, client, database_dump, kid, sealed_settings, valkey_dump

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize(("members", "callback"), [("vault", "default"), ("default", "vault")])
def test_a_chord_across_a_sealed_and_a_plain_queue_is_sealed_throughout(
    settings: Any, where: str, members: str, callback: str
) -> None:
    env = sealed_settings(settings, where, [NEW])
    header = [jobs.mul.using(queue=members).s(f"{SECRET}-{i}", 2) for i in range(3)]
    ref = chord(header, jobs.total.using(queue=callback).s()).enqueue()
    assert run_burst(where, "--queues", "vault,default", env=env) == 0
    assert ref.result(10) == [f"{SECRET}-{i}" * 2 for i in range(3)]  # (the callback's values)
    wait_for(lambda: Job.objects.filter(pk=ref.id, state="succeeded").exists())
    stored = database_dump() + valkey_dump(client())
    assert SECRET not in stored, "a value of the flow is stored in the clear"
    raw = Queue(callback).get(ref.id)
    assert raw is not None and sealing.sealed_key(raw.result) == kid(NEW)
    assert sealing.payload_key(raw.payload) == kid(NEW)
