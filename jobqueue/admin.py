"""The mirror's changelist (finished jobs in MySQL) and shard metadata, in the Django admin.

Periodic jobs kept in the database (`Schedule`) are edited here too, the settings' ones shown
read-only beside them. The live console (dashboard, queue pages, job pages, stuck jobs, workers,
periodic jobs) is in `console/pages.py`; `JobAdmin.get_urls()` mounts it at
`admin/jobqueue/job/live/`, so a project needs no URL of its own for it.
"""

from __future__ import annotations

import json
from copy import copy
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.db.models import Min, QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import include, path, reverse
from django.utils.html import format_html

from .engine.store import Queue
from .exceptions import JobQueueError
from .models import Job, Schedule, Shard


class LaneFilter(admin.SimpleListFilter):
    """An exact-lane text box: lanes are per tenant or user, far too many to list as links."""

    title = "lane"
    parameter_name = "lane"
    template = "admin/jobqueue/input_filter.html"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return []

    def has_output(self) -> bool:
        return True

    def choices(self, changelist: Any) -> Any:
        """One 'choice': the other filters, kept as hidden fields of the text box's form."""
        keep = [(k, v) for k, v in changelist.params.items() if k != self.parameter_name]
        yield {"keep": keep, "value": self.value() or ""}

    def queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> QuerySet[Job]:
        from .keys import validate_lane

        if not self.value():
            return queryset
        try:
            return queryset.filter(lane=validate_lane(self.value()))
        except JobQueueError:  # (no lane has such a name: no row, rather than a database error)
            return queryset.none()


class QueueFilter(admin.SimpleListFilter):
    """The queues the history holds (those the user may see), found by one index probe a queue
    (the first name after the last one found), not by a DISTINCT over every row."""

    title = "queue"
    parameter_name = "queue"
    LISTED = 100
    """Queues listed at most."""

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        rows = model_admin.get_queryset(request).order_by()
        names: list[str] = []
        while len(names) < self.LISTED:
            after = rows.filter(queue__gt=names[-1]) if names else rows
            first = after.aggregate(first=Min("queue"))["first"]
            if first is None:
                break
            names.append(first)
        return [(name, name) for name in names]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> QuerySet[Job]:
        return queryset.filter(queue=self.value()) if self.value() else queryset


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = ("job_link", "queue", "state", "lane", "priority", "attempts", "finished_at")
    list_display_links = None
    list_filter = (QueueFilter, "state", LaneFilter, "finished_at")
    # (no date_hierarchy: its drill-down reads every row's date; the finished_at filter's ranges
    # and the console's search, by time too, do not)
    search_fields = ("=id", "=unique_key")
    list_per_page = 100
    show_full_result_count = False
    actions = ["retry_selected"]
    readonly_fields = [f.name for f in Job._meta.fields]

    @admin.display(description="job", ordering="id")
    def job_link(self, obj: Job) -> str:
        url = reverse(f"{self.admin_site.name}:jobqueue_job", args=[obj.queue, obj.id])
        return format_html('<a href="{}">{}</a>', url, obj.id)

    def get_list_display(self, request: HttpRequest) -> Any:
        """The columns, with the job's arguments as this user may see them (hidden ones masked:
        console/hidden.py)."""
        return (*self.list_display, _arguments(request))

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        """Every field, read-only; the payload as this user may see it."""
        from .console import hidden

        if hidden.may_see(request):
            return self.readonly_fields
        return [name if name != "payload" else _payload(request)
                for name in self.readonly_fields]

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return self.get_readonly_fields(request, obj)

    def get_urls(self) -> list[Any]:
        # (imported here: the console's views load with the admin's URLs, not in every process
        # that sets Django up, such as a worker)
        from .urls import console_urls

        return [path("live/", include(console_urls(self.admin_site))), *super().get_urls()]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Job]:
        """Only the rows of the queues the user may see (console/access.py)."""
        from .console import access

        return access.history(request, super().get_queryset(request))

    def get_object(self, request: HttpRequest, object_id: str, from_field: str | None = None) -> Job | None:
        """A row as its page shows it: a sealed job's data sealed, unless the user may read it
        (console/sealed.py); hidden arguments its errors quote masked (console/hidden.py)."""
        from .console import hidden, sealed

        if "\x00" in object_id:  # (no id holds one; PostgreSQL refuses to compare with it)
            return None
        row = super().get_object(request, object_id, from_field)
        if row is None:
            return None
        row = sealed.shown_row(row, request.user)
        found = hidden.unseen(request, row.queue, row.payload)
        if found:  # (a copy: the row itself is never saved here)
            row = copy(row)
            row.last_error = hidden.mask_text(row.last_error, found)
            if isinstance(row.history, list):
                row.history = hidden.mask_attempts(row.history, found)
        return row

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_retry_permission(self, request: HttpRequest) -> bool:
        from .console import actions  # (here: a worker sets Django up, and loads no console)

        return request.user.has_perm(actions.PERMISSIONS["retry"])

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # the mirror is history: it is not edited here

    @admin.action(permissions=["retry"], description="Retry selected jobs")
    def retry_selected(self, request: HttpRequest, queryset: QuerySet[Job]) -> HttpResponse | None:
        """Confirm first (showing how many), then retry each job through the Queue API."""
        from .console import access, actions

        acted_on = [q for q in queryset.values_list("queue", flat=True).distinct()
                    if not access.may_act(request, q)]
        if acted_on:  # (the changelist lists only what the user sees: these are view-only)
            self.message_user(request, f"You may not act on queue(s) {', '.join(sorted(acted_on))}: "
                              f"nothing was retried.", messages.ERROR)
            return None
        if request.POST.get("post") != "yes":
            return TemplateResponse(request, "admin/jobqueue/confirm_bulk_retry.html", {
                **self.admin_site.each_context(request), "title": "Retry jobs?",
                "count": queryset.count(), "sample": queryset[:20], "opts": self.model._meta,
                "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
                "selected": request.POST.getlist(helpers.ACTION_CHECKBOX_NAME),
                "select_across": request.POST.get("select_across", "0"),
            })
        done, failed = 0, []
        for row in queryset.iterator():
            try:
                actions.retry_job(Queue(row.queue), row.id)
            except JobQueueError as exc:
                failed.append(f"{row.id}: {exc}")
                continue
            done += 1
            actions.log_action(request.user, row, f"Retried job {row.id} (bulk).")
        self.message_user(request, f"Retried {done} job(s).", messages.SUCCESS)
        for problem in failed[:10]:
            self.message_user(request, problem, messages.WARNING)
        return None


