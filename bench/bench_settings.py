"""Settings for the bench: the project's, plus the bench's own jobs app."""

import os

from project.settings import *  # noqa: F403
from project.settings import INSTALLED_APPS, JOBQUEUE

INSTALLED_APPS = [*INSTALLED_APPS, "benchapp"]
JOBQUEUE = {**JOBQUEUE, "SCHEDULE": {}}
"""No periodic job: the project's settings keep the demo's scoreboard every few seconds, which a
bench of jobs/s (and a checkout from before it, run with `--baseline`) would not have."""
LOGGING = {"version": 1, "disable_existing_loggers": False}

if "JOBQUEUE_RETENTION" in os.environ:  # bench/soak.py: how long finished rows stay in Valkey
    JOBQUEUE["RETENTION"] = float(os.environ["JOBQUEUE_RETENTION"])
