"""jobqueue's django.tasks backend held to what django-tasks' own backends are held to (its RQ
and database backends' tests, rewritten as checks of a real backend and a real worker): enqueue,
get_result, statuses, errors, priorities, run_after, queue names, signals and log lines, result
values. The same checks run on Django 6.1 (`django.tasks`) and on Django 5.2 with the backport
(`django_tasks`, the nox cells)."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

try:
    from django.tasks import TaskResultStatus, task_backends
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist, TaskResultMismatch
    from django.tasks.signals import task_enqueued, task_finished, task_started

    LOGGER = "django.tasks"
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import TaskResultStatus, task_backends  # type: ignore[no-redef]
    from django_tasks.exceptions import TaskResultDoesNotExist, TaskResultMismatch  # type: ignore[no-redef]
    from django_tasks.signals import task_enqueued, task_finished, task_started  # type: ignore[no-redef]

    try:
        from django_tasks.exceptions import InvalidTask  # type: ignore[no-redef,attr-defined]
    except ImportError:  # (its name up to 0.12)
        from django_tasks.exceptions import InvalidTaskError as InvalidTask  # type: ignore[no-redef]
    LOGGER = "django_tasks"

from jobqueue import Queue, get_job, ids
from jobqueue.tasks import ValkeyBackend
from tests.inprocess import burst
from tests.jobapp import jobs
from tests.jobapp.django_tasks import (
    RAN,
    TaskBroke,
    anoop,
    complex_exception,
    fails_on_its_first_run,
    fails_with_its_own_error,
    fails_with_value_error,
    meaning_of_life,
    multiply,
    noop,
    own_id,
    record,
    returns_bytes_and_tuples,
    returns_what_json_cannot_hold,
    sees_its_context,
)
from tests.servers import ValkeyProcess
from tests.workers import run_burst

pytestmark = pytest.mark.django_db(transaction=True)
READY, RUNNING = TaskResultStatus.READY, TaskResultStatus.RUNNING
SUCCESSFUL, FAILED = TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED


@pytest.fixture(autouse=True)
def _backend(settings: Any) -> None:
    settings.TASKS = {"default": {"BACKEND": "jobqueue.tasks.ValkeyBackend",
                                  "QUEUES": ["default", "emails"]}}
    settings.JOBQUEUE = {**settings.JOBQUEUE, "QUEUES": {"default": {"max_attempts": 1},
                                                         "emails": {"max_attempts": 1}}}
    RAN.clear()


@contextmanager
def received(signal: Any) -> Iterator[list[tuple[Any, Any, str]]]:
    """What `signal` sent meanwhile: (sender, task result, its status when sent)."""
    got: list[tuple[Any, Any, str]] = []

    def receiver(sender: Any, task_result: Any, **_: Any) -> None:
        got.append((sender, task_result, task_result.status))

    signal.connect(receiver)
    try:
        yield got
    finally:
        signal.disconnect(receiver)


def _backend_() -> ValkeyBackend:
    backend = task_backends["default"]
    assert isinstance(backend, ValkeyBackend)
    return backend


def _assert_ready(result: Any, task: Any, args: list[Any], kwargs: dict[str, Any]) -> None:
    assert result.status == READY and not result.is_finished and result.errors == []
    assert result.started_at is None and result.last_attempted_at is None
    assert result.finished_at is None and result.enqueued_at is not None
    with pytest.raises(ValueError, match="Task has not finished yet"):
        result.return_value  # noqa: B018
    assert result.task == task and result.args == args and result.kwargs == kwargs
    assert result.attempts == 0 and result.backend == "default"


def _assert_finished(result: Any, status: str) -> None:
    assert result.status == status and result.is_finished, (result.status, result.errors)
    assert None not in (result.started_at, result.last_attempted_at, result.finished_at)
    assert result.enqueued_at <= result.started_at <= result.finished_at
    assert result.attempts == 1


def test_the_backend_is_jobqueues_and_supports_all_django_asks() -> None:
    backend = _backend_()
    assert backend.alias == "default" and backend.options == {}
    assert backend.queues == {"default", "emails"}
    assert backend.supports_defer and backend.supports_async_task
    assert backend.supports_get_result and backend.supports_priority


@pytest.mark.parametrize("task", [noop, anoop], ids=["sync", "async"])
def test_enqueue_answers_a_ready_result_and_sends_task_enqueued(task: Any, caplog: Any) -> None:
    with received(task_enqueued) as got, caplog.at_level(logging.DEBUG, logger=LOGGER):
        result = task.enqueue(1, two=3)
    assert [(sender, r) for sender, r, _ in got] == [(ValkeyBackend, result)]
    _assert_ready(result, task, [1], {"two": 3})
    assert f"Task id={result.id} path={task.module_path} enqueued backend=default" in caplog.text
    with received(task_enqueued) as got:
        result = asyncio.run(task.aenqueue())
    assert [(sender, r) for sender, r, _ in got] == [(ValkeyBackend, result)]
    _assert_ready(result, task, [], {})


def test_get_result_answers_the_enqueued_result_with_its_using_options() -> None:
    backend = _backend_()
    later = timezone.now() + timedelta(hours=1, microseconds=123)
    for task in (noop, noop.using(priority=10), noop.using(queue_name="emails"),
                 noop.using(run_after=later), anoop.using(priority=-5, queue_name="emails",
                                                          run_after=later)):
        result = task.enqueue(1, two=[3])
        assert backend.get_result(result.id) == result
        assert asyncio.run(backend.aget_result(result.id)) == result
        assert task.get_result(result.id) == result and task.get_result(result.id).task == task
    with pytest.raises(TaskResultMismatch):
        multiply.get_result(result.id)


@pytest.mark.parametrize("result_id", [ids.new_id(), str(uuid.uuid4()), "", "not a job id",
                                       "JOB" + "x" * 100, "../../etc/passwd"],
                         ids=["unknown-job-id", "uuid", "empty", "words", "long", "path"])
def test_get_result_of_an_unknown_id_raises_does_not_exist(result_id: str) -> None:
    backend = _backend_()
    with pytest.raises(TaskResultDoesNotExist):
        backend.get_result(result_id)
    with pytest.raises(TaskResultDoesNotExist):
        asyncio.run(backend.aget_result(result_id))


def test_get_result_of_a_job_that_is_no_task_raises_does_not_exist() -> None:
    ref = jobs.add.enqueue(1, 2)
    with pytest.raises(TaskResultDoesNotExist):
        _backend_().get_result(ref.id)


@pytest.mark.slow
def test_refresh_follows_a_task_to_success() -> None:
    result = meaning_of_life.enqueue()
    other = meaning_of_life.enqueue()
    burst()
    result.refresh()
    _assert_finished(result, SUCCESSFUL)
    assert result.return_value == 42 and result.errors == []
    asyncio.run(other.arefresh())
    _assert_finished(other, SUCCESSFUL)
    assert other.return_value == 42


@pytest.mark.slow
def test_a_failed_task_names_its_exception_class_and_keeps_its_traceback() -> None:
    cases = {
        fails_with_value_error.enqueue().id: (ValueError,
                                              "ValueError: This task failed due to ValueError\n"),
        complex_exception.enqueue().id: (ValueError, "ValueError: This task failed\n"),
        fails_with_its_own_error.enqueue().id: (
            TaskBroke, "tests.jobapp.django_tasks.TaskBroke: a task's own exception\n"),
    }
    burst()
    for result_id, (exception, ends) in cases.items():
        result = _backend_().get_result(result_id)
        _assert_finished(result, FAILED)
        with pytest.raises(ValueError, match="Task failed"):
            result.return_value  # noqa: B018
        [error] = result.errors
        assert error.exception_class is exception, error.exception_class_path
        assert error.traceback.endswith(ends), error.traceback[-500:]
    traceback = _backend_().get_result(list(cases)[1]).errors[0].traceback
    assert 'ValueError(ValueError("This task failed"))' in traceback


@pytest.mark.slow
def test_return_values_are_json_and_one_json_cannot_hold_fails_the_task() -> None:
    bad, ok = returns_what_json_cannot_hold.enqueue(), returns_bytes_and_tuples.enqueue()
    with received(task_finished) as finished:
        burst()
    bad.refresh()
    ok.refresh()
    _assert_finished(bad, FAILED)
    assert bad._return_value is None and "JSON" in bad.errors[0].traceback
    _assert_finished(ok, SUCCESSFUL)
    assert ok.return_value == {"b": "bytes", "t": [1, 2]}
    said = {r.id: (status, r) for _, r, status in finished}
    assert said[bad.id][0] == FAILED and issubclass(said[bad.id][1].errors[0].exception_class, TypeError)
    assert said[ok.id][0] == SUCCESSFUL and said[ok.id][1].return_value == ok.return_value


@pytest.mark.slow
def test_priority_orders_ready_tasks_and_a_burst_leaves_tasks_due_later_scheduled() -> None:
    now = timezone.now()

    def tagged(tag: str, **using: Any) -> Any:
        return record.using(**using).enqueue(tag)

    tagged("old", priority=20, run_after=now - timedelta(hours=2))
    tagged("very old", priority=20, run_after=now - timedelta(hours=10))
    later = [tagged("far", run_after=now + timedelta(hours=10)),
             tagged("high far", priority=10, run_after=now + timedelta(hours=10)),
             tagged("future", run_after=now + timedelta(hours=2))]
    tagged("high", priority=10)
    tagged("low", priority=2)
    tagged("lower", priority=-2)
    burst(concurrency=1, prefetch=0, timeout=30)  # (it used to wait ten hours for "far")
    assert sorted(RAN[:2]) == ["old", "very old"] and RAN[2:] == ["high", "low", "lower"]
    for result in later:
        result.refresh()
        assert result.status == READY and result.started_at is None and result.attempts == 0


@pytest.mark.slow
def test_a_retried_task_sends_signals_for_each_run_and_a_burst_waits_for_what_is_due_soon(
        settings: Any) -> None:
    """A burst run waits for a retry's backoff and a task due in a second (both within its
    horizon), not for one due in hours (above)."""
    settings.JOBQUEUE = {**settings.JOBQUEUE,
                         "QUEUES": {"default": {"max_attempts": 2, "backoff": 0.2}}}
    result = fails_on_its_first_run.enqueue()
    record.using(run_after=timezone.now() + timedelta(seconds=1)).enqueue("soon")
    with received(task_started) as started, received(task_finished) as finished:
        burst()
    assert [status for _, r, status in started if r.id == result.id] == [RUNNING, RUNNING]
    assert [status for _, r, status in finished if r.id == result.id] == [FAILED, SUCCESSFUL]
    result.refresh()
    assert result.status == SUCCESSFUL and result.return_value == 2 and result.attempts == 2
    assert RAN == ["soon"]


def test_a_queue_the_backend_does_not_list_is_refused_at_enqueue(settings: Any) -> None:
    task = noop.using(queue_name="emails")
    settings.TASKS = {"default": {"BACKEND": "jobqueue.tasks.ValkeyBackend", "QUEUES": ["default"]}}
    with pytest.raises(InvalidTask, match="Queue 'emails' is not valid for backend"):
        task.enqueue()
    with pytest.raises(InvalidTask, match="Queue 'emails' is not valid for backend"):
        asyncio.run(task.aenqueue())
    settings.TASKS = {"default": {"BACKEND": "jobqueue.tasks.ValkeyBackend",
                                  "QUEUES": ["default", "no spaces"]}}
    with pytest.raises(InvalidTask, match="invalid queue name"):
        noop.using(queue_name="no spaces").enqueue()
    assert Queue("default").counts()["pending"] == Queue("emails").counts()["pending"] == 0


def test_each_task_goes_to_its_own_queue() -> None:
    default, other = noop.enqueue(), noop.using(queue_name="emails").enqueue()
    assert Queue("default").get(default.id) is not None and Queue("default").get(other.id) is None
    assert Queue("emails").get(other.id) is not None


@pytest.mark.parametrize("argument", [datetime.now(), object(), {1, 2}, uuid.uuid4()],
                         ids=["datetime", "object", "set", "uuid"])
def test_an_argument_json_cannot_hold_raises_type_error_and_enqueues_nothing(argument: Any) -> None:
    with pytest.raises(TypeError):
        noop.enqueue(argument)
    with pytest.raises(TypeError):
        noop.enqueue(when=[argument])
    with pytest.raises(TypeError):
        asyncio.run(noop.aenqueue(argument))
    assert Queue("default").counts()["pending"] == 0


def test_arguments_are_stored_as_django_normalises_them() -> None:
    result = noop.enqueue((1, 2), b"bytes", nested={"t": (3,)})
    assert result.args == [[1, 2], "bytes"] and result.kwargs == {"nested": {"t": [3]}}
    assert Queue("default").get(result.id).payload["args"] == [[1, 2], "bytes"]  # type: ignore[union-attr]
    assert _backend_().get_result(result.id) == result


@pytest.mark.slow
def test_a_task_that_takes_context_gets_its_own_result_with_its_options() -> None:
    mine = own_id.enqueue()
    seen = sees_its_context.using(queue_name="emails", priority=7).enqueue(1)
    burst("default", "emails")
    assert own_id.get_result(mine.id).return_value == mine.id
    result = sees_its_context.get_result(seen.id)
    assert result.status == SUCCESSFUL, result.errors
    assert result.return_value == RUNNING


@pytest.mark.slow
def test_each_run_sends_task_started_and_task_finished_and_djangos_log_lines(caplog: Any) -> None:
    ok, bad, later = meaning_of_life.enqueue(), fails_with_value_error.enqueue(), anoop.enqueue()
    with (received(task_started) as started, received(task_finished) as finished,
          caplog.at_level(logging.DEBUG, logger=LOGGER)):
        burst()
    assert sorted((r.id, status) for _, r, status in started) == sorted(
        [(ok.id, RUNNING), (bad.id, RUNNING), (later.id, RUNNING)])
    assert {sender for sender, _, _ in started + finished} == {ValkeyBackend}
    ended = {r.id: (status, r) for _, r, status in finished}
    assert len(finished) == 3 and ended[later.id][0] == SUCCESSFUL
    assert ended[ok.id][0] == SUCCESSFUL and ended[ok.id][1].return_value == 42
    assert ended[bad.id][0] == FAILED and ended[bad.id][1].errors[0].exception_class is ValueError
    for result, task, status in ((ok, meaning_of_life, "SUCCESSFUL"),
                                 (bad, fails_with_value_error, "FAILED"),
                                 (later, anoop, "SUCCESSFUL")):
        assert f"Task id={result.id} path={task.module_path} state=RUNNING" in caplog.text
        assert f"Task id={result.id} path={task.module_path} state={status}" in caplog.text
    assert "This task failed due to ValueError" in caplog.text  # (the failure's traceback)


@pytest.mark.slow
def test_a_worker_finds_the_tasks_of_an_apps_tasks_module_that_nothing_imported(
        valkey_server: ValkeyProcess) -> None:
    """A job names its task and the worker imports no module a job names; an installed app's
    `tasks` module is the worker's own to import (once, when a job names a task not seen yet)."""
    ref = Queue("default").enqueue({"handler": "django.tasks:tests.jobapp.tasks.shout",
                                    "args": ["hi"]})
    assert run_burst(valkey_server.url) == 0
    info = get_job(ref.id)
    assert info is not None and info.state == "succeeded" and info.result == "HI", info
