"""django.tasks backend, Celery tasks, the @job API and on-commit enqueue, through a real worker."""

from __future__ import annotations

import pytest
from django.db import transaction

try:
    from django.tasks import TaskResultStatus, task_backends
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import TaskResultStatus, task_backends  # type: ignore[no-redef]

from jobqueue import Queue, enqueue, get_job
from jobqueue.exceptions import InvalidOption, InvalidPriority, UnknownHandler
from jobqueue.models import Job
from jobqueue.spec import JobSpec
from tests.jobapp import celery_tasks, django_tasks, jobs
from tests.servers import ValkeyProcess
from tests.workers import run_burst, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _tasks_backend(settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKS = {"default": {"BACKEND": "jobqueue.tasks.ValkeyBackend"}}


def test_enqueue_inside_a_rolled_back_transaction_enqueues_nothing() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        jobs.add.enqueue(1, 2)
        raise RuntimeError("rollback")
    assert Queue("default").counts()["pending"] == 0


def test_enqueue_inside_a_transaction_waits_for_the_commit() -> None:
    with transaction.atomic():
        ref = jobs.add.enqueue(1, 2)
        now = jobs.add.using(immediate=True).enqueue(3, 4)
        assert get_job(ref.id) is None and get_job(now.id) is not None
    info = get_job(ref.id)
    assert info and info.state == "pending" and info.payload["args"] == [1, 2]


def test_a_handlers_enqueue_that_meets_a_taken_id_mints_another(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The short way (`store.Template.enqueue`) sends no `Prepared`; when the shard says its minted
    id is taken by another job, it goes the batches' way (`Queue.enqueue_prepared`), which mints
    anew. The other job's row is left as it was."""
    from jobqueue import ids

    first = jobs.add.enqueue(1, 2)
    taken, mint = iter([first.id]), ids.new_id
    monkeypatch.setattr(ids, "new_id", lambda: next(taken, None) or mint())
    second = jobs.add.enqueue(3, 4)
    assert second.id != first.id and second.created
    assert get_job(first.id).payload["args"] == [1, 2]  # type: ignore[union-attr]
    assert get_job(second.id).payload["args"] == [3, 4]  # type: ignore[union-attr]


def test_the_transaction_check_agrees_with_django_wherever_it_runs() -> None:
    """`_compat.in_transaction` reads a sync thread's connection without asgiref's `Local` (see its
    docstring); it must answer as `transaction.get_connection()` does: outside and inside
    `atomic()`, in a thread that never opened a connection, and on an event loop."""
    import asyncio
    import threading

    from jobqueue._compat import in_transaction

    def both() -> tuple[bool, bool]:
        return in_transaction(), transaction.get_connection().in_atomic_block

    assert both() == (False, False)
    with transaction.atomic():
        assert both() == (True, True)
        with transaction.atomic():
            assert both() == (True, True)
        seen: list[bool] = []
        thread = threading.Thread(target=lambda: seen.append(in_transaction()))
        thread.start()
        thread.join()
        assert seen == [False]  # (another thread's connection: no transaction there)

        async def on_a_loop() -> tuple[bool, bool]:
            return both()

        assert asyncio.run(on_a_loop()) == (False, False)
    assert both() == (False, False)


def test_enqueue_by_dotted_path_uses_the_handlers_defaults() -> None:
    ref = enqueue("tests.jobapp.jobs.always_fails", args=["x"], priority=7)
    info = get_job(ref.id)
    assert info and info.priority == 7 and info.max_attempts == 2


def test_a_handlers_enqueue_writes_the_row_the_long_way_writes(settings) -> None:  # type: ignore[no-untyped-def]
    """A handler validates its options once per configuration and sends each job with the
    script arguments worked out then (`JobFunction._routed`): the row is the one `Queue.enqueue`
    writes from the options given per call, and a setting changed afterwards reaches the next
    enqueue."""
    options = {"priority": 5, "lane": "tenant-1", "max_attempts": 4, "backoff": 3, "lease": 60}
    handler = jobs.add.using(**options)
    short = handler.enqueue(1, 2)
    long = Queue("default").enqueue({"handler": "tests.jobapp.jobs.add", "args": [1, 2]}, **options)
    queue = Queue("default")
    rows = [queue.client.hgetall(queue.shard(0).job(ref.id)) for ref in (short, long)]
    assert rows[0] == rows[1] and rows[0]["lane"] == "tenant-1"
    settings.JOBQUEUE = {**settings.JOBQUEUE, "QUEUES": {"default": {"durable": True}}}
    assert Job.objects.filter(pk=handler.enqueue(3, 4).id, durable=True).exists()


def test_api_refuses_bad_input_clearly() -> None:
    with pytest.raises(InvalidPriority):
        jobs.add.using(priority=500).enqueue(1, 2)
    with pytest.raises(InvalidOption, match="unknown option"):
        jobs.add.using(colour="red")
    with pytest.raises(UnknownHandler):
        enqueue("", args=[])
    with pytest.raises(InvalidOption, match="ctx"):
        from jobqueue import job

        @job(takes_context=True)
        def no_ctx(x: int) -> None: ...


@pytest.mark.slow
def test_django_tasks_run_on_the_worker_with_results(valkey_server: ValkeyProcess) -> None:
    ok = django_tasks.multiply.using(priority=10).enqueue(6, 7)
    bad = django_tasks.explode.enqueue()
    ctx = django_tasks.which_attempt.enqueue()
    later = django_tasks.add_later.enqueue(2, 3)  # an async task: on the worker's event loop
    assert ok.status == TaskResultStatus.READY and task_backends["default"].supports_get_result
    assert run_burst(valkey_server.url) == 0
    assert django_tasks.add_later.get_result(later.id).return_value == 5
    ok.refresh()
    assert ok.status == TaskResultStatus.SUCCESSFUL and ok.return_value == 42
    bad = django_tasks.explode.get_result(bad.id)
    assert bad.status == TaskResultStatus.FAILED and "kaboom" in bad.errors[0].traceback
    assert django_tasks.which_attempt.get_result(ctx.id).return_value == 1


@pytest.mark.slow
def test_celery_tasks_run_unchanged_with_retries(valkey_server: ValkeyProcess) -> None:
    res = celery_tasks.shout.delay("hi")
    later = celery_tasks.flaky.apply_async(args=[2], countdown=0, priority=5, queue="default")
    assert run_burst(valkey_server.url) == 0
    assert Job.objects.get(pk=res.id).result == "HI!"
    row = Job.objects.get(pk=later.id)
    assert row.state == "succeeded" and row.result == 3 and row.attempts == 3 and row.priority == 5


def test_mirror_keeps_ids_that_differ_only_in_case_apart() -> None:
    from jobqueue.history.mirror import upsert

    upsert([{"id": "JOB0000000000a", "state": "succeeded"},
            {"id": "JOB0000000000A", "state": "dead"}], "q")
    upsert([{"id": "JOB0000000000a", "state": "succeeded", "result": "1"}], "q")
    assert dict(Job.objects.values_list("id", "state")) == {
        "JOB0000000000a": "succeeded", "JOB0000000000A": "dead"}
    assert Job.objects.get(pk="JOB0000000000a").result == 1


def test_the_mirror_rereads_what_a_failed_write_left_and_takes_over_a_dead_workers(
        valkey_server: ValkeyProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    # (it no longer reads those on every pass: only when some may wait, and every third of the
    # idle time a dead worker's entries must reach)
    from django.db import DatabaseError

    from jobqueue.history import mirror

    def finish(queue: Queue, n: int) -> set[str]:
        refs = queue.enqueue_many([JobSpec(i) for i in range(n)])
        for lease in queue.dequeue(count=n, lease=30, worker="t"):
            assert queue.ack(lease)
        return {r.id for r in refs}

    def failing(*_: object) -> int:
        raise DatabaseError("the database is down")

    queue = Queue("mirrored")
    ids = finish(queue, 3)
    alive = mirror.Mirror([queue], consumer="alive")
    with monkeypatch.context() as patch:
        patch.setattr(mirror, "upsert", failing)
        with pytest.raises(DatabaseError):
            alive.step()  # read, not written: pending with this consumer
    assert alive.step() == 3 and set(Job.objects.values_list("id", flat=True)) == ids
    more = finish(queue, 2)
    dead = mirror.Mirror([queue], consumer="dead")
    with monkeypatch.context() as patch:
        patch.setattr(mirror, "upsert", failing)
        with pytest.raises(DatabaseError):
            dead.step()  # then the worker dies with them
    heir = mirror.Mirror([queue], consumer="heir", claim_idle=0.5)
    taken = [heir.step()]
    assert taken == [0]  # not idle long enough yet
    wait_for(lambda: taken.append(heir.step()) or sum(taken) >= 2)  # idle long enough: taken over
    assert sum(taken) == 2 and set(Job.objects.values_list("id", flat=True)) == ids | more
    assert alive.step() == 0 and heir.backlog() == 0


def test_shard_rows_record_counts_and_draining_shards(valkey_server: ValkeyProcess) -> None:
    from jobqueue.history.mirror import record_shards
    from jobqueue.models import Shard

    Queue("wide", shards=3).enqueue_many([JobSpec(i) for i in range(30)])
    record_shards(Queue("wide", shards=2))
    rows = {s.index: s for s in Shard.objects.filter(queue="wide")}
    assert sum(s.pending for s in rows.values()) == 30
    assert [rows[i].status for i in range(3)] == ["active", "active", "draining"]


@pytest.mark.slow
def test_get_job_falls_back_to_the_mirror_once_the_row_expires(valkey_server: ValkeyProcess) -> None:
    ref = jobs.add.enqueue(20, 22)
    assert run_burst(valkey_server.url) == 0
    info = get_job(ref.id)
    assert info and info.source == "valkey"
    row, client = f"emq:{{default}}:job:{ref.id}", Queue("default").client
    client.pexpire(row, 1)  # retention runs out
    wait_for(lambda: not client.exists(row))
    info = get_job(ref.id)
    assert info and info.source == "mirror" and info.state == "succeeded" and info.result == 42


def test_worker_summary_reports_rate_and_lag(valkey_server: ValkeyProcess, caplog) -> None:  # type: ignore[no-untyped-def]
    import logging

    from jobqueue.worker import Worker, WorkerConfig

    jobs.add.enqueue(1, 1)
    worker = Worker(WorkerConfig(queues=("default",), summary_every=1.0, mirror=False))
    worker.served.add(Queue("default"))
    with caplog.at_level(logging.INFO, logger="jobqueue.worker"):
        worker.maintenance.summary()
    [line] = [r.getMessage() for r in caplog.records if "summary" in r.getMessage()]
    assert "jobs/s" in line and "pending=1" in line and "lag=" in line
    from jobqueue.console import readmodels

    view = readmodels.overview(Queue("default"))  # the summary sampled this minute for the charts
    assert view.backlog[-1] == 1 and view.oldest[-1] >= 0


def test_workers_silent_for_ten_minutes_are_forgotten(valkey_server: ValkeyProcess) -> None:
    import json
    import time

    from jobqueue.worker import Worker, WorkerConfig

    client = Queue("default").client
    client.hset("{emq}:workers", "ghost", json.dumps({"name": "ghost", "heartbeat": time.time() - 3600}))
    client.hset("{emq}:workers", "alive", json.dumps({"name": "alive", "heartbeat": time.time()}))
    worker = Worker(WorkerConfig(queues=("default",), mirror=False))
    worker.served.add(Queue("default"))
    worker.maintenance.summary()
    assert client.hkeys("{emq}:workers") == ["alive"]


def test_celery_options_jobqueue_cannot_honour_are_refused() -> None:
    with pytest.raises(InvalidOption, match="chord"):
        celery_tasks.shout.apply_async(args=["x"], chord=celery_tasks.shout.s("z"))
    with pytest.raises(InvalidOption, match="xstarmap"):
        celery_tasks.shout.starmap([("y",)]).delay()
    assert Queue("default").counts()["pending"] == 0
    assert celery_tasks.shout.apply_async(args=["x"], serializer="json").id.startswith("JOB")


def test_an_explicit_empty_queue_name_is_refused_not_defaulted() -> None:
    from jobqueue.exceptions import InvalidName

    with pytest.raises(InvalidName, match="invalid queue name ''"):
        enqueue("tests.jobapp.jobs.add", args=[1, 2], queue="")
    with pytest.raises(InvalidName, match="invalid queue name ''"):
        jobs.add.using(queue="")
    assert Queue("default").counts()["pending"] == 0
