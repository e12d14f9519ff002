"""Durable queues: the database row first (in the caller's transaction), Valkey after the
commit; a push that failed is resent by a worker; `jobqueue restore` rebuilds Valkey."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from django.db import transaction

from jobqueue import Queue, chain, get_job
from jobqueue.history import outbox
from jobqueue.models import Job
from tests.jobapp import jobs
from tests.servers import ValkeyProcess
from tests.workers import manage, run_burst

pytestmark = pytest.mark.django_db(transaction=True)
durable_add = jobs.add.using(queue="durable")


@pytest.fixture(autouse=True)
def _durable_queue(settings: Any) -> None:
    settings.JOBQUEUE = {**settings.JOBQUEUE, "QUEUES": {"default": {}, "durable": {"durable": True}}}


def in_valkey(job_id: str) -> bool:
    return Queue("durable").get(job_id) is not None


def test_the_row_is_written_in_the_transaction_and_the_job_reaches_valkey_on_commit() -> None:
    with transaction.atomic():
        ref = durable_add.enqueue(1, 2)
        row = Job.objects.get(pk=ref.id)
        assert row.durable and row.state == "pending" and row.payload["args"] == [1, 2]
        assert not in_valkey(ref.id)
    assert in_valkey(ref.id)


def test_a_rollback_leaves_neither_row_nor_job() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        ref = durable_add.using(delay=30).enqueue(1, 2)
        raise RuntimeError("rollback")
    assert not Job.objects.filter(pk=ref.id).exists() and not in_valkey(ref.id)
    assert Queue("durable").counts()["scheduled"] == 0


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_a_transaction_on_another_alias_holds_the_row_and_the_job_until_it_commits() -> None:
    # The rows are written on `default`, whose connection is in no transaction here: written
    # at once, they would outlive a rollback of "other" and a worker's resend would run them.
    flow = chain(durable_add.s(1, 2), jobs.mul.using(queue="durable").s(10))
    with pytest.raises(RuntimeError), transaction.atomic(using="other"):
        durable_add.enqueue(1, 2)
        flow.enqueue()
        raise RuntimeError("rollback")
    assert outbox.resend([Queue("durable")], grace=0) == 0
    assert not Job.objects.exists() and not any(Queue("durable").counts().values())
    with transaction.atomic(using="other"):
        ref = durable_add.enqueue(3, 4)
        last = flow.enqueue()
        assert not any(Queue("durable").counts().values())
    assert in_valkey(ref.id) and in_valkey(last.id)
    assert Job.objects.filter(durable=True).count() == 3


@pytest.mark.slow
def test_a_job_whose_push_failed_is_resent_once_valkey_answers(settings: Any,
                                                               valkey_server: ValkeyProcess) -> None:
    down = ValkeyProcess()  # never started: nothing listens on its port
    settings.JOBQUEUE = {**settings.JOBQUEUE, "URL": down.url}
    refs = durable_add.enqueue_many([(i, 1) for i in range(20)])  # no error: the rows hold them
    assert Job.objects.filter(durable=True, relayed=False).count() == 20
    settings.JOBQUEUE = {**settings.JOBQUEUE, "URL": valkey_server.url}
    assert not any(in_valkey(r.id) for r in refs)
    assert run_burst(valkey_server.url, "--queues", "durable") == 0
    rows = Job.objects.filter(pk__in=[r.id for r in refs])
    assert {row.state for row in rows} == {"succeeded"} and {row.result for row in rows} == set(
        range(1, 21))
    assert all(row.attempts == 1 for row in rows)


@pytest.mark.slow
def test_restore_brings_back_every_unfinished_durable_job_once(valkey_server: ValkeyProcess) -> None:
    refs = durable_add.enqueue_many([(i, i) for i in range(50)])
    later = durable_add.using(delay=3600, lane="tenant-1", priority=7).enqueue(5, 5)
    redis.Redis.from_url(valkey_server.url).flushall()  # Valkey lost its data
    first = manage("jobqueue", "restore", url=valkey_server.url)
    assert first.returncode == 0 and "restored 51 job(s)" in first.stdout, first.stderr
    second = manage("jobqueue", "restore", "--queues", "durable", url=valkey_server.url)
    assert "restored 0 job(s)" in second.stdout
    info = get_job(later.id, queue="durable")
    assert info and info.state == "scheduled" and info.lane == "tenant-1" and info.priority == 7
    Queue("durable").cancel(later.id)  # else the burst would wait an hour for it
    assert run_burst(valkey_server.url, "--queues", "durable") == 0
    done = Job.objects.filter(pk__in=[r.id for r in refs], state="succeeded")
    # (each ran once; a restored job's tokens start past any its runs before the loss held)
    spent = Queue("durable").options.max_attempts
    assert done.count() == 50 and all(row.attempts == spent + 1 for row in done)
    assert Job.objects.get(pk=later.id).state == "cancelled"
    assert "restored 0 job(s)" in manage("jobqueue", "restore", url=valkey_server.url).stdout


def test_stats_prints_counts_by_queue_and_state(valkey_server: ValkeyProcess) -> None:
    import json

    jobs.add.enqueue_many([(1, 1)] * 3)
    out = manage("jobqueue", "stats", "--json", url=valkey_server.url)
    assert out.returncode == 0 and json.loads(out.stdout)["default"]["pending"] == 3
    table = manage("jobqueue", "stats", url=valkey_server.url)
    assert "pending" in table.stdout and "default" in table.stdout


@pytest.mark.parametrize(("args", "message"), [
    (["restore", "--queues", "a b"], "invalid queue name"),
    (["resize"], "the following arguments are required: queue, N"),
    (["resize", "default", "0"], "N must be a whole number in 1…1024, got '0'"),
    (["resize", "default", "two"], "N must be a whole number in 1…1024, got 'two'"),
    (["resize", "a b", "2"], "invalid queue name"),
    (["frobnicate"], "invalid choice"),
    ([], "the following arguments are required"),
])
def test_the_jobqueue_command_refuses_bad_arguments_in_one_line(args: list[str], message: str,
                                                                 valkey_server: ValkeyProcess) -> None:
    done = manage("jobqueue", *args, url=valkey_server.url)
    assert done.returncode != 0 and message in done.stderr and "Traceback" not in done.stderr


def test_a_durable_duplicate_unique_key_is_cancelled_naming_the_job_that_holds_it() -> None:
    first = durable_add.using(unique_key="order-7").enqueue(1, 1)
    second = durable_add.using(unique_key="order-7").enqueue(2, 2)
    row = Job.objects.get(pk=second.id)
    assert row.state == "cancelled" and first.id in row.last_error and "order-7" in row.last_error
    assert Job.objects.get(pk=first.id).state == "pending" and in_valkey(first.id)


OPTIONS = {"max_attempts": 2, "backoff": 0, "lease": 45, "priority": 7, "lane": "tenant-9",
           "unique_key": "order-9"}


def _dead_durable_job(url: str) -> str:
    """A durable job with options of its own that a real worker ran until it died."""
    ref = jobs.always_fails.using(queue="durable", **OPTIONS).enqueue("no")
    assert run_burst(url, "--queues", "durable") == 0
    assert Job.objects.get(pk=ref.id).state == "dead"
    return ref.id


def _retry_as_an_operator(how: str, job_id: str, client: Any) -> None:
    from django.contrib.auth.models import User

    if how == "api":
        assert Queue("durable").retry(job_id) == "pending"
        return
    User.objects.create_superuser("root", "root@example.com", "pw")
    client.login(username="root", password="pw")
    if how == "bulk":
        data = {"action": "retry_selected", "_selected_action": [job_id], "post": "yes"}
        assert client.post("/admin/jobqueue/job/", data).status_code == 302
    else:
        url = f"/admin/jobqueue/job/live/jobs/durable/{job_id}/retry/"
        assert client.post(url).status_code == 302


@pytest.mark.slow
@pytest.mark.parametrize(("how", "valkey_kept_it"), [
    ("console", True), ("bulk", True), ("api", True),
    ("console", False), ("bulk", False),  # Queue.retry acts on a live row only
])
def test_a_retried_durable_job_is_restored_with_every_option(
        how: str, valkey_kept_it: bool, client: Any, valkey_server: ValkeyProcess) -> None:
    job_id = _dead_durable_job(valkey_server.url)
    if not valkey_kept_it:  # its Valkey row expired (DEAD_RETENTION): the retry re-creates it
        redis.Redis.from_url(valkey_server.url).flushall()
    _retry_as_an_operator(how, job_id, client)
    row = Job.objects.get(pk=job_id)
    assert row.state == "pending" and row.finished_at is None  # reopened with Valkey's job
    redis.Redis.from_url(valkey_server.url).flushall()  # then Valkey loses its data
    done = manage("jobqueue", "restore", "--queues", "durable", url=valkey_server.url)
    assert "restored 1 job(s)" in done.stdout, done.stderr
    info = get_job(job_id, queue="durable")
    assert info and info.state == "pending" and info.source == "valkey"
    assert (info.priority, info.lane, info.max_attempts, info.unique_key) == (
        7, "tenant-9", 2, "order-9")
    queue = Queue("durable")
    assert queue.client.hmget(queue.shard(info.shard).job(job_id), "backoff_ms", "lease_ms") == [
        "0", "45000"]
    [lease] = queue.dequeue(count=1)  # the job's own lease, not the queue's 30 s
    assert lease.job_id == job_id and lease.lease == 45.0


@pytest.mark.slow
def test_restore_keeps_a_durable_jobs_expiry_and_marks_a_job_past_it_expired(
        valkey_server: ValkeyProcess) -> None:
    from datetime import UTC, datetime, timedelta

    later = durable_add.using(expires=3600).enqueue(1, 1)
    gone = durable_add.using(expires=3600).enqueue(2, 2)
    row = Job.objects.get(pk=later.id)
    assert row.expires_at is not None and abs(
        (row.expires_at - datetime.now(UTC)).total_seconds() - 3600) < 60
    # Valkey loses its data, and by the restore one job's time has run out.
    redis.Redis.from_url(valkey_server.url).flushall()
    Job.objects.filter(pk=gone.id).update(expires_at=datetime.now(UTC) - timedelta(seconds=1))
    done = manage("jobqueue", "restore", "--queues", "durable", url=valkey_server.url)
    assert "restored 1 job(s)" in done.stdout, done.stderr
    info = get_job(later.id, queue="durable")
    assert info and info.source == "valkey" and info.expires_at is not None
    assert abs((info.expires_at - row.expires_at).total_seconds()) < 60
    assert not in_valkey(gone.id)
    expired = Job.objects.get(pk=gone.id)
    assert expired.state == "expired" and expired.finished_at is not None
    assert "restored 0 job(s)" in manage("jobqueue", "restore", url=valkey_server.url).stdout


def test_debounce_is_refused_on_a_durable_queue_and_nothing_is_written() -> None:
    # A debounce replaces the waiting job's arguments in Valkey; the durable row, written
    # first, would keep the old ones, and a restore would bring them back.
    from jobqueue.exceptions import InvalidOption
    from jobqueue.spec import JobSpec

    refused = "debounce cannot be used on a durable queue"
    with pytest.raises(InvalidOption, match=refused), transaction.atomic():
        durable_add.using(unique_key="tenant-1", debounce=2).enqueue(1, 1)
    with pytest.raises(InvalidOption, match=refused):
        Queue("durable").enqueue_many([JobSpec({"handler": "x"}, unique_key="k", debounce=2)])
    assert not Job.objects.exists()
    counts = Queue("durable").counts()
    assert counts["pending"] + counts["scheduled"] == 0
    assert jobs.add.using(unique_key="tenant-1", debounce=2).enqueue(1, 1).created  # (plain: fine)


def test_a_retried_runs_event_mirrored_late_leaves_the_reopened_row_unfinished() -> None:
    # The job died, its `done` event still waits in the stream (no mirror ran yet), and an
    # operator retries it: the row reopens. The late event must not make it dead again, or a
    # restore after Valkey lost its data would miss the pending job.
    from jobqueue.history.mirror import Mirror

    ref = jobs.always_fails.using(queue="durable", max_attempts=1).enqueue("no")
    queue = Queue("durable")
    [lease] = queue.dequeue(count=1)
    assert queue.nack(lease, "boom") == "dead"
    assert queue.retry(ref.id) == "pending"
    mirror = Mirror([queue], consumer="t")
    assert mirror.step() == 0 and mirror.backlog() == 0  # (read and acknowledged all the same)
    row = Job.objects.get(pk=ref.id)
    assert (row.state, row.finished_at) == ("pending", None)
    # The retried job's own end is mirrored, even one with the same attempts (cancelled before
    # it ran again).
    assert queue.cancel(ref.id) == "cancelled"
    assert mirror.step() == 1
    assert Job.objects.get(pk=ref.id).state == "cancelled"


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_rows_that_cannot_be_written_after_another_alias_commits_leave_the_jobs_in_valkey(
        caplog: pytest.LogCaptureFixture) -> None:
    """The rows are written after the commit of a transaction on "other": if the database
    refuses them then, the jobs still go to Valkey (plain jobs, not durable ones), never lost."""
    from django.db import OperationalError, connections

    def refuse_rows(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if sql.lstrip().upper().startswith("INSERT") and "jobqueue_job" in sql:
            raise OperationalError(2006, "MySQL server has gone away")
        return execute(sql, params, many, context)

    flow = chain(durable_add.s(1, 2), jobs.mul.using(queue="durable").s(10))
    with connections["default"].execute_wrapper(refuse_rows), transaction.atomic(using="other"):
        ref = durable_add.enqueue(3, 4)
        last = flow.enqueue()
    assert not Job.objects.exists()
    assert in_valkey(ref.id) and in_valkey(last.id)
    assert "sent to Valkey without" in caplog.text


@pytest.mark.slow
def test_restore_keeps_a_durable_jobs_timeout(valkey_server: ValkeyProcess) -> None:
    ref = durable_add.using(timeout=2.5, lease=45).enqueue(1, 1)
    assert Job.objects.get(pk=ref.id).timeout_ms == 2500
    redis.Redis.from_url(valkey_server.url).flushall()  # Valkey loses its data
    done = manage("jobqueue", "restore", "--queues", "durable", url=valkey_server.url)
    assert "restored 1 job(s)" in done.stdout, done.stderr
    info = get_job(ref.id, queue="durable")
    assert info and info.source == "valkey" and info.timeout == 2.5
    [lease] = Queue("durable").dequeue(count=1)
    assert (lease.lease, lease.timeout) == (3.5, 2.5)  # (the lease ends a second past it)
