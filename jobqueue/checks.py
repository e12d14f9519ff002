"""System checks: `manage.py check` tells an operator what is wrong with JOBQUEUE."""

from __future__ import annotations

from typing import Any

from django.core import checks


def check_settings(**_: Any) -> list[checks.CheckMessage]:
    from django.conf import settings

    from . import conf
    from .exceptions import JobQueueError

    try:
        conf.parse(getattr(settings, "JOBQUEUE", {}))
    except JobQueueError as exc:
        return [checks.Error(
            f"JOBQUEUE is invalid: {exc}",
            hint="See the README's 'Settings': QUEUES maps queue names to shards, max_attempts, "
                 "lease, concurrency, backoff, priority; URL is a redis:// or valkey:// URL.",
            id="jobqueue.E001",
        )]
    return []


def register() -> None:
    checks.register(check_settings, "jobqueue")
