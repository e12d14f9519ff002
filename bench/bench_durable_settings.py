"""bench/durable.py: the bench settings with a durable queue and a plain one."""

from bench_settings import *  # noqa: F403
from bench_settings import JOBQUEUE

JOBQUEUE = {**JOBQUEUE, "QUEUES": {"durable": {"durable": True}, "plain": {}}}
