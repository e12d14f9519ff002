"""What a worker loads at start: only what it runs. The console, the metrics endpoint, the Celery
bridge and OpenTelemetry's tracing SDK are imported where they are used, so a worker that never
uses them does not pay for them at every start."""

from __future__ import annotations

import os
import subprocess
import sys

from .workers import ROOT

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

NOT_FOR_A_WORKER = ("jobqueue.views", "jobqueue.urls", "jobqueue.readmodels", "jobqueue.console_actions",
                    "jobqueue.metrics", "prometheus_client", "jobqueue.contrib.celery", "celery",
                    "opentelemetry.sdk.trace")


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
