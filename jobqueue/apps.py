from __future__ import annotations

from django.apps import AppConfig


class JobQueueConfig(AppConfig):
    name = "jobqueue"
    verbose_name = "Job queue"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.core.signals import setting_changed

        from . import conf
        from .operations import checks, stored_schedules  # noqa: F401 (its signals tell the workers)

        checks.register()

        def reset_on_change(setting: str, **_: object) -> None:
            if setting == "JOBQUEUE":
                conf.reset()

        setting_changed.connect(reset_on_change, weak=False)
