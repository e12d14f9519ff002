"""Celery's canvas of bridged tasks runs as jobqueue flows (real Celery canvas objects, a real
worker serving the bridged tasks, no broker nor result backend)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import chain, chord, group

from tests.jobapp.celery_tasks import add, tsum
from tests.servers import ValkeyProcess
from tests.workers import start_worker

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def worker(valkey_server: ValkeyProcess, tmp_path: Path) -> Iterator[Path]:
    log = tmp_path / "worker.log"
    proc = start_worker(valkey_server.url, "--concurrency", "4", log=log)
    yield log
    proc.terminate()
    proc.wait(60)


def test_smoke(worker: Path) -> None:
    assert chain(add.s(2, 2), add.s(4), add.s(8)).apply_async().get(timeout=60) == 16
    assert group(add.s(i, i) for i in range(10)).apply_async().get(timeout=60) == [i * 2 for i in range(10)]
    assert chord([add.s(i, i) for i in range(5)])(tsum.s()).get(timeout=60) == 20
