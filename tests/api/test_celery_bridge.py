"""The Celery bridge keeps Celery's meaning: a raise is one failure, `request.retries` counts
the runs that were charged, routing picks the queue, and what it cannot honour is refused by
name (real Celery tasks, run by the real worker without a broker)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from celery import Celery
from celery.result import AsyncResult

from jobqueue import Queue, get_job, ids
from jobqueue.exceptions import InvalidOption
from jobqueue.models import Job
from tests.jobapp import celery_tasks
from tests.servers import ValkeyProcess
from tests.workers import run_burst

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.slow
def test_celery_tasks_fail_retry_and_count_their_retries_as_celery_does(
        valkey_server: ValkeyProcess) -> None:
    handed_back = celery_tasks.reports_retries.delay()
    queue = Queue("default")
    [lease] = queue.dequeue(count=1, worker="stopping")
    assert lease.job_id == handed_back.id and queue.release(lease)  # uncharged: no retry
    declined = celery_tasks.charge_card.delay(42)
    once = celery_tasks.retries_at_most_once.delay()
    new_args = celery_tasks.retries_with_new_args.delay(1)
    no_throw = celery_tasks.retries_without_throw.delay()
    assert run_burst(valkey_server.url) == 0

    def row(result: AsyncResult) -> tuple[str, int, str]:
        job = Job.objects.get(pk=result.id)
        return job.state, job.attempts, job.last_error

    assert Job.objects.get(pk=handed_back.id).result == 0  # (its token is 2: one hand-back)
    state, attempts, error = row(declined)
    assert (state, attempts) == ("dead", 1) and "ValueError: card declined: 42" in error
    state, attempts, error = row(once)
    assert (state, attempts) == ("dead", 2) and "ConnectionError: still down" in error
    for result, option in ((new_args, "args"), (no_throw, "throw")):
        state, attempts, error = row(result)
        assert (state, attempts) == ("dead", 1) and f"retry({option}=" in error, error


@pytest.fixture
def routed_app() -> Iterator[Celery]:
    """A Celery app of its own with `task_routes` (its tasks registered on it alone)."""
    app = Celery("routed", task_cls="jobqueue.contrib.celery:JobTask", set_as_current=False)
    app.conf.task_routes = {"routed.report*": {"queue": "reports"}}
    yield app
    app.close()


@pytest.mark.filterwarnings("ignore::celery.exceptions.CDeprecationWarning")  # (a task's queue)
def test_a_tasks_queue_comes_from_celerys_routing(routed_app: Celery) -> None:
    @routed_app.task(name="routed.report_daily")
    def report_daily() -> None: ...

    @routed_app.task(name="routed.report_own", queue="emails")
    def report_own() -> None: ...

    @routed_app.task(name="routed.other")
    def other() -> None: ...

    routed = report_daily.delay()
    assert get_job(routed.id, queue="reports") is not None
    explicit = report_daily.apply_async(queue="urgent")  # apply_async's queue first
    assert get_job(explicit.id, queue="urgent") is not None
    own = report_own.delay()  # the task's own queue, before task_routes
    assert get_job(own.id, queue="emails") is not None
    assert get_job(other.delay().id) is not None  # no route: jobqueue's `default`


def test_task_id_and_expires_are_honoured_and_what_cannot_be_is_refused_by_name() -> None:
    wanted = ids.new_id()
    assert celery_tasks.shout.apply_async(args=["x"], task_id=wanted).id == wanted
    with pytest.raises(InvalidOption, match="task_id"):
        celery_tasks.shout.apply_async(args=["x"], task_id="6f1c9d2e-uuid-of-celery")
    soon = datetime.now(UTC) + timedelta(minutes=5)
    expiring = celery_tasks.shout.apply_async(args=["x"], expires=soon)
    info = get_job(expiring.id)
    assert info and info.expires_at is not None and abs(info.expires_at - soon).total_seconds() < 1
    for option in ({"chord": celery_tasks.shout.s("z")}, {"link": celery_tasks.shout.s("y"),
                                                            "colour": "red"}):
        with pytest.raises(InvalidOption, match=r"\['(chord|colour)'\]"):
            celery_tasks.shout.apply_async(args=["x"], **option)
    assert Queue("default").counts()["pending"] == 2


def test_a_bad_time_limit_or_soft_time_limit_is_refused_at_enqueue_naming_it() -> None:
    for option, bad in (("time_limit", 0), ("time_limit", "soon"), ("soft_time_limit", -1),
                        ("soft_time_limit", "soon")):
        with pytest.raises(InvalidOption, match=rf"^{option} must"):
            celery_tasks.shout.apply_async(["x"], **{option: bad})
    with pytest.raises(InvalidOption, match=r"^soft_time_limit must"):  # (the task's own)
        celery_tasks.has_a_bad_soft_limit.delay()
    assert Queue("default").counts()["pending"] == 0
