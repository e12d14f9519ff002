"""The worker's signals meet the database as a request does (the real runworker, with receivers
that query): a `job_finished` receiver's connection is checked around it, so one the server
dropped is replaced; `job_started` for an `async def` job is sent off the event loop, where
the ORM works."""

from __future__ import annotations

import signal

import pytest

from jobqueue import Queue, get_job
from tests.jobapp import jobs
from tests.servers import ValkeyProcess
from tests.worker.test_worker_lifecycle import kill_session
from tests.workers import database_url, start_worker, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_receivers_that_query_survive_a_dropped_connection_and_run_off_the_loop(
        valkey_server: ValkeyProcess) -> None:
    from django.db import connection

    if connection.vendor not in ("mysql", "postgresql"):
        pytest.skip("needs MariaDB or PostgreSQL")
    client = Queue("default").client
    worker = start_worker(valkey_server.url, "--concurrency", "1",
                          db_url=database_url() + "?conn_max_age=600&conn_health_checks=true",
                          env={"JOBQUEUE_TEST_RECEIVERS": "1"})
    try:
        jobs.add.enqueue(1, 1)
        wait_for(lambda: client.llen("test:finished-sessions") == 1, timeout=60)
        assert kill_session(int(client.lindex("test:finished-sessions", 0)))
        jobs.add.enqueue(2, 2)
        wait_for(lambda: client.llen("test:finished-sessions") == 2)  # a new connection
        coroutine = jobs.async_sleep.enqueue(0)
        wait_for(lambda: (get_job(coroutine.id) or coroutine).state == "succeeded")  # type: ignore[union-attr]
        wait_for(lambda: coroutine.id in client.lrange("test:started-orm", 0, -1))
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(20) == 0
