"""Hostile payloads: whatever a job's row says (written by a careless enqueue, a raw HSET into
Valkey, a forged row of a durable queue's outbox), that job ends alone, dead with a reason that
names what is wrong, and the jobs around it run; no thread of the worker dies, and no module is
imported because a payload named it (a compromised Valkey runs nothing but registered handlers).

The worker runs in this process (`inprocess.burst`), so that a thread that dies, or a module a payload
made it import, is seen here."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from jobqueue import Queue, enqueue, get_job, ids
from jobqueue.exceptions import InvalidPayload, JobQueueError
from jobqueue.models import Job
from tests.inprocess import burst
from tests.jobapp import celery_tasks, django_tasks, jobs
from tests.servers import ValkeyProcess
from tests.workers import start_worker, wait_for

# A miss in Celery's registry runs Django's system checks (Celery's fixup), on every alias.
pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "other"])

SIDEFX = "tests.jobapp.sidefx"
"""A module whose import leaves a mark and raises ImproperlyConfigured: no payload may import it."""
BAD_HANDLERS: list[Any] = [
    "django.tasks:.x", "django.tasks:..x", "django.tasks:", "django.tasks:x", "django.tasks:.",
    f"django.tasks:{SIDEFX}.whatever", f"django.tasks:{SIDEFX}", "django.tasks:os.system",
    "django.tasks:tests.jobapp.django_tasks.multiply.func", "django.tasks:tests.jobapp.django_tasks",
    "django.tasks:builtins.exec", "django.tasks:\x00", "django.tasks:" + "a." * 5000,
    "celery:", "celery:..x", "celery:nope", "celery:celery.backend_cleanup", "celery:celery.map",
    f"celery:{SIDEFX}.whatever", "", " ", "\x00", "é" * 300, "a" * 100_000, f"{SIDEFX}.whatever",
    "tests.jobapp.jobs.add ", "tests.jobapp.jobs.missing", "builtins.eval",
    # A real function that is no @job (enqueue by dotted path), and the package it once was named
    # by: only the registry resolves a name, never an import.
    "jobqueue.api.registry.enqueue", "jobqueue.api.enqueue",
    "celery", "django.tasks", "celery:tests.jobapp.celery_tasks.shout:", "\ud800",
    123, 1.5, True, None, ["tests.jobapp.jobs.add"], {"name": "tests.jobapp.jobs.add"},
]
"""Handler names no worker can resolve: every kind of string, and what is not a string."""


@pytest.fixture(autouse=True)
def _no_mark() -> Iterator[None]:
    os.environ.pop("JOBQUEUE_TEST_SIDEFX", None)
    yield
    assert "JOBQUEUE_TEST_SIDEFX" not in os.environ, "a payload made the worker import a module"
    assert SIDEFX not in sys.modules


def _good(n: int = 3) -> list[str]:
    """Valid jobs of each kind (an @job, a django.tasks task, a Celery task) to run beside the
    hostile ones; their ids."""
    return ([jobs.add.enqueue(i, 1).id for i in range(n)]
            + [django_tasks.multiply.enqueue(i, 2).id for i in range(n)]
            + [celery_tasks.shout.delay(f"w{i}").id for i in range(n)])


def _assert_good_ran(good: list[str]) -> None:
    for job_id in good:
        info = get_job(job_id)
        assert info is not None and info.state == "succeeded", (job_id, info and info.last_error)


def _assert_dead(job_id: str, what: object, *reasons: str) -> None:
    info = get_job(job_id)
    assert info is not None, what
    assert info.state == "dead" and info.attempts <= 1, (what, info.state, info.last_error[-300:])
    assert any(reason in info.last_error for reason in reasons), (what, info.last_error[-300:])


UNRESOLVED = ("can never run", "payload must be")
"""What the error of a job whose handler cannot be resolved says."""


@pytest.mark.slow
def test_every_bad_handler_ends_its_own_job_dead_and_the_queue_goes_on() -> None:
    good = _good()
    queue = Queue("default")
    bad = {queue.enqueue({"handler": name, "args": [1, 2]}).id: name for name in BAD_HANDLERS}
    by_name = {enqueue(name, args=[1]).id: name for name in BAD_HANDLERS
               if isinstance(name, str) and name}  # (the public API takes any string)
    good += _good()
    burst()
    _assert_good_ran(good)
    for job_id, name in {**bad, **by_name}.items():
        _assert_dead(job_id, name, *UNRESOLVED)


@pytest.mark.slow
def test_a_celery_job_on_a_worker_without_celery_ends_dead(monkeypatch: pytest.MonkeyPatch) -> None:
    good = [jobs.add.enqueue(i, 1).id for i in range(3)]
    celery = celery_tasks.shout.delay("hi").id
    for name in [name for name in sys.modules if name == "celery" or name.startswith("celery.")
                 or name == "jobqueue.contrib.celery"]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "celery", None)  # (Python's way to say "not installed")
    burst()
    _assert_good_ran(good)
    _assert_dead(celery, "celery", "can never run")


@pytest.mark.slow
def test_a_payload_never_makes_the_worker_import_a_module() -> None:
    """A `django.tasks:` or `celery:` name runs only a task the process registered itself (the
    autouse fixture checks that the module was never imported)."""
    queue = Queue("default")
    named = [queue.enqueue({"handler": f"{prefix}{SIDEFX}.task"}).id
             for prefix in ("django.tasks:", "celery:", "")]
    good = _good(1)
    burst()
    _assert_good_ran(good)
    for job_id in named:
        _assert_dead(job_id, job_id, "can never run")


WRONG_SHAPES: list[Any] = [
    None, 1, "tests.jobapp.jobs.add", ["tests.jobapp.jobs.add", 1, 2], True,
    {"args": [1, 2]}, {"handler": "tests.jobapp.jobs.add", "args": "12"},
    {"handler": "tests.jobapp.jobs.add", "args": {"x": 1}},
    {"handler": "tests.jobapp.jobs.add", "args": None},
    {"handler": "tests.jobapp.jobs.add", "kwargs": [1, 2]},
    {"handler": "tests.jobapp.jobs.add", "kwargs": "x=1"},
    {"handler": "tests.jobapp.jobs.add", "kwargs": None},
]
"""Payloads whose fields have the wrong types: the job cannot run."""
FAILING_CALLS: list[Any] = [
    {"handler": "tests.jobapp.jobs.add", "kwargs": {"": 1, "y": 2}},
    {"handler": "tests.jobapp.jobs.add", "args": [1, 2, 3]},
    {"handler": "tests.jobapp.jobs.add", "args": [{"a": 1}, [2]]},
    {"handler": "django.tasks:tests.jobapp.django_tasks.multiply", "args": [1], "kwargs": {"z": 1}},
    {"handler": "tests.jobapp.jobs.add", "args": [1, 2], "trace": 5},
    {"handler": "tests.jobapp.jobs.add", "args": [1], "kwargs": {"y": 2}, "trace": {"link": [1]}},
]
"""Payloads of a known handler with arguments it cannot take (or extra keys of any type): the
call fails, as any handler's failure does, with its traceback."""


