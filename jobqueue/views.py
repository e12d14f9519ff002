"""The operator console: pages inside the Django admin (same login, look and permissions).

Reads come from `console` (live Valkey) and the `Job` mirror; every action is a POST with CSRF,
needs staff plus a specific permission, goes through `Queue`, reports with the messages framework
and records an admin LogEntry.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from django.contrib import messages
from django.contrib.admin import AdminSite
from django.contrib.admin.models import CHANGE, LogEntry
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.safestring import SafeString
from django.views.decorators.http import require_POST

from . import console, ids, layouts, schedule
from .conf import get_client, get_config
from .exceptions import InvalidJobId, JobQueueError
from .keys import validate_lane, validate_queue
from .models import Job, Shard
from .states import State
from .store import JobInfo, Queue, known_queues
from .urls import console_reverse
from .worker import presence

ACTIONS = {"retry": "retry_job", "reprioritize": "reprioritize_job", "cancel": "cancel_job"}
WAITING_OR_RUNNING = {State.PENDING, State.SCHEDULED, State.ACTIVE}
ALLOWED = {"retry": {State.DEAD, State.CANCELLED}, "reprioritize": WAITING_OR_RUNNING,
           "cancel": WAITING_OR_RUNNING}


def bar_chart(values: list[int], title: str, colour: str) -> SafeString:
    """A small inline SVG bar chart, one bar per minute, oldest first, with its scale (the top
    value on the left axis) and time axis (minutes ago, now); each bar's value is its tooltip.
    Numbers only, so nothing to escape; no script or CDN: it works offline."""
    height, width, left, bottom = 32, 4, 28, 11
    top = max(values, default=0) or 1
    bars = format_html_join(
        "", '<rect x="{}" y="{}" width="3" height="{}"><title>{}</title></rect>',
        ((left + i * width, f"{height - v * height / top:.1f}", f"{v * height / top:.1f}", v)
         for i, v in enumerate(values)),
    )
    right = left + width * len(values)
    return format_html(
        '<svg class="jq-chart" role="img" aria-label="{}" width="{}" height="{}" fill="{}" '
        'xmlns="http://www.w3.org/2000/svg"><title>{}</title>'
        '<g font-size="9" fill="#777"><text x="{}" y="8" text-anchor="end">{}</text>'
        '<text x="{}" y="{}" text-anchor="end">0</text>'
        '<text x="{}" y="{}">−{} min</text><text x="{}" y="{}" text-anchor="end">now</text></g>'
        '<line x1="{}" y1="0" x2="{}" y2="{}" stroke="#bbb" stroke-width="1"/>'
        '<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#bbb" stroke-width="1"/>{}</svg>',
        title, right + 2, height + bottom, colour, title,
        left - 3, top, left - 3, height, left, height + bottom - 1, len(values), right,
        height + bottom - 1, left - 0.5, left - 0.5, height + 0.5, left, height + 0.5, right,
        height + 0.5, bars,
    )


class Console:
    """The console's views, bound to one admin site so they share its login and chrome."""

    def __init__(self, site: AdminSite) -> None:
        self.site = site

    def urls(self) -> list[Any]:
        from django.urls import path

        wrap: Callable[[Any], Any] = self.site.admin_view
        return [
            path("", wrap(self.dashboard), name="jobqueue_dashboard"),
            path("find/", wrap(self.find), name="jobqueue_find"),
            path("stuck/", wrap(self.stuck), name="jobqueue_stuck"),
            path("schedules/", wrap(self.schedules), name="jobqueue_schedules"),
            path("workers/", wrap(self.workers), name="jobqueue_workers"),
            path("schedules/<str:name>/<str:action>/", wrap(require_POST(self.schedule_action)),
                 name="jobqueue_schedule_action"),
            path("queues/<str:name>/", wrap(self.queue_page), name="jobqueue_queue"),
            path("queues/<str:name>/<str:action>/", wrap(require_POST(self.queue_action)),
                 name="jobqueue_queue_action"),
            path("jobs/<str:queue>/<str:job_id>/", wrap(self.job_page), name="jobqueue_job"),
            path("jobs/<str:queue>/<str:job_id>/<str:action>/", wrap(require_POST(self.job_action)),
                 name="jobqueue_job_action"),
        ]

    def _render(self, request: HttpRequest, template: str, title: str, status: int = 200,
                **context: Any) -> HttpResponse:
        return render(request, f"admin/jobqueue/{template}", {
            **self.site.each_context(request), "title": title, **context,
        }, status=status)

    # -- pages -------------------------------------------------------------------------------

    def dashboard(self, request: HttpRequest) -> HttpResponse:
        cards = []
        for name in known_queues():
            view = console.overview(Queue(name))
            cards.append({
                "o": view,
                "throughput": bar_chart(view.succeeded, f"{name}: succeeded per minute", "#417690"),
                "backlog": bar_chart(view.backlog, f"{name}: waiting jobs, per minute", "#8a6d00"),
                "lag": bar_chart(view.oldest, f"{name}: oldest wait (s), per minute", "#6b4f9e"),
                "failures": bar_chart(view.failed, f"{name}: failed runs per minute", "#ba2121"),
            })
        return self._render(request, "dashboard.html", "Job queues", cards=cards,
                            workers=presence.workers(Queue("default").client),
                            can_pause=request.user.has_perm("jobqueue.pause_queue"))

    def queue_page(self, request: HttpRequest, name: str) -> HttpResponse:
        queue = self._queue(name)
        state = request.GET.get("state", State.PENDING)
        if state not in console.PAGE_STATES:
            state = State.PENDING
        shards = queue.all_shards()
        shard = _int(request.GET.get("shard"), 0, 0, shards - 1)
        number = _int(request.GET.get("page"), 1, 1, 10**9)
        lane = request.GET.get("lane", console.DEFAULT_LANE)
        try:
            lane = "" if lane == console.DEFAULT_LANE else validate_lane(lane)
        except JobQueueError:
            lane = ""
        jobs, total = console.page(queue, state, shard, number, lane=lane)
        in_flight = console.lanes_in_flight(queue, shard)
        lanes = [(lane, depth, in_flight.get(lane, 0))
                 for lane, depth in console.deepest_lanes(queue, 50)]
        last = max((total + 49) // 50, 1)
        layout = queue.layout(fresh=True)
        shard_rows = [(i, layout.status(i), queue.shard_counts(i)) for i in range(shards)]
        return self._render(
            request, "queue.html", f"Queue {name}", queue=queue, view=console.overview(queue),
            run_times=console.run_times_by_handler(name),
            jobs=jobs, total=total, state=state, states=list(console.PAGE_STATES), shard=shard,
            lane=lane or console.DEFAULT_LANE,
            shard_range=range(shards), shard_rows=shard_rows, layout=layout,
            resizes=[{**e, "at": datetime.fromtimestamp(e["at"], UTC)}
                     for e in layouts.history(queue.client, name, 10)],
            can_resize=request.user.has_perm("jobqueue.resize_queue"),
            page=number, last_page=last, lanes=lanes,
            prev_page=number - 1 if number > 1 else None,
            next_page=number + 1 if number < last else None,
        )

    def workers(self, request: HttpRequest) -> HttpResponse:
        return self._render(request, "workers.html", "Workers",
                            workers=presence.workers(get_client()))

    def schedules(self, request: HttpRequest) -> HttpResponse:
        entries = get_config().schedule
        state = schedule.state(get_client()) if entries else {}
        now = datetime.now(UTC)
        rows = []
        for name, entry in entries.items():
            seen = state.get(name, {})
            last = seen.get("last")
            rows.append({
                "entry": entry, "paused": bool(seen.get("paused")), "job": seen.get("job"),
                "queue": entry.queue or _job_queue(entry.job),
                "last": datetime.fromtimestamp(last / 1000, UTC) if isinstance(last, int) else None,
                "next": entry.next_tick(now),
            })
        return self._render(request, "schedules.html", "Periodic jobs", rows=rows,
                            can_run=request.user.has_perm("jobqueue.run_schedule"))

    def schedule_action(self, request: HttpRequest, name: str, action: str) -> HttpResponse:
        if action not in ("run", "pause", "resume"):
            raise PermissionDenied(f"unknown action {action!r}")
        if not request.user.has_perm("jobqueue.run_schedule"):
            raise PermissionDenied
        entry = get_config().schedule.get(name)
        if entry is None:
            from django.http import Http404

            raise Http404(f"No periodic job {name!r} in JOBQUEUE['SCHEDULE'].")
        if action == "run" and request.POST.get("confirm") != "yes":
            return self._render(request, "confirm_schedule.html", f"Run {name} now?", entry=entry)
        client = get_client()
        if action == "run":
            job_id = schedule.run_now(entry, client)
            message = f"Ran periodic job {name} now: job {job_id}."
        else:
            schedule.set_paused(client, name, action == "pause")
            message = f"Periodic job {name} {'paused' if action == 'pause' else 'resumed'}."
        LogEntry.objects.create(user_id=int(request.user.pk or 0), object_id=name,
                                object_repr=f"schedule {name}"[:200], action_flag=CHANGE,
                                change_message=message)
        messages.success(request, message)
        return self._back(request, console_reverse(request, "jobqueue_schedules"))

    def stuck(self, request: HttpRequest) -> HttpResponse:
        pending_over = _int(request.GET.get("pending_over"), 300, 1, 10**7)
        running_over = _int(request.GET.get("running_over"), 600, 1, 10**7)
        sections = []
        for name in known_queues():
            found = console.stuck(Queue(name), pending_over, running_over)
            sections.append((name, found))
        return self._render(request, "stuck.html", "Stuck jobs", sections=sections,
                            pending_over=pending_over, running_over=running_over)

    def find(self, request: HttpRequest) -> HttpResponse:
        """A job id leads to its page; other text lists jobs by lane, unique key or handler."""
        raw = request.GET.get("id", "").strip()
        if not raw:
            return self._render(request, "find.html", "Find a job", query="")
        try:
            job_id = ids.validate_job_id(raw)
        except InvalidJobId:
            found = console.search(raw)
            if not found:
                messages.warning(request, f"No job has the id, lane, unique key or handler {raw!r}.")
            return self._render(request, "find.html", f"Jobs matching {raw[:60]!r}", query=raw,
                                jobs=found, searched=True)
        for name in known_queues():
            if Queue(name).locate(job_id) is not None:
                return HttpResponseRedirect(console_reverse(request, "jobqueue_job", name, job_id))
        row = Job.objects.filter(pk=job_id).first()
        if row is not None:
            return HttpResponseRedirect(console_reverse(request, "jobqueue_job", row.queue, job_id))
        messages.warning(request, f"No job {job_id} in Valkey or in the mirror.")
        return self._render(request, "find.html", "Find a job", query=raw)

    def job_page(self, request: HttpRequest, queue: str, job_id: str) -> HttpResponse:
        info = self._job(queue, job_id)
        allowed = {action for action, perm in ACTIONS.items()
                   if info.state in ALLOWED[action] and request.user.has_perm(f"jobqueue.{perm}")}
        if info.source == "mirror":
            allowed &= {"retry"}
        timeline = sorted(
            ((label, when) for label, when in [
                ("enqueued", info.enqueued_at), ("ready / due", info.run_after),
                ("started", info.started_at), ("lease until", info.lease_until),
                ("finished", info.finished_at)] if when),
            key=lambda item: item[1],
        )
        return self._render(
            request, "job.html", f"Job {job_id}", job=info, actions=allowed, timeline=timeline,
            payload=_pretty(info.payload), result=_pretty(info.result),
            checkpoint=_pretty(info.checkpoint),
            mirror_url=reverse(f"{self.site.name}:jobqueue_job_changelist") + f"?q={job_id}",
        )

    # -- actions -----------------------------------------------------------------------------

    def job_action(self, request: HttpRequest, queue: str, job_id: str, action: str) -> HttpResponse:
        if action not in ACTIONS:
            raise PermissionDenied(f"unknown action {action!r}")
        if not request.user.has_perm(f"jobqueue.{ACTIONS[action]}"):
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
            _log(request, Job(id=job_id, queue=queue, state=info.state), message)
        return self._back(request, console_reverse(request, "jobqueue_job", queue, job_id))

    def _do(self, action: str, info: JobInfo, request: HttpRequest) -> str:
        queue = Queue(info.queue)
        if action == "retry":
            state = retry_job(queue, info)
            return f"Retried job {info.id}: it is {state} again."
        if action == "reprioritize":
            raw = request.POST.get("priority", "")
            try:
                priority = int(raw)
            except ValueError:
                raise JobQueueError(f"priority must be an integer in -100…100, got {raw!r}") from None
            queue.reprioritize(info.id, priority)
            return f"Job {info.id} now has priority {priority}."
        state = queue.cancel(info.id)
        if state == State.ACTIVE:
            return f"Job {info.id} is running: it will be recorded as cancelled when it stops."
        return f"Cancelled job {info.id}."

    def queue_action(self, request: HttpRequest, name: str, action: str) -> HttpResponse:
        if action == "resize":
            return self._resize(request, name)
        if action not in ("pause", "resume"):
            raise PermissionDenied(f"unknown action {action!r}")
        if not request.user.has_perm("jobqueue.pause_queue"):
            raise PermissionDenied
        queue = self._queue(name)
        if action == "pause":
            queue.pause()
        else:
            queue.resume()
        message = f"Queue {name} {'paused' if action == 'pause' else 'resumed'}."
        shard, _ = Shard.objects.get_or_create(queue=name, index=0)
        _log(request, shard, message)
        messages.success(request, message)
        return self._back(request, console_reverse(request, "jobqueue_dashboard"))

    def _resize(self, request: HttpRequest, name: str) -> HttpResponse:
        """Confirm (saying what growing or shrinking does), then resize and log it."""
        from .mirror import record_shards

        if not request.user.has_perm("jobqueue.resize_queue"):
            raise PermissionDenied
        queue = self._queue(name)
        back = console_reverse(request, "jobqueue_queue", name)
        raw = request.POST.get("count", "").strip()
        try:
            count = layouts.validate_count(int(raw) if raw.isdigit() else raw)
            before = queue.layout(fresh=True)
            layouts.plan(before, count)
        except JobQueueError as exc:
            messages.error(request, f"Resize {name}: {exc}")
            return HttpResponseRedirect(back)
        if request.POST.get("confirm") != "yes":
            return self._render(request, "confirm_resize.html", f"Resize queue {name}?",
                                queue=queue, before=before, count=count)
        try:
            queue.resize(count, by=f"console: {request.user}")
        except JobQueueError as exc:
            messages.error(request, f"Resize {name}: {exc}")
            return HttpResponseRedirect(back)
        record_shards(queue)
        message = f"Queue {name} resized from {before.live} to {count} shard(s)."
        shard, _ = Shard.objects.get_or_create(queue=name, index=0)
        _log(request, shard, message)
        messages.success(request, message)
        return HttpResponseRedirect(back)

    # -- helpers -----------------------------------------------------------------------------

    def _queue(self, name: str) -> Queue:
        try:
            return Queue(validate_queue(name))
        except JobQueueError as exc:
            raise PermissionDenied(str(exc)) from None

    def _job(self, queue: str, job_id: str) -> JobInfo:
        from django.http import Http404

        try:
            ids.validate_job_id(job_id)
            info = self._queue(queue).get(job_id)
        except JobQueueError as exc:
            raise Http404(str(exc)) from None
        if info is None:
            row = Job.objects.filter(pk=job_id).first()
            if row is None:
                raise Http404(f"No job {job_id} in queue {queue!r}, live or mirrored.")
            info = row.info()
        return info

    def _back(self, request: HttpRequest, default: str) -> HttpResponse:
        target = request.POST.get("next", "")
        if not url_has_allowed_host_and_scheme(target, {request.get_host()}, request.is_secure()):
            target = default
        return HttpResponseRedirect(target or default)


def retry_job(queue: Queue, info: JobInfo) -> str:
    """Retry a dead or cancelled job: in place while Valkey has its row, else re-created from
    its mirror row under the same id (a fresh row: its attempts start again)."""
    if queue.locate(info.id) is not None:
        return queue.retry(info.id)
    if info.state not in ALLOWED["retry"]:
        raise JobQueueError(f"cannot retry job {info.id}: it is {info.state}")
    queue.enqueue(info.payload, job_id=info.id, lane=info.lane, priority=info.priority,
                  max_attempts=info.max_attempts or None)
    return State.PENDING


def _log(request: HttpRequest, obj: Any, message: str) -> None:
    LogEntry.objects.log_actions(user_id=int(request.user.pk or 0), queryset=[obj], action_flag=CHANGE,
                                 change_message=message, single_object=True)


def _pretty(value: Any) -> str:
    if value is None:
        return ""
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


def _int(raw: str | None, default: int, low: int, high: int) -> int:
    try:
        return min(max(int(raw or default), low), high)
    except ValueError:
        return default



def _job_queue(path: str) -> str:
    """The queue a handler's jobs go to (its @job's queue), for the schedules page."""
    from .api import _registry

    handler = _registry.get(path)
    return handler.options.queue if handler else "default"
