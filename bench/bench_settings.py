"""Settings for the bench: the project's, plus the bench's own jobs app."""

from project.settings import *  # noqa: F403
from project.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "benchapp"]
LOGGING = {"version": 1, "disable_existing_loggers": False}
