"""The plumbing every console page and action shares, and links within the console's mount.

Every page and every action needs staff and Django's view permission on jobs (`viewed`: what
the console shows, payloads and errors, is what the job changelist shows). `ConsoleSite` renders
in the admin's chrome, finds the queue or job a URL names and sends an operator back where a
form asked; pages.py's `Console` adds the pages, and each action (posts.py) holds one.
`console_reverse` links within the mount that served them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from django.contrib.admin import AdminSite
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBase, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme

from .. import ids
from ..engine.store import JobInfo, Queue
from ..exceptions import JobQueueError
from ..keys import validate_queue
from ..models import Job
from ..states import State
from . import access

VIEW, CHANGE = "jobqueue.view_job", "jobqueue.change_job"
"""Django's own permissions on jobs; either lets a staff user see the console."""


def console_reverse(request: HttpRequest, name: str, *args: Any) -> str:
    """`reverse(name)` in the URL namespace of the console page being served: `admin:` when the
    admin mounted it, none (or the project's own) when `console_urls` did."""
    match = getattr(request, "resolver_match", None)
    namespace = match.namespace if match is not None else ""
    return reverse(f"{namespace}:{name}" if namespace else name, args=args)


class ConsoleSite:
    """The console's shared plumbing, bound to one admin site so that its pages and actions
    share that site's login and chrome."""

    def __init__(self, admin_site: AdminSite) -> None:
        self.admin_site = admin_site

    def render(self, request: HttpRequest, template: str, title: str, status: int = 200,
               **context: Any) -> HttpResponse:
        """`admin/jobqueue/<template>` in the admin's chrome, titled `title`."""
        return render(request, f"admin/jobqueue/{template}", {
            **self.admin_site.each_context(request), "title": title, "State": State, **context,
        }, status=status)

    # -- who may see the console (what each action needs is beside it, in posts.py) -----------

    def has_view_permission(self, request: HttpRequest) -> bool:
        """Any page or action of the console: view (or change) permission on jobs, as the job
        changelist asks (`ModelAdmin.has_view_permission`)."""
        return request.user.has_perm(VIEW) or request.user.has_perm(CHANGE)

    def viewed(self, view: Callable[..., HttpResponseBase]) -> Callable[..., HttpResponseBase]:
        """`view`, refused (403) to a user without `has_view_permission`."""
        @functools.wraps(view)
        def guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            if not self.has_view_permission(request):
                raise PermissionDenied("the console needs the jobqueue.view_job permission")
            return view(request, *args, **kwargs)

        return guarded

    # -- which queues a user may see or act on -----------------------------------------------

    def visible_queues(self, request: HttpRequest, acting: bool = False) -> frozenset[str] | None:
        """The queues this user may see (`acting`: act on) in a search and its bulk actions:
        None for every queue (`access.reach`)."""
        return access.reach(request, acting)

    def covers(self, request: HttpRequest, scope: list[str] | None, acting: bool = False) -> bool:
        """Whether this user may see (act on) every queue of a recorded scope (None: all)."""
        mine = self.visible_queues(request, acting)
        return mine is None or (scope is not None and set(scope) <= mine)

    # -- what a URL names --------------------------------------------------------------------

    def queue(self, name: str) -> Queue:
        """The queue `name`; a name no queue may have is refused (403)."""
        try:
            return Queue(validate_queue(name))
        except JobQueueError as exc:
            raise PermissionDenied(str(exc)) from None

    def job(self, queue: str, job_id: str) -> JobInfo:
        """Job `job_id` of `queue`, live or (else) from its history row; 404 when neither."""
        try:
            ids.validate_job_id(job_id)
            info = self.queue(queue).get(job_id)
        except JobQueueError as exc:
            raise Http404(str(exc)) from None
        if info is None:  # (its history row, of this queue: an action logs the URL's queue)
            row = Job.objects.filter(pk=job_id, queue=queue).first()
            if row is None:
                raise Http404(f"No job {job_id} in queue {queue!r}, live or mirrored.")
            info = row.info()
        return info

    def back(self, request: HttpRequest, default: str) -> HttpResponse:
        """A redirect to the form's `next` when it is on this site, else to `default`."""
        target = request.POST.get("next", "")
        if not url_has_allowed_host_and_scheme(target, {request.get_host()}, request.is_secure()):
            target = default
        return HttpResponseRedirect(target or default)
