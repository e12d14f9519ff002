"""OpenTelemetry: a producer span per enqueue, a consumer span per attempt in a real worker, the
trace carried in the job between them, links for a bulk enqueue; nothing when tracing is off."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from jobqueue import Queue, conf, enqueue, get_job, tracing
from jobqueue.exceptions import ConfigurationError
from tests import otel
from tests.jobapp import celery_tasks, django_tasks, jobs
from tests.servers import ValkeyProcess
from tests.workers import manage, run_burst, start_worker, stop_twice, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def traced(settings: Any) -> InMemorySpanExporter:
    """This process traces into memory (`tests.otel.provider`), not through a global provider."""
    settings.JOBQUEUE = {**settings.JOBQUEUE, "TRACING": "tests.otel.provider"}
    otel.memory.clear()
    return otel.memory


def worker_spans(valkey_server: ValkeyProcess, tmp_path: Path) -> list[dict[str, Any]]:
    """Run a burst worker that writes its spans to a file; the consumer spans it wrote."""
    path = tmp_path / "spans.jsonl"
    assert run_burst(valkey_server.url, env={"JOBQUEUE_TEST_SPANS": str(path)}) == 0
    return [span for span in otel.read(path) if span["name"].startswith("process ")]


def test_each_attempt_is_a_consumer_span_in_the_producers_trace(
        traced: InMemorySpanExporter, valkey_server: ValkeyProcess, tmp_path: Path) -> None:
    with otel.provider.get_tracer("tests").start_as_current_span("request"):
        ref = jobs.fails_once.using(lane="tenant-7").enqueue()
    request, producer = sorted(traced.get_finished_spans(), key=lambda s: s.name != "request")
    assert producer.name == "publish default" and producer.kind == SpanKind.PRODUCER
    assert producer.parent is not None and producer.parent.span_id == request.context.span_id
    assert dict(producer.attributes or {}) == {
        "messaging.system": "jobqueue", "messaging.destination.name": "default",
        "messaging.operation.type": "send", "messaging.operation.name": "publish",
        "messaging.message.id": ref.id}
    trace_id, span_id = otel.ids(producer)
    carried = Queue("default").get(ref.id).payload["trace"]  # type: ignore[union-attr]
    assert set(carried) == {"traceparent", "lane"} and carried["lane"] == "tenant-7"
    version, trace, parent, flags = carried["traceparent"].split("-")  # W3C: flags bit 0 = sampled
    assert (version, trace, parent) == ("00", trace_id[2:], span_id[2:]) and int(flags, 16) & 1

    first, second = sorted(worker_spans(valkey_server, tmp_path),
                           key=lambda s: s["attributes"]["jobqueue.attempt"])
    for attempt in (first, second):
        assert attempt["name"] == "process default" and attempt["kind"] == "SpanKind.CONSUMER"
        assert attempt["context"]["trace_id"] == trace_id and attempt["parent_id"] == span_id
        assert attempt["attributes"]["messaging.message.id"] == ref.id
        assert attempt["attributes"]["jobqueue.lane"] == "tenant-7"
        assert attempt["attributes"]["jobqueue.handler"] == "tests.jobapp.jobs.fails_once"
    assert first["attributes"]["jobqueue.outcome"] == "retry"
    assert first["status"] == {"status_code": "ERROR",
                               "description": "ConnectionError: the first attempt fails"}
    [event] = first["events"]
    assert event["name"] == "exception" and event["attributes"]["exception.type"] == "ConnectionError"
    assert second["attributes"]["jobqueue.outcome"] == "succeeded" and not second["events"]
    assert second["status"]["status_code"] == "UNSET"
    # The span is current while the handler runs: the handler's own spans are its children.
    assert Queue("default").get(ref.id).result == second["context"]["span_id"]  # type: ignore[union-attr]


def test_a_bulk_enqueue_is_one_producer_span_each_attempt_links_to(
        traced: InMemorySpanExporter, valkey_server: ValkeyProcess, tmp_path: Path) -> None:
    refs = jobs.add.enqueue_many([(1, 2), (3, 4), (5, 6)])
    [producer] = traced.get_finished_spans()
    attributes = dict(producer.attributes or {})
    assert attributes["messaging.batch.message_count"] == 3 and "messaging.message.id" not in attributes
    assert Queue("default").get(refs[0].id).payload["trace"]["link"] is True  # type: ignore[union-attr]
    trace_id, span_id = otel.ids(producer)

    attempts = worker_spans(valkey_server, tmp_path)
    assert sorted(s["attributes"]["messaging.message.id"] for s in attempts) == sorted(r.id for r in refs)
    for attempt in attempts:
        assert attempt["parent_id"] is None and attempt["context"]["trace_id"] != trace_id
        [link] = attempt["links"]
        assert (link["context"]["trace_id"], link["context"]["span_id"]) == (trace_id, span_id)
        assert attempt["attributes"]["jobqueue.outcome"] == "succeeded"
        assert attempt["attributes"]["jobqueue.lane"] == ""


def test_django_tasks_and_celery_tasks_are_traced_through_the_same_enqueue(
        traced: InMemorySpanExporter, settings: Any, valkey_server: ValkeyProcess,
        tmp_path: Path) -> None:
    settings.TASKS = {"default": {"BACKEND": "jobqueue.tasks.ValkeyBackend"}}
    task = django_tasks.add_later.enqueue(2, 3)  # an async task: the worker's event loop runs it
    celery = celery_tasks.shout.delay("hi")
    producers = {span.attributes["messaging.message.id"]: otel.ids(span)  # type: ignore[index]
                 for span in traced.get_finished_spans()}
    assert set(producers) == {task.id, celery.id}

    attempts = {s["attributes"]["messaging.message.id"]: s for s in worker_spans(valkey_server, tmp_path)}
    assert set(attempts) == {task.id, celery.id}
    for job_id, attempt in attempts.items():
        assert (attempt["context"]["trace_id"], attempt["parent_id"]) == producers[job_id]
        assert attempt["attributes"]["jobqueue.outcome"] == "succeeded"
    assert attempts[celery.id]["attributes"]["jobqueue.handler"] == "celery:tests.jobapp.celery_tasks.shout"


def test_a_failure_in_a_process_pool_is_noted_from_its_text(
        traced: InMemorySpanExporter, valkey_server: ValkeyProcess, tmp_path: Path) -> None:
    ref = jobs.always_fails.using(max_attempts=1).enqueue("in the pool")
    path = tmp_path / "spans.jsonl"
    assert run_burst(valkey_server.url, "--processes", env={"JOBQUEUE_TEST_SPANS": str(path)}) == 0
    [attempt] = [s for s in otel.read(path) if s["name"] == "process default"]
    assert attempt["attributes"]["messaging.message.id"] == ref.id
    assert attempt["attributes"]["jobqueue.outcome"] == "dead"
    [event] = attempt["events"]
    assert event["attributes"]["exception.message"] == "ValueError: in the pool"


def test_an_attempt_released_when_its_worker_stops_ends_its_span(
        traced: InMemorySpanExporter, valkey_server: ValkeyProcess, tmp_path: Path) -> None:
    # The worker stops (a second SIGTERM: release now) while the job runs: its attempt's span
    # must end (outcome released) and be exported, not stay open for the process's life.
    ref = jobs.waits_for_file.enqueue(str(tmp_path / "never"))
    path, log = tmp_path / "spans.jsonl", tmp_path / "worker.log"
    worker = start_worker(valkey_server.url, log=log, env={"JOBQUEUE_TEST_SPANS": str(path)})
    try:
        wait_for(lambda: getattr(get_job(ref.id), "progress", None) == "started")
    finally:
        stop_twice(worker, log)
        assert worker.wait(30) == 0
    [attempt] = [s for s in otel.read(path) if s["name"] == "process default"]
    assert attempt["attributes"]["messaging.message.id"] == ref.id
    assert attempt["attributes"]["jobqueue.outcome"] == "released"
    assert attempt["status"]["status_code"] == "UNSET" and attempt["end_time"]
    assert Queue("default").get(ref.id).state == "pending"  # type: ignore[union-attr]


def test_the_console_shows_a_traced_payload(traced: InMemorySpanExporter, client: Client) -> None:
    from django.contrib.auth.models import User

    ref = jobs.add.enqueue(1, 2)
    User.objects.create_superuser("root", "root@example.com", "pw")
    client.login(username="root", password="pw")
    page = client.get(f"/admin/jobqueue/job/live/jobs/default/{ref.id}/").content.decode()
    assert "traceparent" in page and "tests.jobapp.jobs.add" in page


def test_with_tracing_off_or_unconfigured_nothing_is_traced_nor_carried(settings: Any) -> None:
    otel.memory.clear()
    for setting in (False, True):  # True: no tracer provider is configured in this process
        settings.JOBQUEUE = {**settings.JOBQUEUE, "TRACING": setting}
        refs = [jobs.add.enqueue(1, 2), *jobs.add.enqueue_many([(3, 4), (5, 6)]),
                enqueue("tests.jobapp.jobs.add", args=[7, 8])]
        assert tracing.tracer() is None and jobs.add._routed().ready is not None  # the short way
        for ref in refs:
            assert set(Queue("default").get(ref.id).payload) == {"handler", "args"}  # type: ignore[union-attr]
    assert not otel.memory.get_finished_spans()


def test_tracing_is_decided_at_the_first_enqueue_and_needs_no_opentelemetry(
        valkey_server: ValkeyProcess) -> None:
    """In a fresh process: nothing is decided before the first enqueue; without OpenTelemetry
    (the import fails, as when it is not installed) jobs go untraced."""
    code = ("import sys\n"
            "from tests.jobapp import jobs\n"
            "from jobqueue import Queue, tracing\n"
            "print(tracing._decided)\n"
            "sys.modules['opentelemetry'] = None\n"
            "ref = jobs.add.enqueue(1, 2)\n"
            "print(tracing.tracer(), sorted(Queue('default').get(ref.id).payload))\n")
    done = manage("shell", "-c", code, "--no-imports", url=valkey_server.url)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["None", "None ['args', 'handler']"]


def test_a_tracing_setting_that_names_no_provider_is_refused(settings: Any) -> None:
    with pytest.raises(ConfigurationError, match="TRACING"):
        conf.parse({"TRACING": "provider"})
    with pytest.raises(ConfigurationError, match="TRACING"):
        conf.parse({"TRACING": 1})
    settings.JOBQUEUE = {**settings.JOBQUEUE, "TRACING": "tests.otel.nowhere"}
    with pytest.raises(ConfigurationError, match=r"cannot import 'tests\.otel\.nowhere'"):
        jobs.add.enqueue(1, 2)
    settings.JOBQUEUE = {**settings.JOBQUEUE, "TRACING": "tests.otel.memory"}  # an exporter
    with pytest.raises(ConfigurationError, match="is not a tracer provider"):
        jobs.add.enqueue(1, 2)
