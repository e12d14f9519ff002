"""The console's POST handlers, and the plumbing every console page shares.

Every page and every action needs staff and Django's view permission on jobs (`viewed`: what
the console shows, payloads and errors, is what the job changelist shows). Every action is a POST
with CSRF, needs the permission its `has_<action>_permission` asks for too (as a `ModelAdmin`
does), goes through `actions` (one call into `Queue` or the schedule), reports with the messages
framework and records an admin LogEntry. `ConsoleActions` also renders in the admin's chrome and
finds the queue or job a URL names; pages.py's `Console` adds the pages. `console_reverse` links
within the mount that served them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from django.contrib import messages
from django.contrib.admin import AdminSite
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme

from .. import ids
from ..conf import get_config
from ..engine import layouts
from ..engine.store import JobInfo, Queue
from ..exceptions import InvalidName, JobQueueError
from ..keys import validate_queue
from ..models import Job, Shard
from ..states import State
from . import actions, readmodels

VIEW, CHANGE = "jobqueue.view_job", "jobqueue.change_job"
"""Django's own permissions on jobs; either lets a staff user see the console."""


def console_reverse(request: HttpRequest, name: str, *args: Any) -> str:
    """`reverse(name)` in the URL namespace of the console page being served: `admin:` when the
    admin mounted it, none (or the project's own) when `console_urls` did."""
    match = getattr(request, "resolver_match", None)
    namespace = match.namespace if match is not None else ""
    return reverse(f"{namespace}:{name}" if namespace else name, args=args)


