"""The operator's actions in the console: one class-based view each, its permission beside it.

urls.py mounts each behind the admin's login and CSRF check and the console's view permission.
An action answers a POST only (a GET gets 405, whoever asks), needs its own Django permission
(`permission_required`, from `actions.PERMISSIONS`: 403 without it), finds what its URL names
(a job, a queue or a periodic job: 404, or 403 for a name no queue may have), asks "are you
sure?" first when `confirm` names a template, does one thing through `actions`, tells the
operator through the messages framework (a `JobQueueError` is a form error, never a 500),
records an admin LogEntry and sends the operator back. A page shows an action's button when the
action is `permitted` to the user.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.mixins import PermissionRequiredMixin
from django.core.exceptions import ImproperlyConfigured, PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBase, HttpResponseRedirect
from django.views import View

from ..api.registry import lookup
from ..cron import Entry
from ..engine import layouts
from ..engine.store import JobInfo, Queue
from ..exceptions import InvalidName, JobQueueError, UnknownHandler
from ..models import BulkOperation, Job, Shard
from ..operations import stored_schedules
from . import access, actions, bulk, readmodels
from .site import ConsoleSite, console_reverse


class ConsoleAction[Target](PermissionRequiredMixin, View):
    """One operator action on a `Target` (what its URL names): POST only, its permission
    (`permission_required`), confirmed first when `confirm` names a template, logged as a
    LogEntry, told through messages. Subclasses say how to find the target, act on it, log it
    and where to go back."""

    http_method_names = ["post"]
    raise_exception = True  # a 403, never the login page: the admin sent strangers there already
    permission_required = ""
    site: ConsoleSite | None = None
    """The console's plumbing (`as_view(site=…)`): render, find the target, go back."""
    confirm = ""
    """The template asking "are you sure?" first (a POST with confirm=yes acts); "" for none."""
    refused = "{}"
    """An error message's start (`refusal`), `{}` standing for the target's name."""

    @classmethod
    def permitted(cls, request: HttpRequest) -> bool:
        """Whether the user may do this action (a page shows its button only then)."""
        return request.user.has_perm(cls.permission_required)

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        if (request.method or "").lower() not in self.http_method_names:  # GET never acts: 405
            return self.http_method_not_allowed(request, *args, **kwargs)  # before any 403
        return super().dispatch(request, *args, **kwargs)

    def post(self, request: HttpRequest, **names: str) -> HttpResponse:
        if self.site is None:
            raise ImproperlyConfigured(f"mount {type(self).__name__} with as_view(site=…)")
        target = self.target(self.site, **names)
        access.require_act(request, self.queue_of(target))
        try:
            if self.confirm and request.POST.get("confirm") != "yes":
                title, context = self.asking(request, target)
                return self.site.render(request, self.confirm, title, **context)
            message = self.act(request, target)
        except JobQueueError as exc:
            messages.error(request, f"{self.refusal(target)}: {exc}")
        else:
            self.log(request, target, message)
            messages.success(request, message)
        return self.site.back(request, self.back_to(request, target))

    def target(self, site: ConsoleSite, **names: str) -> Target:
        """What the URL names (Http404 or PermissionDenied when there is no such thing)."""
        raise NotImplementedError

    def queue_of(self, target: Target) -> str:
        """The queue `target` belongs to: the user needs `act` on it (`access.require_act`)."""
        raise NotImplementedError

    def refusal(self, target: Target) -> str:
        """An error message's start, before the error: "Resize default"."""
        raise NotImplementedError

    def asking(self, request: HttpRequest, target: Target) -> tuple[str, dict[str, Any]]:
        """The confirmation page's title and context (a `JobQueueError` refuses the form)."""
        raise NotImplementedError

    def act(self, request: HttpRequest, target: Target) -> str:
        """Do it through `actions`: the line the operator reads."""
        raise NotImplementedError

    def log(self, request: HttpRequest, target: Target, message: str) -> None:
        """Record it in the admin's history."""
        raise NotImplementedError

    def back_to(self, request: HttpRequest, target: Target) -> str:
        """Where the operator goes next, unless the form's `next` says otherwise."""
        raise NotImplementedError


