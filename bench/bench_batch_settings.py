"""Settings for bench/batches.py: the bench's, plus the batch handlers' app."""

from bench_settings import *  # noqa: F403
from bench_settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "batchapp"]
