"""bench/sealed.py: the bench settings with a sealed queue and a plain one."""

import os

from bench_settings import *  # noqa: F403
from bench_settings import JOBQUEUE

JOBQUEUE = {
    **JOBQUEUE,
    "QUEUES": {"plain": {}, "sealed": {"encrypt": True}},
    "ENCRYPTION_KEYS": [os.environ["JOBQUEUE_BENCH_KEY"]],
}
