"""Where the operator console is mounted.

With `jobqueue` in `INSTALLED_APPS` and `admin.site.urls` in the project's URLconf, nothing more
is needed: `JobAdmin.get_urls()` mounts the console at `admin/jobqueue/job/live/`. A project that
wants it elsewhere (or on another admin site) can still include it itself:

    urlpatterns = [
        path("ops/jobs/", include(console_urls(admin.site))),
        path("admin/", admin.site.urls),
    ]

Pages link within the mount that served them (`console.site.console_reverse`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib.admin import AdminSite
from django.http import HttpResponse
from django.urls import path
from django.views.decorators.http import require_POST

from .console.pages import Console


def console_urls(site: AdminSite) -> list[Any]:
    """The console's pages on `site`, each behind its login (`admin_view`) and the view
    permission on jobs (`Console.viewed`); actions take POSTs."""
    views = Console(site)

    def wrap(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        return site.admin_view(views.viewed(view))

    return [
        path("", wrap(views.dashboard), name="jobqueue_dashboard"),
        path("find/", wrap(views.find), name="jobqueue_find"),
        path("stuck/", wrap(views.stuck), name="jobqueue_stuck"),
        path("schedules/", wrap(views.schedules), name="jobqueue_schedules"),
        path("workers/", wrap(views.workers), name="jobqueue_workers"),
        path("schedules/<str:name>/<str:action>/", wrap(require_POST(views.schedule_action)),
             name="jobqueue_schedule_action"),
        path("queues/<str:name>/", wrap(views.queue_page), name="jobqueue_queue"),
        path("queues/<str:name>/<str:action>/", wrap(require_POST(views.queue_action)),
             name="jobqueue_queue_action"),
        path("jobs/<str:queue>/<str:job_id>/", wrap(views.job_page), name="jobqueue_job"),
        path("flows/<str:queue>/<str:flow_id>/", wrap(views.flow_page), name="jobqueue_flow"),
        path("jobs/<str:queue>/<str:job_id>/<str:action>/", wrap(require_POST(views.job_action)),
             name="jobqueue_job_action"),
    ]
