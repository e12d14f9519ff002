"""System checks: `manage.py check` tells an operator what is wrong with JOBQUEUE."""

from __future__ import annotations

from typing import Any

from django.core import checks


def check_settings(**_: Any) -> list[checks.CheckMessage]:
    from django.conf import settings

    from . import conf
    from .exceptions import JobQueueError

    try:
        config = conf.parse(getattr(settings, "JOBQUEUE", {}))
    except JobQueueError as exc:
        if str(exc).startswith("JOBQUEUE['SCHEDULE']"):
            return [checks.Error(f"JOBQUEUE['SCHEDULE'] is invalid: {exc}", hint=SCHEDULE_HINT,
                                 id="jobqueue.E002")]
        return [checks.Error(
            f"JOBQUEUE is invalid: {exc}",
            hint="See the README's 'Settings': QUEUES maps queue names to shards, max_attempts, "
                 "lease, concurrency, backoff, priority; URL is a redis:// or valkey:// URL.",
            id="jobqueue.E001",
        )]
    return [checks.Error(f"JOBQUEUE['SCHEDULE'][{name!r}]: no @job handler is registered as "
                         f"{entry.job!r}", hint=SCHEDULE_HINT, id="jobqueue.E003")
            for name, entry in config.schedule.items() if not _is_job(entry.job)]


SCHEDULE_HINT = ("See the README's 'Periodic jobs': each entry has 'job' (the dotted path of an "
                 "@job in an app's jobs.py) and 'cron' (five fields) or 'every' (seconds).")


def _is_job(path: str) -> bool:
    """Whether `path` names an @job handler, as the worker will look it up."""
    from django.utils.module_loading import autodiscover_modules

    from .api import _registry

    autodiscover_modules("jobs")
    return path in _registry


def register() -> None:
    checks.register(check_settings, "jobqueue")