# -- one job ------------------------------------------------------------------------------------


class JobAction(ConsoleAction[JobInfo]):
    """An action on one job (`jobs/<queue>/<job_id>/…`): live, or only in its queue's history;
    logged on the job's row; back to the job's page."""

    verb = ""
    """Its name on the job page (`actions` there) and in its error messages."""
    states: frozenset[str] = frozenset()
    """The states in which the job page offers it."""

    def target(self, site: ConsoleSite, **names: str) -> JobInfo:
        return site.job(names["queue"], names["job_id"])

    def queue_of(self, target: JobInfo) -> str:
        return target.queue

    def refusal(self, target: JobInfo) -> str:
        return f"{self.verb} {target.id}"

    def log(self, request: HttpRequest, target: JobInfo, message: str) -> None:
        row = Job(id=target.id, queue=target.queue, state=target.state)
        actions.log_action(request.user, row, message)

    def back_to(self, request: HttpRequest, target: JobInfo) -> str:
        return console_reverse(request, "jobqueue_job", target.queue, target.id)


class RetryJob(JobAction):
    """Run a dead, cancelled or expired job again (`actions.retry_job`)."""

    permission_required = actions.PERMISSIONS["retry"]
    verb, states = "retry", actions.JOB_STATES["retry"]

    def act(self, request: HttpRequest, target: JobInfo) -> str:
        state = actions.retry_job(Queue(target.queue), target.id)
        return actions.retry_message(target.id, state)


class ReprioritizeJob(JobAction):
    """Give a waiting or running job the priority the form holds."""

    permission_required = actions.PERMISSIONS["reprioritize"]
    verb, states = "reprioritize", actions.JOB_STATES["reprioritize"]

    def act(self, request: HttpRequest, target: JobInfo) -> str:
        return actions.reprioritize_job(Queue(target.queue), target.id,
                                        request.POST.get("priority", ""))


class CancelJob(JobAction):
    """Cancel a job that has not finished, once the operator confirms."""

    permission_required = actions.PERMISSIONS["cancel"]
    verb, states = "cancel", actions.JOB_STATES["cancel"]
    confirm = "confirm.html"

    def asking(self, request: HttpRequest, target: JobInfo) -> tuple[str, dict[str, Any]]:
        return f"Cancel job {target.id}?", {"job": target}

    def act(self, request: HttpRequest, target: JobInfo) -> str:
        return actions.cancel_job(Queue(target.queue), target.id)


JOB_ACTIONS: tuple[type[JobAction], ...] = (RetryJob, ReprioritizeJob, CancelJob)
"""The job page's actions, in the order it shows them."""


# -- one queue ----------------------------------------------------------------------------------


class QueueAction(ConsoleAction[Queue]):
    """An action on one queue (`queues/<name>/…`): logged on its shard 0 row; back to its page."""

    def target(self, site: ConsoleSite, **names: str) -> Queue:
        return site.queue(names["name"])

    def queue_of(self, target: Queue) -> str:
        return target.name

    def refusal(self, target: Queue) -> str:
        return self.refused.format(target.name)

    def log(self, request: HttpRequest, target: Queue, message: str) -> None:
        shard, _ = Shard.objects.get_or_create(queue=target.name, index=0)
        actions.log_action(request.user, shard, message)

    def back_to(self, request: HttpRequest, target: Queue) -> str:
        return console_reverse(request, "jobqueue_queue", target.name)