def _arguments(request: HttpRequest) -> Any:
    """The changelist's "arguments" column for this user."""
    from .console import hidden
    from .console.searching import arguments_text

    @admin.display(description="arguments")
    def arguments(obj: Job) -> str:
        return arguments_text(hidden.shown_payload(request, obj.queue, obj.payload))

    return arguments


def _payload(request: HttpRequest) -> Any:
    """The change page's payload for this user."""
    from .console import hidden

    @admin.display(description="payload")
    def payload(obj: Job) -> str:
        return json.dumps(hidden.shown_payload(request, obj.queue, obj.payload),
                          ensure_ascii=False, default=str)

    return payload


@admin.register(Shard)
class ShardAdmin(admin.ModelAdmin):
    list_display = ("queue", "index", "status", "pending", "scheduled", "active", "dead", "updated_at")
    list_filter = ("queue", "status")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Shard]:
        from .console import access

        return access.history(request, super().get_queryset(request))

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return super().has_change_permission(request, obj) and _acts_on(request, obj and obj.queue)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return super().has_delete_permission(request, obj) and _acts_on(request, obj and obj.queue)


def _acts_on(request: HttpRequest, queue: str | None) -> bool:
    """Whether the user may act on `queue` (None: a changelist, no row yet: its rows decide)."""
    from .console import access

    return queue is None or access.may_act(request, queue)


