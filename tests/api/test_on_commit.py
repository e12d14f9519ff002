"""Enqueue inside a transaction: the job goes once the transaction commits, on whichever database
alias the caller's transaction is on; a Valkey error at the commit never drops the transaction's
other on-commit callbacks; under Django's TestCase the test says when jobs go."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from django.db import transaction

from jobqueue import Queue, chain, get_job
from jobqueue.exceptions import JobNotFound
from tests.jobapp import jobs


@pytest.mark.django_db(transaction=True)
def test_a_valkey_error_at_commit_is_logged_and_the_other_callbacks_still_run(
        settings: Any, caplog: pytest.LogCaptureFixture) -> None:
    settings.JOBQUEUE = {**settings.JOBQUEUE, "URL": "redis://127.0.0.1:1/0"}  # nothing there
    ran: list[str] = []
    with caplog.at_level(logging.ERROR, logger="jobqueue"), transaction.atomic():
        ref = jobs.add.enqueue(1, 2)  # (an id now; Valkey at the commit)
        flow = chain(jobs.add.s(1, 2), jobs.mul.s(3)).enqueue()
        transaction.on_commit(lambda: ran.append("mine"))  # (robust=False: Django's default)
    assert ran == ["mine"]
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any(ref.id in e and "lost" in e for e in errors), errors
    assert any(flow.id in e for e in errors), errors


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_a_transaction_on_another_alias_holds_the_job_until_it_commits() -> None:
    with pytest.raises(RuntimeError), transaction.atomic(using="other"):
        rolled_back = jobs.add.enqueue(1, 2)
        raise RuntimeError("rollback")
    assert get_job(rolled_back.id) is None
    with transaction.atomic(using="other"):
        ref = jobs.add.enqueue(3, 4)
        assert get_job(ref.id) is None
    assert (info := get_job(ref.id)) and info.state == "pending"


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_a_job_enqueued_inside_transactions_on_two_aliases_waits_for_both() -> None:
    with transaction.atomic(using="other"):
        with pytest.raises(RuntimeError), transaction.atomic():
            rolled_back = jobs.add.enqueue(1, 2)
            raise RuntimeError("rollback on default")
        with transaction.atomic():
            ref = jobs.add.enqueue(3, 4)
        assert get_job(ref.id) is None  # ("other" has not committed yet)
    assert get_job(rolled_back.id) is None
    assert (info := get_job(ref.id)) and info.state == "pending"


@pytest.mark.django_db  # (Django's TestCase: each test inside a transaction rolled back after it)
def test_under_testcase_jobs_go_when_the_test_runs_the_commit_callbacks(
        django_capture_on_commit_callbacks: Any, settings: Any) -> None:
    held = jobs.add.enqueue(1, 1)
    with pytest.raises(JobNotFound):  # never committed: never sent
        held.result(timeout=0)
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        ref = jobs.add.enqueue(1, 2)
    assert len(callbacks) == 1
    assert (info := get_job(ref.id)) and info.state == "pending"
    settings.JOBQUEUE = {**settings.JOBQUEUE, "ON_COMMIT": False}  # the test mode: at once
    now = jobs.add.enqueue(2, 2)
    assert (info := get_job(now.id)) and info.state == "pending"
    assert Queue("default").counts()["pending"] == 2


@pytest.mark.django_db(transaction=True)
def test_a_worker_run_in_the_test_process_runs_what_the_test_enqueued() -> None:
    """The recipe of docs/howto/testing.md: after the commit, a burst worker in the test's own
    process runs the jobs (no mirror: the test reads results from Valkey)."""
    from jobqueue.worker import Worker, WorkerConfig

    with transaction.atomic():
        ref = jobs.add.enqueue(2, 3)
    Worker(WorkerConfig(queues=("default",), burst=True, mirror=False)).run()
    assert ref.result(timeout=1) == 5