@pytest.mark.slow
def test_wrong_types_in_each_field_of_a_payload_end_that_job_alone() -> None:
    queue = Queue("default")
    shapes = {queue.enqueue(payload).id: payload for payload in WRONG_SHAPES}
    calls = {queue.enqueue(payload, max_attempts=1).id: payload for payload in FAILING_CALLS[:4]}
    extra = [queue.enqueue(payload, max_attempts=1).id for payload in FAILING_CALLS[4:]]
    good = _good()
    burst()
    _assert_good_ran(good + extra)  # (keys jobqueue does not read are left alone)
    for job_id, payload in shapes.items():
        _assert_dead(job_id, payload, "payload must be")
    for job_id, payload in calls.items():
        _assert_dead(job_id, payload, "TypeError")


def _raw(queue: Queue, value: str) -> str:
    """A pending job whose stored payload a raw HSET replaced with `value`: its id."""
    ref = jobs.add.using(max_attempts=1).enqueue(1, 2)
    queue.client.hset(queue.shard(queue.locate(ref.id) or 0).job(ref.id), "payload", value)
    return ref.id


RAW_PAYLOADS = {
    "truncated": ('{"handler": "tests.jobapp.jobs.add", "args": [1,', "stored JSON is corrupt"),
    "not JSON": ("rm -rf /", "stored JSON is corrupt"),
    "nested too deep": ("[" * 100_000 + "]" * 100_000, "corrupt field payload"),
    "deep in an object": ('{"handler": "tests.jobapp.jobs.add", "args": ' + "[" * 50_000
                          + "]" * 50_000 + "}", "corrupt field payload"),
    "two documents": ('{"handler": "tests.jobapp.jobs.add"}{"handler": "x"}',
                      "stored JSON is corrupt"),
    "NaN": ('{"handler": "tests.jobapp.jobs.add", "args": [NaN, 1]}', "not JSON-serialisable"),
    "empty": ("", "corrupt field payload"),
    "a bad handler": (json.dumps({"handler": "django.tasks:.x"}), "can never run"),
    "a side effect": (json.dumps({"handler": f"django.tasks:{SIDEFX}.x"}), "can never run"),
    "a celery builtin": (json.dumps({"handler": "celery:celery.accumulate", "args": [1]}),
                         "can never run"),
}
"""Payloads only a raw write into Valkey can store: what each one's error says."""