class ScheduleForm(forms.ModelForm):
    """A periodic job's row, checked as a settings' entry is (`cron.parse`, and a registered
    `@job` as `manage.py check` asks): each error on its field, nothing saved."""

    class Meta:
        model = Schedule
        fields = ("name", "job", "cron", "every", "timezone", "args", "kwargs", "queue", "lane",
                  "priority", "enabled")

    request: HttpRequest | None = None
    """The request of the user who fills it (`ScheduleAdmin.get_form`)."""

    def clean(self) -> dict[str, Any]:
        from .api.registry import lookup
        from .conf import get_config
        from .cron import Cron
        from .keys import validate_lane, validate_queue
        from .operations.checks import autodiscover_jobs
        from .options import validate_priority

        data = super().clean() or self.cleaned_data
        if data.get("name") in get_config().schedule:
            self.add_error("name", f"JOBQUEUE['SCHEDULE'] has an entry named {data['name']!r} already")
        autodiscover_jobs()
        checks = [("job", lookup), ("cron", Cron.parse), ("queue", validate_queue),
                  ("lane", validate_lane), ("priority", validate_priority)]
        for field, test in checks:
            if data.get(field) not in (None, ""):
                self._check(field, test, data[field])
        if bool(data.get("cron")) == (data.get("every") is not None):
            self.add_error(None, "give exactly one of 'cron' and 'every'")
        every = data.get("every")
        if every is not None and not 1 <= every <= 366 * 86_400:
            self.add_error("every", f"'every' must be seconds within 1…31622400, got {every:g}")
        try:
            ZoneInfo(data.get("timezone") or "UTC")
        except (ZoneInfoNotFoundError, ValueError):
            self.add_error("timezone", f"unknown timezone {data.get('timezone')!r}")
        for field, kind, what in (("args", list, "a JSON list"), ("kwargs", dict, "a JSON object")):
            if field in data and not isinstance(data[field], kind):
                self.add_error(field, f"must be {what}")
        if not self.errors:  # (whatever else the settings' parser refuses)
            row = Schedule(**{f: data.get(f) for f in self.Meta.fields})
            self._check(None, row.entry)
        if not self.errors and self.request is not None:  # (its jobs go where the user acts)
            from .console import access, posts

            queue = posts.schedule_queue(Schedule(job=data["job"], queue=data.get("queue") or ""))
            if not access.may_act(self.request, queue):
                self.add_error("queue", f"you may not act on queue {queue!r}: its periodic jobs "
                                        f"are not yours to add or change")
        return data

    def _check(self, field: str | None, test: Any, *args: Any) -> None:
        try:
            test(*args)
        except (JobQueueError, ValueError, TypeError) as exc:
            self.add_error(field, str(exc))


@admin.register(Schedule)
class ScheduleAdmin(admin.ModelAdmin):
    """Periodic jobs in the database, checked as settings' entries are (`Schedule.clean`); the
    `JOBQUEUE["SCHEDULE"]` entries listed read-only above them."""

    list_display = ("name", "job", "when", "queue", "enabled", "updated_at")
    list_filter = ("enabled",)
    search_fields = ("name", "job")
    change_list_template = "admin/jobqueue/schedule/change_list.html"
    form = ScheduleForm

    @admin.display(description="when")
    def when(self, obj: Schedule) -> str:
        return obj.cron or (f"every {obj.every:g} s" if obj.every is not None else "")

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None
                        ) -> HttpResponse:
        from .conf import get_config
        from .operations.checks import autodiscover_jobs

        autodiscover_jobs()  # (a blank queue is its handler's)
        entries = [e for e in get_config().schedule.values() if _schedule_seen(request, e)]
        return super().changelist_view(request, {**(extra_context or {}),
                                                 "settings_entries": entries})

    def get_queryset(self, request: HttpRequest) -> QuerySet[Schedule]:
        """Only the periodic jobs whose jobs go to a queue the user may see (console/access.py)."""
        from .console import access
        from .operations.checks import autodiscover_jobs

        rows = super().get_queryset(request)
        if access.scope(request).unrestricted():
            return rows
        autodiscover_jobs()  # (a blank queue is its handler's)
        return rows.filter(pk__in=[row.pk for row in rows.only("pk", "job", "queue")
                                   if _schedule_seen(request, row)])

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False,
                 **kwargs: Any) -> Any:
        form = super().get_form(request, obj, change, **kwargs)
        return type(form.__name__, (form,), {"request": request})

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return super().has_change_permission(request, obj) and _schedule_acted(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return super().has_delete_permission(request, obj) and _schedule_acted(request, obj)


def _schedule_seen(request: HttpRequest, entry: Any) -> bool:
    """Whether the user may see the queue a periodic job (`Entry` or `Schedule`) fills."""
    from .console import access, posts

    return access.may_view(request, posts.schedule_queue(entry))


def _schedule_acted(request: HttpRequest, row: Schedule | None) -> bool:
    """Whether the user may act on the queue a periodic job's row fills (None: any row)."""
    from .console import posts

    return _acts_on(request, None if row is None else posts.schedule_queue(row))