class PauseQueue(QueueAction):
    """Stop workers claiming the queue's jobs; back to the dashboard, where its button is."""

    permission_required = actions.PERMISSIONS["pause"]
    refused, paused = "Pause {}", True

    def act(self, request: HttpRequest, target: Queue) -> str:
        return actions.pause_queue(target, self.paused)

    def back_to(self, request: HttpRequest, target: Queue) -> str:
        return console_reverse(request, "jobqueue_dashboard")


class ResumeQueue(PauseQueue):
    """Let workers claim a paused queue's jobs again."""

    refused, paused = "Resume {}", False


class ResizeQueue(QueueAction):
    """Set the queue's live shard count, once the operator has read what that does."""

    permission_required = actions.PERMISSIONS["resize"]
    refused, confirm = "Resize {}", "confirm_resize.html"

    def asking(self, request: HttpRequest, target: Queue) -> tuple[str, dict[str, Any]]:
        count = _count(request)
        before = layouts.before_resize(target.client, target.name, target.configured, count)
        layouts.plan(before, count)  # refused now rather than after the confirmation
        return f"Resize queue {target.name}?", {"queue": target, "before": before, "count": count}

    def act(self, request: HttpRequest, target: Queue) -> str:
        count = _count(request)
        before, _ = actions.resize_queue(target, count, by=f"console: {request.user}")
        return f"Queue {target.name} resized from {before.live} to {count} shard(s)."


def _count(request: HttpRequest) -> int:
    return layouts.validate_count(actions.typed_number(request.POST.get("count", "")))


class SetLaneConcurrency(QueueAction):
    """Set (or, with a blank cap, drop) a lane's cap live."""

    permission_required = actions.PERMISSIONS["set_lane_concurrency"]
    refused = "Lane cap on {}"

    def act(self, request: HttpRequest, target: Queue) -> str:
        lane = request.POST.get("lane", "").strip()
        if not lane:
            raise InvalidName(f"name a lane, {readmodels.DEFAULT_LANE} or * (every named lane)")
        lane = "" if lane == readmodels.DEFAULT_LANE else lane
        return actions.set_lane_concurrency(target, lane, request.POST.get("cap", ""))


class SetGlobalConcurrency(QueueAction):
    """Set the queue's global cap live, lift it ("lift"), or go back to the settings' cap
    ("settings")."""

    permission_required = actions.PERMISSIONS["set_global_concurrency"]
    refused = "Global cap on {}"

    def act(self, request: HttpRequest, target: Queue) -> str:
        how = "lift" if "lift" in request.POST else "settings" if "settings" in request.POST else ""
        return actions.set_global_concurrency(target, request.POST.get("cap", ""), how)


# -- one periodic job ---------------------------------------------------------------------------


class ScheduleAction(ConsoleAction[Entry]):
    """An action on one periodic job, of `JOBQUEUE['SCHEDULE']` or the database
    (`schedules/<name>/…`): logged
    under its name; back to the periodic jobs' page."""

    permission_required = actions.PERMISSIONS["run_schedule"]

    def target(self, site: ConsoleSite, **names: str) -> Entry:
        entry = stored_schedules.find(names["name"])
        if entry is None:
            raise Http404(f"No periodic job {names['name']!r} in JOBQUEUE['SCHEDULE'] or the database.")
        return entry

    def queue_of(self, target: Entry) -> str:
        return schedule_queue(target)

    def refusal(self, target: Entry) -> str:
        return self.refused.format(target.name)

    def log(self, request: HttpRequest, target: Entry, message: str) -> None:
        actions.log_action(request.user, target.name, message)

    def back_to(self, request: HttpRequest, target: Entry) -> str:
        return console_reverse(request, "jobqueue_schedules")


class RunSchedule(ScheduleAction):
    """Enqueue one job of the periodic job now, outside its ticks, once confirmed."""

    refused, confirm = "Run {}", "confirm_schedule.html"

    def asking(self, request: HttpRequest, target: Entry) -> tuple[str, dict[str, Any]]:
        return f"Run {target.name} now?", {"entry": target}

    def act(self, request: HttpRequest, target: Entry) -> str:
        return actions.run_schedule(target)


