"""What a page shows of the jobs of a queue the user may not see, where it cannot leave them out:
a flow may span queues, and a job may wait for jobs of other queues; and of the hidden arguments
a flow's errors quote (`flow_errors`: hidden.py decides what is hidden).

Such a job keeps its place in its flow, its state and how many jobs it waits for (the flow's
counts tell as much); its id, queue, handler, arguments, result, progress, errors, and the ids
it waits for are veiled. A list of the ids a job waits for leaves those of such jobs out (they
count among "and N more"). Which queues a user may see is access.py's decision; this module
asks it and changes nothing else.
"""

from __future__ import annotations

from dataclasses import replace

from django.http import HttpRequest

from ..records import JobInfo
from . import access, flowgraph, hidden, readmodels

LABEL = "(a queue you may not see)"


def waits(request: HttpRequest, found: readmodels.Waits) -> readmodels.Waits:
    """`found` without the ids of jobs on queues the user may not see (and, unless they see
    every queue, of jobs found on none: their queue is unknown)."""
    every = access.scope(request).unrestricted()
    kept = [(job_id, queue) for job_id, queue in found.shown
            if (access.may_view(request, queue) if queue else every)]
    if len(kept) == len(found.ids):
        return found
    return replace(found, ids=tuple(i for i, _ in kept), queues=tuple(q for _, q in kept))


def job(info: JobInfo) -> JobInfo:
    """A job of a queue the user may not see, as a flow's list shows it: its state alone."""
    return replace(info, id="", queue="", payload=None, result=None, last_error="",
                   checkpoint=None, progress=None, history=(), unique_key=None, lane=None,
                   worker="", batch=None)


def flow(request: HttpRequest, found: readmodels.FlowPage, graph: flowgraph.Graph | None
         ) -> tuple[readmodels.FlowPage, flowgraph.Graph | None]:
    """A flow's page and graph as this user may see them."""
    hidden = {name for name in found.queues if not access.may_view(request, name)}
    if not hidden:
        return found, graph
    jobs = [(at, job(row), readmodels.Waits(w.count)) if row.queue in hidden
            else (at, row, waits(request, w)) for at, row, w in found.jobs]
    callback = found.callback
    if callback is not None and callback.queue in hidden:
        callback = job(callback)
    return replace(found, jobs=jobs, callback=callback), _graph(graph, hidden)


def _graph(graph: flowgraph.Graph | None, hidden: set[str]) -> flowgraph.Graph | None:
    """The graph with each box of a hidden queue's job keyed by its place, not its id."""
    if graph is None:
        return None
    keys = {box.key: f"veiled{box.position}" for box in graph.nodes
            if box.members == 1 and box.queue in hidden}
    nodes = [replace(box, key=keys[box.key], queue="", handler=LABEL, error="")
             if box.key in keys and box.members == 1 else box for box in graph.nodes]
    edges = {(keys.get(a, a), keys.get(b, b)) for a, b in graph.edges}
    return replace(graph, nodes=nodes, edges=edges)


def flow_errors(request: HttpRequest, found: readmodels.FlowPage, graph: flowgraph.Graph | None
                ) -> tuple[readmodels.FlowPage, flowgraph.Graph | None]:
    """A flow's page and graph with the hidden arguments their errors quote masked, unless the
    user may see hidden arguments."""
    if hidden.may_see(request):
        return found, graph
    jobs = [(at, hidden.shown_errors(request, row), w) for at, row, w in found.jobs]
    if graph is not None:
        graph = replace(graph, nodes=[replace(box, error=hidden.mask_text(box.error, list(box.quoted)))
                                      if box.quoted else box for box in graph.nodes])
    return replace(found, jobs=jobs), graph
