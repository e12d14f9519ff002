"""The operator console: pages inside the Django admin (same login, look and permissions).

Reads come from `readmodels` (live Valkey) and the `Job` mirror; every action is a POST to its
own view in posts.py (its permission, `actions`, message, LogEntry), whose `permitted` decides
which buttons a page shows. `Console` extends the shared plumbing (`site.ConsoleSite`); urls.py
lists the pages and actions; `console_reverse` links within the mount that served them.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from .. import ids
from ..conf import get_client
from ..engine import lanes, layouts, permits
from ..engine.store import Queue
from ..exceptions import InvalidJobId, JobQueueError
from ..keys import validate_lane, validate_queue
from ..models import Job
from ..operations import schedule, stored_schedules
from ..states import State
from ..worker import presence
from . import access, flowgraph, hidden, history, posts, readmodels, sealed, svg, veil
from .searching import SearchPages
from .site import console_reverse


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


class Console(SearchPages):
    """The console's pages (its actions are posts.py's views)."""

    # -- pages -------------------------------------------------------------------------------

    def dashboard(self, request: HttpRequest) -> HttpResponse:
        cards = []
        for name in access.visible_queues(request):
            view = readmodels.overview(Queue(name))
            cards.append({
                "o": view, "can_act": access.may_act(request, name),
                "throughput": bar_chart(view.succeeded, f"{name}: succeeded per minute", "#417690"),
                "backlog": bar_chart(view.backlog, f"{name}: waiting jobs, per minute", "#8a6d00"),
                "lag": bar_chart(view.oldest, f"{name}: oldest wait (s), per minute", "#6b4f9e"),
                "failures": bar_chart(view.failed, f"{name}: failed runs per minute", "#ba2121"),
            })
        return self.render(request, "dashboard.html", "Job queues", cards=cards,
                            workers=access.workers(request, presence.workers(get_client())),
                            can_pause=posts.PauseQueue.permitted(request))

    def queue_page(self, request: HttpRequest, name: str) -> HttpResponse:
        queue = self.queue(name)
        access.require_view(request, name)
        act = access.may_act(request, name)
        shards = queue.all_shards()
        opens = ((State.PENDING, 0, "") if {"state", "shard", "lane"} & set(request.GET)
                 else readmodels.opening(queue))  # (opened bare: on what is there)
        state = request.GET.get("state", opens[0])
        if state not in readmodels.PAGE_STATES:
            state = State.PENDING
        shard = _int(request.GET.get("shard"), opens[1], 0, shards - 1)
        number = _int(request.GET.get("page"), 1, 1, 10**9)
        lane = request.GET.get("lane", opens[2] or readmodels.DEFAULT_LANE)
        try:
            lane = "" if lane == readmodels.DEFAULT_LANE else validate_lane(lane)
        except JobQueueError:
            lane = ""
        jobs, total = readmodels.page(queue, state, shard, number, lane=lane)
        in_flight = readmodels.lanes_in_flight(queue, shard)
        ready_lanes = [(lane, depth, in_flight.get(lane, 0))
                       for lane, depth in readmodels.deepest_lanes(queue, 50)]
        last = max((total + 49) // 50, 1)
        layout = queue.layout(fresh=True)
        shard_rows = [(i, layout.status(i), queue.shard_counts(i)) for i in range(shards)]
        return self.render(
            request, "queue.html", f"Queue {name}", queue=queue, view=readmodels.overview(queue),
            run_times=readmodels.run_times_by_handler(name),
            jobs=jobs, total=total, state=state, states=list(readmodels.PAGE_STATES), shard=shard,
            lane=lane or readmodels.DEFAULT_LANE,
            shard_range=range(shards), shard_rows=shard_rows, layout=layout,
            resizes=[{**e, "at": datetime.fromtimestamp(e["at"], UTC)}
                     for e in layouts.history(queue.client, name, 10)],
            can_resize=act and posts.ResizeQueue.permitted(request),
            lane_caps=lanes.states(queue.client, name, shards, queue.options),
            can_cap=act and posts.SetLaneConcurrency.permitted(request),
            global_cap=permits.state(queue.client, name, queue.options),
            can_global_cap=act and posts.SetGlobalConcurrency.permitted(request),
            can_retry=act and posts.RetryJob.permitted(request),
            can_cancel=act and posts.CancelJob.permitted(request),
            page=number, last_page=last, lanes=ready_lanes,
            prev_page=number - 1 if number > 1 else None,
            next_page=number + 1 if number < last else None,
        )

    def workers(self, request: HttpRequest) -> HttpResponse:
        return self.render(request, "workers.html", "Workers",
                            workers=access.workers(request, presence.workers(get_client())))

    def schedules(self, request: HttpRequest) -> HttpResponse:
        entries = stored_schedules.listed()
        state = schedule.state(get_client()) if entries else {}
        now = datetime.now(UTC)
        rows = []
        for entry, row in entries:
            queue = posts.schedule_queue(entry)
            if not access.may_view(request, queue):
                continue
            seen = state.get(entry.name, {})
            last = seen.get("last")
            rows.append({
                "entry": entry, "paused": bool(seen.get("paused")), "job": seen.get("job"),
                "row": row, "edit": None if row is None else reverse(
                    f"{self.admin_site.name}:jobqueue_schedule_change", args=[row.pk]),
                "queue": queue, "can_run": access.may_act(request, queue),
                "last": datetime.fromtimestamp(last / 1000, UTC) if isinstance(last, int) else None,
                "next": entry.next_tick(now),
            })
        return self.render(request, "schedules.html", "Periodic jobs", rows=rows,
                            can_run=posts.RunSchedule.permitted(request),
                            can_add=request.user.has_perm("jobqueue.add_schedule"),
                            add_url=reverse(f"{self.admin_site.name}:jobqueue_schedule_add"))

    def charts(self, request: HttpRequest) -> HttpResponse:
        """The history over a range, for every queue the user may see, one queue or one
        handler: finished jobs, failures, wait and run times (from the rollup)."""
        span = history.RANGES.get(request.GET.get("range", ""), history.RANGES["day"])
        visible = self.visible_queues(request)
        offered = sorted(visible if visible is not None else access.visible_queues(request))
        queue, handler = request.GET.get("queue", "")[:64], request.GET.get("handler", "")[:200]
        if visible is not None and queue and queue not in visible:
            visible = frozenset()  # (a queue the user may not see: nothing, as for one unused)
        now = datetime.now(UTC)
        points = history.series(span, now, visible, queue, handler)
        step, starts = span.step, points.starts
        colours = {"p50": "#417690", "p95": "#8a6d00", "p99": "#ba2121"}
        charts = [
            svg.time_chart("Finished jobs", starts, step, [
                ("succeeded", points.counts["succeeded"], "#417690"),
                ("dead", points.counts["dead"], "#ba2121"),
                ("cancelled", points.counts["cancelled"], "#999"),
                ("expired", points.counts["expired"], "#8a6d00")], bars=True),
            svg.time_chart("Failures (dead jobs, and failed runs retried)", starts, step, [
                ("dead", points.counts["dead"], "#ba2121"),
                ("retried", points.counts["retried"], "#e08a00")], bars=True),
            svg.time_chart("Wait time (enqueue to start)", starts, step,
                           [(n, points.wait[n], colours[n]) for n in colours], unit="ms"),
            svg.time_chart("Run time", starts, step,
                           [(n, points.run[n], colours[n]) for n in colours], unit="ms"),
        ]
        rows = history.totals(span, now, visible, queue)
        return self.render(request, "charts.html", "History charts", charts=charts, span=span,
                            ranges=history.RANGES.values(), queue=queue,
                            handler=handler, rows=rows, total=points.total,
                            table_since=history.table_since(span, now),
                            queues=offered)

    def stuck(self, request: HttpRequest) -> HttpResponse:
        pending_over = _int(request.GET.get("pending_over"), 300, 1, 10**7)
        running_over = _int(request.GET.get("running_over"), 600, 1, 10**7)
        sections = []
        for name in access.visible_queues(request):
            found = readmodels.stuck(Queue(name), pending_over, running_over)
            sections.append((name, found, access.may_act(request, name)))
        return self.render(request, "stuck.html", "Stuck jobs", sections=sections,
                            pending_over=pending_over, running_over=running_over,
                            can_retry=posts.RetryJob.permitted(request),
                            can_cancel=posts.CancelJob.permitted(request))

    def find(self, request: HttpRequest) -> HttpResponse:
        """A job id leads to its page; other text lists jobs by lane, unique key or handler."""
        raw = request.GET.get("id", "").strip()
        if not raw:
            return self.render(request, "find.html", "Find a job", query="")
        if "\x00" in raw:  # (no id, lane, key or handler holds one; PostgreSQL refuses it)
            messages.error(request, "A job's id, lane, unique key or handler holds no NUL character.")
            return self.render(request, "find.html", "Find a job", status=400, query="")
        try:
            job_id = ids.validate_job_id(raw)
        except InvalidJobId:
            found = readmodels.search(raw, visible=access.visible_queues(request),
                                      history=lambda rows: access.history(request, rows))
            if not found:
                messages.warning(request, f"No job has the id, lane, unique key or handler {raw!r}.")
            return self.render(request, "find.html", f"Jobs matching {raw[:60]!r}", query=raw,
                                jobs=[hidden.shown_errors(request, job) for job in found],
                                searched=True, sealed_queues=sealed.sealed_queues())
        for name in access.visible_queues(request):
            if Queue(name).locate(job_id) is not None:
                return HttpResponseRedirect(console_reverse(request, "jobqueue_job", name, job_id))
        row = access.history(request, Job.objects.filter(pk=job_id)).first()
        if row is not None:
            return HttpResponseRedirect(console_reverse(request, "jobqueue_job", row.queue, job_id))
        messages.warning(request, f"No job {job_id} in Valkey or in the mirror.")
        return self.render(request, "find.html", "Find a job", query=raw)

    def job_page(self, request: HttpRequest, queue: str, job_id: str) -> HttpResponse:
        access.require_view(request, queue)
        info = hidden.shown_errors(request, sealed.shown(self.job(queue, job_id), request.user))
        allowed = {action.verb for action in posts.JOB_ACTIONS
                   if info.state in action.states and action.permitted(request)
                   and access.may_act(request, queue)}
        if info.source == "mirror":
            allowed &= {"retry"}
        timeline = sorted(
            ((label, when) for label, when in [
                ("enqueued", info.enqueued_at), ("ready / due", info.run_after),
                ("started", info.started_at), ("lease until", info.lease_until),
                ("finished", info.finished_at)] if when),
            key=lambda item: item[1],
        )
        return self.render(
            request, "job.html", f"Job {job_id}", job=info, actions=allowed, timeline=timeline,
            payload=_pretty(hidden.shown_payload(request, info.queue, info.payload)),
            result=_pretty(info.result),
            checkpoint=_pretty(info.checkpoint), progress=_pretty(info.progress),
            waits=veil.waits(request, readmodels.waits_of(Queue(info.queue), [info])[info.id])
            if info.state == State.WAITING and info.source == "valkey" else None,
            mirror_url=reverse(f"{self.admin_site.name}:jobqueue_job_changelist") + f"?q={job_id}",
        )

    def flow_page(self, request: HttpRequest, queue: str, flow_id: str) -> HttpResponse:
        """A flow's jobs in order, a page at a time: each one's state, what it still waits
        for, its progress; the whole flow's counts by state."""
        number = _int(request.GET.get("page"), 1, 1, 10**9)
        access.require_view(request, queue)
        try:
            found = readmodels.flow_page(Queue(validate_queue(queue)), flow_id, number)
        except JobQueueError as exc:
            raise Http404(str(exc)) from None
        if not found.total or not access.visible_queues(request, sorted(found.queues)):
            # (a flow none of whose jobs the user may see: as if there were none)
            raise Http404(f"No flow {flow_id} in queue {queue!r} (or its jobs have expired).")
        graph = flowgraph.read(Queue(queue), flow_id) if found.number == 1 else None
        found, graph = veil.flow_errors(request, *veil.flow(request, found, graph))
        drawn = graph and graph.drawn and flowgraph.svg(
            graph, console_reverse(request, "jobqueue_job", "QUEUE", "JOBID"),
            console_reverse(request, "jobqueue_flow", queue, flow_id))
        return self.render(request, "flow.html", f"Flow {flow_id}", queue=queue, flow=found,
                            graph=drawn, too_large=graph is not None and not drawn,
                            max_drawn=flowgraph.MAX_DRAWN,
                            prev_page=found.number - 1 if found.number > 1 else None,
                            next_page=found.number + 1 if found.number < found.last else None)


def _pretty(value: Any) -> str:
    if value is None:
        return ""
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


def _int(raw: str | None, default: int, low: int, high: int) -> int:
    try:
        return min(max(int(raw or default), low), high)
    except ValueError:
        return default