@pytest.mark.slow
def test_a_raw_hset_of_a_payload_ends_that_job_alone() -> None:
    queue = Queue("default")
    raw = {_raw(queue, value): (what, reason) for what, (value, reason) in RAW_PAYLOADS.items()}
    huge = _raw(queue, json.dumps({"handler": "tests.jobapp.jobs.add", "args": [1, 2],
                                   "pad": "x" * (3 << 20)}))  # past MAX_PAYLOAD: it runs
    good = _good()
    burst()
    _assert_good_ran([*good, huge])
    assert get_job(huge).result == 3  # type: ignore[union-attr]
    for job_id, (what, reason) in raw.items():
        _assert_dead(job_id, what, reason)


def test_an_oversized_or_unencodable_enqueue_is_refused_and_writes_nothing() -> None:
    queue = Queue("default")
    with pytest.raises(InvalidPayload, match="limit"):
        enqueue("tests.jobapp.jobs.add", args=["x" * (2 << 20)])
    with pytest.raises(InvalidPayload, match="limit"):
        queue.enqueue({"handler": "tests.jobapp.jobs.add", "pad": "x" * (2 << 20)})
    with pytest.raises(InvalidPayload):
        jobs.add.enqueue(object(), 1)
    with pytest.raises(JobQueueError):
        enqueue(123, args=[1])  # type: ignore[arg-type]
    assert sum(queue.counts().values()) == 0


def _forged(queue: str, payload: Any, **columns: Any) -> str:
    """A durable job's outbox row as a writer with database access could forge it (no push to
    Valkey: a worker's resend sends it); its id."""
    from datetime import UTC, datetime, timedelta

    job_id = ids.new_id()
    row = {"max_attempts": 1, **columns}
    Job.objects.create(id=job_id, queue=queue, state="pending", payload=payload, durable=True,
                       relayed=False, enqueued_at=datetime.now(UTC) - timedelta(minutes=1), **row)
    return job_id


BAD_COLUMNS: list[dict[str, Any]] = [
    {"priority": 500}, {"priority": -32768}, {"lease_ms": 10**9}, {"backoff_ms": 10**9},
    {"max_attempts": 10**6}, {"lane": "no spaces allowed"},
]
"""Columns of a durable row out of what an enqueue accepts (the database's types allow them)."""


@pytest.mark.slow
def test_forged_rows_of_the_durable_outbox_end_alone_and_the_queue_goes_on(settings: Any) -> None:
    settings.JOBQUEUE = {**settings.JOBQUEUE, "QUEUES": {"default": {}, "durable": {"durable": True}}}
    storable = [name for name in BAD_HANDLERS  # (a database's JSON column refuses a NUL or a
                if not (isinstance(name, str) and ("\x00" in name or "\ud800" in name))]  # surrogate)
    forged = {_forged("durable", {"handler": name, "args": [1]}): name for name in storable}
    shapes = {_forged("durable", payload): payload for payload in WRONG_SHAPES}
    add = {"handler": "tests.jobapp.jobs.add", "args": [1, 2]}
    columns = {_forged("durable", add, **bad): bad for bad in BAD_COLUMNS}
    columns[_forged("durable", {**add, "pad": "x" * (2 << 20)})] = "a payload past MAX_PAYLOAD"
    fine = [_forged("durable", {"handler": "tests.jobapp.jobs.add", "args": [i, 1]}) for i in range(3)]
    good = [jobs.add.using(queue="durable").enqueue(i, 2).id for i in range(3)]
    burst("durable")
    for job_id in fine + good:
        info = get_job(job_id, "durable")
        assert info is not None and info.state == "succeeded", (job_id, info)
    for job_id, name in forged.items():
        info = get_job(job_id, "durable")
        assert info is not None and info.state == "dead", (name, info)
        assert any(reason in info.last_error for reason in UNRESOLVED), (name, info.last_error)
    for job_id, payload in shapes.items():
        info = get_job(job_id, "durable")
        assert info is not None and info.state == "dead", (payload, info)
    for job_id, bad in columns.items():  # (never sent: Valkey would not take them)
        info = get_job(job_id, "durable")
        assert info is not None and info.state == "dead", (bad, info)
        assert "cannot be sent to Valkey" in info.last_error, (bad, info.last_error)


@pytest.mark.slow
def test_a_worker_thread_that_dies_stops_the_worker_and_says_so(valkey_server: ValkeyProcess,
                                                                 tmp_path: Any) -> None:
    """A garbage hand-off (what only a compromised Valkey writes) kills the waiter that reads
    it: the worker must not go on as a zombie that shows healthy, but stop and say why."""
    log = tmp_path / "worker.log"
    worker = start_worker(valkey_server.url, "--concurrency", "1", "--name", "w-zombie", log=log)
    try:
        queue = Queue("default")
        wait_for(lambda: queue.client.hget(queue.shard(0).key("idle"), "w-zombie") is not None)
        queue.client.rpush(queue.shard(0).hand("w-zombie"), "not|a-number|{}")
        assert worker.wait(30) != 0
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    text = log.read_text()
    assert "jobqueue-wake-default#0" in text and "stopping" in text, text[-2000:]
