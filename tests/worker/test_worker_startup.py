"""What a worker does at start: it loads only what it runs (the console, the metrics endpoint,
the Celery bridge and OpenTelemetry's tracing SDK are imported where they are used, so a worker
that never uses them does not pay for them at every start), and it starts without the cyclic
collector, which it turns back on before it runs a job."""

from __future__ import annotations

import gc
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from jobqueue import collector
from jobqueue.models import Job
from tests.jobapp import jobs
from tests.servers import ValkeyProcess
from tests.workers import ROOT, run_burst

STARTS_LIKE_A_WORKER = """
import sys
import django

django.setup()
from django.core.management import load_command_class
from django.utils.module_loading import autodiscover_modules

load_command_class("jobqueue", "runworker")
autodiscover_modules("jobs")
from jobqueue import tracing
from jobqueue.worker import mirror_thread, runners

tracing.worker_tracer()
print(" ".join(sorted(sys.modules)))
"""

NOT_FOR_A_WORKER = ("jobqueue.console", "jobqueue.console.pages", "jobqueue.console.readmodels",
                    "jobqueue.console.site", "jobqueue.console.actions", "jobqueue.console.posts",
                    "jobqueue.urls", "jobqueue.metrics", "jobqueue.operations.metrics", "prometheus_client",
                    "jobqueue.contrib.celery", "celery", "opentelemetry.sdk.trace")
"""Modules a worker never loads. The admin loads with Django (its autodiscovery), so it imports
the console's actions only in the methods that use them."""


def test_a_worker_imports_neither_the_console_nor_metrics_nor_celery_nor_the_tracing_sdk() -> None:
    # The bundled project's settings: the test settings' app imports Celery for its own tests.
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "project.settings",
           "VALKEY_URL": "redis://127.0.0.1:1/0", "DATABASE_URL": "sqlite:///:memory:"}
    done = subprocess.run([sys.executable, "-c", STARTS_LIKE_A_WORKER], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    loaded = set(done.stdout.split())
    assert "jobqueue.worker.core" in loaded
    assert sorted(loaded.intersection(NOT_FOR_A_WORKER)) == []


# -- the cyclic collector during a worker's start (jobqueue/collector.py) ---------------------

PROCESS_STATE = "import gc; from jobqueue import collector; print(gc.isenabled(), collector.paused_at_start)"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_runworker_starts_without_the_collector_and_runs_its_jobs_with_it(
        valkey_server: ValkeyProcess, workers: str) -> None:
    refs = jobs.interpreter_state.enqueue_many([() for _ in range(8)])
    assert run_burst(valkey_server.url, "--workers", workers, "--concurrency", "1") == 0
    states = [Job.objects.get(pk=ref.id).result for ref in refs]
    assert all(state["paused_at_start"] for state in states)  # the fast branch was taken
    assert all(state["collecting"] and state["threshold"][0] == 10_000 and state["frozen"] > 10_000
               for state in states)


@pytest.mark.django_db(transaction=True)
def test_a_workers_process_pool_is_left_with_the_collector_as_python_starts_it(
        valkey_server: ValkeyProcess) -> None:
    # (multiprocessing gives a pool process its parent's argv: `manage.py runworker …`)
    ref = jobs.interpreter_state.enqueue()
    assert run_burst(valkey_server.url, "--processes", "--concurrency", "1") == 0
    state = Job.objects.get(pk=ref.id).result
    assert state["collecting"] and not state["paused_at_start"]


SPAWNS_FROM_A_WORKER = """
import multiprocessing
import sys


def child():
    import django

    django.setup()  # (before jobqueue is first imported here)
    import gc
    from jobqueue import collector

    return gc.isenabled(), collector.paused_at_start


if __name__ == "__main__":
    sys.argv = ["manage.py", "runworker"]
    import django.core.management

    with multiprocessing.get_context("spawn").Pool(1) as pool:
        print(*pool.apply(child))
"""
SPAWNS_WITH_JOBQUEUE_TO_UNPICKLE = """
import multiprocessing
import sys

import django.core.management  # (at the top: a spawned process imports it again, as __mp_main__)


def child():
    import gc
    from jobqueue import collector

    return gc.isenabled(), collector.paused_at_start


if __name__ == "__main__":
    sys.argv = ["manage.py", "runworker"]
    from jobqueue.keys import queue_list

    # A pool's initializer from jobqueue (as the worker's --processes pool has): the process
    # imports jobqueue to unpickle it, before multiprocessing has set its parent_process().
    with multiprocessing.get_context("spawn").Pool(1, queue_list, ("default",)) as pool:
        print(*pool.apply(child))
"""
PROJECT = {"DJANGO_SETTINGS_MODULE": "project.settings", "VALKEY_URL": "redis://127.0.0.1:1/0",
           "DATABASE_URL": "sqlite:///:memory:"}


@pytest.mark.parametrize("source", [SPAWNS_FROM_A_WORKER, SPAWNS_WITH_JOBQUEUE_TO_UNPICKLE])
def test_a_process_a_worker_spawns_is_left_with_the_collector_on(tmp_path: Path,
                                                                 source: str) -> None:
    # multiprocessing hands its parent's argv (`manage.py runworker`) to a process it spawns.
    script = tmp_path / "spawns.py"
    script.write_text(source)
    done = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, **PROJECT, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "False"]


def test_any_other_command_leaves_the_collector_alone() -> None:
    env = {**os.environ, **PROJECT}
    done = subprocess.run([sys.executable, "manage.py", "shell", "-v", "0", "-c", PROCESS_STATE],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "False"]
    assert gc.isenabled() and not collector.paused_at_start  # (nor the tests' process)


def test_a_runworker_that_fails_at_start_turns_the_collector_back_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["manage.py", "runworker", "--queues", "no such queue!"])
    monkeypatch.setattr(collector, "paused_at_start", False)
    level = logging.getLogger("jobqueue").level  # (the command sets the one it is given)
    collector.pause_for_runworker()
    try:
        assert not gc.isenabled() and collector.paused_at_start
        with pytest.raises(CommandError, match="invalid queue name"):
            call_command("runworker", "--queues", "no such queue!")
        assert gc.isenabled()
    finally:
        collector.resume()
        logging.getLogger("jobqueue").setLevel(level)