class PauseSchedule(ScheduleAction):
    """Stop the periodic job's ticks firing."""

    refused, paused = "Pause {}", True

    def act(self, request: HttpRequest, target: Entry) -> str:
        return actions.pause_schedule(target.name, self.paused)


class ResumeSchedule(PauseSchedule):
    """Let a paused periodic job's ticks fire again."""

    refused, paused = "Resume {}", False


def schedule_queue(entry: Any) -> str:
    """The queue a periodic job's jobs go to (of an `Entry`, or a `Schedule` row): its own,
    else its handler's (its @job's)."""
    if entry.queue:
        return entry.queue
    try:
        return lookup(entry.job).options.queue
    except UnknownHandler:
        return "default"


# -- every job a search matches -----------------------------------------------------------------


class BulkAction(View):
    """Retry, cancel or delete every job the search in the form matches (`search/bulk/`): a POST
    with the search's fields and `action` records the operation (`bulk.Bulk.start`; the same
    one under way is found instead of a second) and sends the operator to its page, where a
    runner's count, made outside the request, is confirmed (`BulkDecision`). Each action needs
    its own permission (403 without it)."""

    http_method_names = ["post"]
    site: Any = None
    """The console (`as_view(site=…)`): its search pages (searching.SearchPages)."""

    def post(self, request: HttpRequest) -> HttpResponse:
        action = request.POST.get("action", "")
        _permitted(request, action)
        back = console_reverse(request, "jobqueue_search")
        try:
            query = self.site.checked_query(request, request.POST)
            scope = self.site.acting_queues(request, query)
            if scope == frozenset():
                raise PermissionDenied("no queue this search reaches is one you may act on")
            self.site.checked_bulk(request, query, scope)
            work = bulk.Bulk.of(action, query, scope)
        except JobQueueError as exc:
            messages.error(request, f"Bulk {action}: {exc}")
            return HttpResponseRedirect(back)
        operation = work.start(request.user)
        bulk.run_in_thread()
        return HttpResponseRedirect(console_reverse(request, "jobqueue_bulk", operation.pk))


class BulkDecision(View):
    """The operator's answer on a counted bulk operation's page (`bulk/<pk>/decide/`):
    confirm=yes runs it (once, however often it is clicked: `bulk.Bulk.confirm`), anything
    else drops it. Needs the permission of the operation's action, and leave to act on every
    queue it may reach (`ConsoleSite.covers`)."""

    http_method_names = ["post"]
    site: Any = None
    """The console (`as_view(site=…)`)."""

    def post(self, request: HttpRequest, pk: int) -> HttpResponse:
        operation = BulkOperation.objects.filter(pk=pk).first()
        if operation is None or not self.site.covers(request, operation.scope):
            raise Http404(f"No bulk operation #{pk}.")  # (as its page answers: `bulk_page`)
        _permitted(request, operation.action)
        if not self.site.covers(request, operation.scope, acting=True):
            raise PermissionDenied(f"bulk operation #{pk} reaches queues you may not act on")
        if request.POST.get("confirm") == "yes":
            if bulk.Bulk.confirm(operation, request.user):
                bulk.run_in_thread()
                messages.success(request, f"Bulk {operation.action} #{pk} started.")
            else:
                messages.info(request, f"Bulk {operation.action} #{pk} is {operation.status} "
                                       f"already.")
        elif bulk.Bulk.drop(operation):
            messages.info(request, f"Bulk {operation.action} #{pk} dropped: nothing was done.")
        return HttpResponseRedirect(console_reverse(request, "jobqueue_bulk", pk))


def _permitted(request: HttpRequest, action: str) -> None:
    if action not in bulk.VERBS or not request.user.has_perm(actions.PERMISSIONS[action]):
        raise PermissionDenied(f"no permission to {action or 'act'} in bulk")