class ConsoleActions:
    """The console's POST handlers and shared plumbing, bound to one admin site so they share
    its login and chrome."""

    def __init__(self, site: AdminSite) -> None:
        self.site = site

    def _render(self, request: HttpRequest, template: str, title: str, status: int = 200,
                **context: Any) -> HttpResponse:
        return render(request, f"admin/jobqueue/{template}", {
            **self.site.each_context(request), "title": title, "State": State, **context,
        }, status=status)

    # -- permissions (as ModelAdmin's has_<action>_permission) --------------------------------

    def has_view_permission(self, request: HttpRequest) -> bool:
        """Any page or action of the console: view (or change) permission on jobs, as the job
        changelist asks (`ModelAdmin.has_view_permission`)."""
        return request.user.has_perm(VIEW) or request.user.has_perm(CHANGE)

    def viewed(self, view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        """`view`, refused (403) to a user without `has_view_permission`."""
        @functools.wraps(view)
        def guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if not self.has_view_permission(request):
                raise PermissionDenied("the console needs the jobqueue.view_job permission")
            return view(request, *args, **kwargs)

        return guarded

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(actions.PERMISSIONS["retry"])

    def has_reprioritize_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(actions.PERMISSIONS["reprioritize"])

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(actions.PERMISSIONS["cancel"])

    def has_pause_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(actions.PERMISSIONS["pause"])

    def has_resize_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(actions.PERMISSIONS["resize"])

    def has_run_schedule_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(actions.PERMISSIONS["run_schedule"])

    def has_set_lane_concurrency_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(actions.PERMISSIONS["set_lane_concurrency"])

    def _permitted(self, request: HttpRequest, action: str) -> bool:
        check: Callable[[HttpRequest], bool] = getattr(self, f"has_{action}_permission")
        return check(request)

    def schedule_action(self, request: HttpRequest, name: str, action: str) -> HttpResponse:
        if action not in ("run", "pause", "resume"):
            raise PermissionDenied(f"unknown action {action!r}")
        if not self.has_run_schedule_permission(request):
            raise PermissionDenied
        entry = get_config().schedule.get(name)
        if entry is None:
            raise Http404(f"No periodic job {name!r} in JOBQUEUE['SCHEDULE'].")
        if action == "run" and request.POST.get("confirm") != "yes":
            return self._render(request, "confirm_schedule.html", f"Run {name} now?", entry=entry)
        if action == "run":
            message = actions.run_schedule(entry)
        else:
            message = actions.pause_schedule(name, action == "pause")
        actions.log_action(request.user, name, message)
        messages.success(request, message)
        return self._back(request, console_reverse(request, "jobqueue_schedules"))

    # -- actions -----------------------------------------------------------------------------

    def job_action(self, request: HttpRequest, queue: str, job_id: str, action: str) -> HttpResponse:
        if action not in actions.JOB_STATES:
            raise PermissionDenied(f"unknown action {action!r}")
        if not self._permitted(request, action):
            raise PermissionDenied
        info = self._job(queue, job_id)
        if action == "cancel" and request.POST.get("confirm") != "yes":
            return self._render(request, "confirm.html", f"Cancel job {job_id}?", job=info,
                                action=action)
        try:
            message = self._do(action, info, request)
        except JobQueueError as exc:
            messages.error(request, f"{action} {job_id}: {exc}")
        else:
            messages.success(request, message)
            actions.log_action(request.user, Job(id=job_id, queue=queue, state=info.state), message)
        return self._back(request, console_reverse(request, "jobqueue_job", queue, job_id))

    def _do(self, action: str, info: JobInfo, request: HttpRequest) -> str:
        queue = Queue(info.queue)
        if action == "retry":
            return actions.retry_message(info.id, actions.retry_job(queue, info.id))
        if action == "reprioritize":
            return actions.reprioritize_job(queue, info.id, request.POST.get("priority", ""))
        return actions.cancel_job(queue, info.id)

    def queue_action(self, request: HttpRequest, name: str, action: str) -> HttpResponse:
        if action == "resize":
            return self._resize(request, name)
        if action == "set_lane_concurrency":
            return self._set_lane_concurrency(request, name)
        if action not in ("pause", "resume"):
            raise PermissionDenied(f"unknown action {action!r}")
        if not self.has_pause_permission(request):
            raise PermissionDenied
        self._logged(request, name, actions.pause_queue(self._queue(name), action == "pause"))
        return self._back(request, console_reverse(request, "jobqueue_dashboard"))

    def _resize(self, request: HttpRequest, name: str) -> HttpResponse:
        """Confirm (saying what growing or shrinking does), then resize and log it."""
        if not self.has_resize_permission(request):
            raise PermissionDenied
        queue = self._queue(name)
        back = console_reverse(request, "jobqueue_queue", name)
        raw = request.POST.get("count", "").strip()
        try:
            count = layouts.validate_count(actions.typed_number(raw))
            before = layouts.before_resize(queue.client, name, queue.configured, count)
            layouts.plan(before, count)
        except JobQueueError as exc:
            messages.error(request, f"Resize {name}: {exc}")
            return HttpResponseRedirect(back)
        if request.POST.get("confirm") != "yes":
            return self._render(request, "confirm_resize.html", f"Resize queue {name}?",
                                queue=queue, before=before, count=count)
        try:
            before, _ = actions.resize_queue(queue, count, by=f"console: {request.user}")
        except JobQueueError as exc:
            messages.error(request, f"Resize {name}: {exc}")
            return HttpResponseRedirect(back)
        self._logged(request, name, f"Queue {name} resized from {before.live} to {count} shard(s).")
        return HttpResponseRedirect(back)

    def _set_lane_concurrency(self, request: HttpRequest, name: str) -> HttpResponse:
        """Set (or, with a blank cap, drop) a lane's cap live, and log it."""
        if not self.has_set_lane_concurrency_permission(request):
            raise PermissionDenied
        queue = self._queue(name)
        back = console_reverse(request, "jobqueue_queue", name)
        lane = request.POST.get("lane", "").strip()
        try:
            if not lane:
                raise InvalidName(f"name a lane, {readmodels.DEFAULT_LANE} or * (every named lane)")
            lane = "" if lane == readmodels.DEFAULT_LANE else lane
            message = actions.set_lane_concurrency(queue, lane, request.POST.get("cap", ""))
        except JobQueueError as exc:
            messages.error(request, f"Lane cap on {name}: {exc}")
        else:
            self._logged(request, name, message)
        return HttpResponseRedirect(back)

    @staticmethod
    def _logged(request: HttpRequest, name: str, message: str) -> None:
        """A queue action done: logged on the queue's shard 0 row, and told to the operator."""
        shard, _ = Shard.objects.get_or_create(queue=name, index=0)
        actions.log_action(request.user, shard, message)
        messages.success(request, message)

    # -- helpers -----------------------------------------------------------------------------

    def _queue(self, name: str) -> Queue:
        try:
            return Queue(validate_queue(name))
        except JobQueueError as exc:
            raise PermissionDenied(str(exc)) from None

    def _job(self, queue: str, job_id: str) -> JobInfo:
        try:
            ids.validate_job_id(job_id)
            info = self._queue(queue).get(job_id)
        except JobQueueError as exc:
            raise Http404(str(exc)) from None
        if info is None:  # (its history row, of this queue: an action logs the URL's queue)
            row = Job.objects.filter(pk=job_id, queue=queue).first()
            if row is None:
                raise Http404(f"No job {job_id} in queue {queue!r}, live or mirrored.")
            info = row.info()
        return info

    def _back(self, request: HttpRequest, default: str) -> HttpResponse:
        target = request.POST.get("next", "")
        if not url_has_allowed_host_and_scheme(target, {request.get_host()}, request.is_secure()):
            target = default
        return HttpResponseRedirect(target or default)
