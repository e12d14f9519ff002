"""The console's search page and a bulk operation's page (`SearchPages`, which pages.py's
`Console` extends). The search's query is in the URL (query.py); it runs over the queues
`visible_queues` gives (search.py); a bulk action on what it matches is posts.py's
`BulkAction`, run by bulk.py. Arguments a queue hides are masked here unless the user may see
them, and a search by a hidden key is refused (hidden.py).
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode

from django.http import Http404, HttpRequest, HttpResponse

from ..exceptions import InvalidOption, JobQueueError
from ..models import BulkOperation
from ..records import JobInfo
from ..states import State
from . import actions, bulk, hidden, historyscan, sealed, search
from .query import Query
from .site import ConsoleSite

PER_PAGE = 50
ARGS_SHOWN = 160
"""Characters of a job's arguments a list of jobs shows."""


class SearchPages(ConsoleSite):
    """The search page and a bulk operation's progress page."""

    def checked_query(self, request: HttpRequest, params: Any) -> Query:
        """The query `params` ask for, refused (InvalidOption) when it searches by an argument
        the queues it may reach hide from this user."""
        query = Query.parse(params)
        if not hidden.may_see(request):
            scope = {query.queue} if query.queue else self.visible_queues(request)
            refused = query.hidden_terms(hidden.any_hidden(scope))
            if refused:
                raise InvalidOption(
                    f"{refused[0]} searches a hidden argument: that needs the {hidden.PERMISSION} permission"
                )
        return query

    def acting_queues(self, request: HttpRequest, query: Query) -> frozenset[str] | None:
        """The queues a bulk action on what `query` matches may reach for this user: those they
        may act on, narrowed to the query's queue (None: every queue; empty: none)."""
        mine = self.visible_queues(request, acting=True)
        return mine if mine is None or not query.queue else mine & {query.queue}

    def checked_bulk(self, request: HttpRequest, query: Query, scope: frozenset[str] | None) -> None:
        """InvalidOption when a bulk action on `query` would look for its text in arguments this
        user may not see: a bulk operation matches arguments whole, and its count would tell."""
        if hidden.may_see(request) or not (query.text or any(t.op == "~" for t in query.terms)):
            return
        hiding = hidden.any_hidden({query.queue} if query.queue else scope)
        if hiding:
            raise InvalidOption(
                f"a bulk action by plain text or ~ looks into arguments some of these queues hide "
                f"({', '.join(map(str, hiding))}): that needs the {hidden.PERMISSION} permission "
                f"(or name a queue that hides none, or use = terms)"
            )

    def search_page(self, request: HttpRequest) -> HttpResponse:
        """Live jobs or the history that match the query in the URL, a page at a time."""
        context: dict[str, Any] = {
            "form": {
                name: request.GET.get(name, "")
                for name in ("q", "queue", "state", "handler", "lane", "since", "until")
            },
            "where": request.GET.get("where", "live"),
            "states": State.values,
        }
        if not any(request.GET.get(name) for name in context["form"]):
            return self.render(request, "search.html", "Search jobs", **context)
        try:
            query = self.checked_query(request, request.GET)
            if query.where == "history":
                historyscan.Cursor.parse(request.GET.get("cursor", ""))
        except JobQueueError as exc:
            return self.render(request, "search.html", "Search jobs", status=400, error=str(exc), **context)
        scope = self.visible_queues(request)
        base = urlencode(query.raw)
        if query.where == "history":
            cursor = request.GET.get("cursor", "")
            found = historyscan.page(query, scope, hidden.may_see(request), cursor, PER_PAGE)
            jobs = [sealed.masked(row.info()) for row in found.jobs]
            context.update(
                scanned=found,
                next_url=f"?{base}&{urlencode({'cursor': found.next})}" if found.next else "",
                first_url=f"?{base}" if request.GET.get("cursor") else "",
            )
        else:
            page = search.live(
                query,
                scope,
                request.GET.get("cursor", ""),
                PER_PAGE,
                shown=lambda info: hidden.shown_payload(request, info.queue, info.payload),
            )
            jobs = page.jobs
            context.update(
                live=page,
                next_url=f"?{base}&{urlencode({'cursor': page.next})}" if page.next else "",
                first_url=f"?{base}" if request.GET.get("cursor") else "",
            )
        acting = self.acting_queues(request, query)
        try:
            self.checked_bulk(request, query, acting)
        except InvalidOption:
            acting = frozenset()  # (no bulk action offered)
        offered = [
            (action, bulk.VERBS[action])
            for (where, action), states in bulk.Bulk.STATES.items()
            if where == query.where
            and (not query.state or query.state in states)
            and request.user.has_perm(actions.PERMISSIONS[action])
            and acting != frozenset()
        ]
        return self.render(
            request,
            "search.html",
            f"Jobs matching {query.describe()[:80]}",
            search=query,
            rows=[(hidden.shown_errors(request, job), self.arguments(request, job)) for job in jobs],
            bulk_actions=offered,
            hidden_fields=sorted(query.raw.items()),
            **context,
        )

    def arguments(self, request: HttpRequest, job: JobInfo) -> str:
        """A job's arguments as this user may see them, cut short for a list."""
        payload = hidden.shown_payload(request, job.queue, job.payload)
        return arguments_text(payload)

    def bulk_page(self, request: HttpRequest, pk: int) -> HttpResponse:
        """A bulk operation's progress; one nobody runs any more (its runner died, its process
        restarted) is taken up again here, in a thread of this process."""
        operation = BulkOperation.objects.filter(pk=pk).first()
        if operation is None or not self.covers(request, operation.scope):
            raise Http404(f"No bulk operation #{pk}.")
        if bulk.stalled(operation):
            bulk.run_in_thread()
        work = bulk.Bulk.of_record(operation)
        query = work.query  # (its record holds what its maker searched: maybe hidden arguments)
        if not hidden.may_see(request):
            query = query.masked(hidden.any_hidden(operation.scope), hidden.MASK)
        return self.render(
            request,
            "bulk.html",
            f"Bulk {operation.action} #{operation.pk}",
            operation=operation,
            bulk=work,
            Status=BulkOperation.Status,
            shown_query=query,
            search_url="?" + urlencode(operation.query) if query is work.query else "",
            refresh=operation.status in bulk.UNDER_WAY,
            can_decide=request.user.has_perm(actions.PERMISSIONS[operation.action])
            and self.covers(request, operation.scope, acting=True),
        )


def arguments_text(payload: Any) -> str:
    if not isinstance(payload, dict):
        return ""
    shown = {name: payload[name] for name in ("args", "kwargs") if payload.get(name)}
    text = json.dumps(shown, ensure_ascii=False, default=str) if shown else ""
    return text if len(text) <= ARGS_SHOWN else text[:ARGS_SHOWN] + "…"

