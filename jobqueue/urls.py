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
from django.http import HttpResponseBase
from django.urls import path

from .console import posts
from .console.enqueue import EnqueueJob
from .console.pages import Console


def console_urls(site: AdminSite) -> list[Any]:
    """The console's pages and actions on `site`, each behind its login (`admin_view`) and the
    view permission on jobs (`Console.viewed`); each action is its own view in
    `console.posts`, with its own permission, and takes POSTs."""
    views = Console(site)

    def wrap(view: Callable[..., HttpResponseBase]) -> Callable[..., HttpResponseBase]:
        return site.admin_view(views.viewed(view))

    def action(view: type[posts.ConsoleAction[Any]]) -> Callable[..., HttpResponseBase]:
        return wrap(view.as_view(site=views))

    return [
        path("", wrap(views.dashboard), name="jobqueue_dashboard"),
        path("find/", wrap(views.find), name="jobqueue_find"),
        path("search/", wrap(views.search_page), name="jobqueue_search"),
        path("search/bulk/", wrap(posts.BulkAction.as_view(site=views)), name="jobqueue_search_bulk"),
        path("bulk/<int:pk>/", wrap(views.bulk_page), name="jobqueue_bulk"),
        path("bulk/<int:pk>/decide/", wrap(posts.BulkDecision.as_view(site=views)),
             name="jobqueue_bulk_decide"),
        path("stuck/", wrap(views.stuck), name="jobqueue_stuck"),
        path("charts/", wrap(views.charts), name="jobqueue_charts"),
        path("enqueue/", wrap(EnqueueJob.as_view(site=views)), name="jobqueue_enqueue"),
        path("schedules/", wrap(views.schedules), name="jobqueue_schedules"),
        path("workers/", wrap(views.workers), name="jobqueue_workers"),
        path("schedules/<str:name>/run/", action(posts.RunSchedule), name="jobqueue_schedule_run"),
        path("schedules/<str:name>/pause/", action(posts.PauseSchedule),
             name="jobqueue_schedule_pause"),
        path("schedules/<str:name>/resume/", action(posts.ResumeSchedule),
             name="jobqueue_schedule_resume"),
        path("queues/<str:name>/", wrap(views.queue_page), name="jobqueue_queue"),
        path("queues/<str:name>/pause/", action(posts.PauseQueue), name="jobqueue_queue_pause"),
        path("queues/<str:name>/resume/", action(posts.ResumeQueue), name="jobqueue_queue_resume"),
        path("queues/<str:name>/resize/", action(posts.ResizeQueue), name="jobqueue_queue_resize"),
        path("queues/<str:name>/set_lane_concurrency/", action(posts.SetLaneConcurrency),
             name="jobqueue_queue_set_lane_concurrency"),
        path("queues/<str:name>/set_global_concurrency/", action(posts.SetGlobalConcurrency),
             name="jobqueue_queue_set_global_concurrency"),
        path("jobs/<str:queue>/<str:job_id>/", wrap(views.job_page), name="jobqueue_job"),
        path("flows/<str:queue>/<str:flow_id>/", wrap(views.flow_page), name="jobqueue_flow"),
        path("jobs/<str:queue>/<str:job_id>/retry/", action(posts.RetryJob),
             name="jobqueue_job_retry"),
        path("jobs/<str:queue>/<str:job_id>/reprioritize/", action(posts.ReprioritizeJob),
             name="jobqueue_job_reprioritize"),
        path("jobs/<str:queue>/<str:job_id>/cancel/", action(posts.CancelJob),
             name="jobqueue_job_cancel"),
    ]
