"""A minimal Django project for django-vtasks in bench/peers.py: its own `runworker` would
clash with jobqueue's, so it runs without jobqueue installed."""

import os

SECRET_KEY = "bench"
USE_TZ = True
INSTALLED_APPS = ["django_vtasks", "vtasks_app"]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
TASKS = {"default": {"BACKEND": "django_vtasks.backends.valkey.ValkeyTaskBackend",
                     "OPTIONS": {"BROKER_URL": os.environ.get("BENCH_URL", "")}}}
VTASKS_QUEUES = ["default"]
VTASKS_CONCURRENCY = 200
VTASKS_MAX_RESCUES = 3  # rescues on: a dead worker's tasks are run again
VTASKS_RUN_SCHEDULER = False
