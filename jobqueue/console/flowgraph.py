"""A flow drawn as its graph: read from Valkey (`read`), laid out in layers (`layout`), drawn
as an inline SVG (`svg`) on the flow page; no script, no CDN, so it works offline and with
JavaScript off.

Each job of a flow is a node, colored by its state, labelled with its handler and what it still
waits for, linking to its page; an edge runs from a member to the job waiting for it (each
member's row lists its `dependents`). A node's layer is its depth: the longest path from a job
that waits for nothing. Siblings (same layer, same members waited for, same jobs waiting for
them) more than COLLAPSE_OVER are drawn as one node, "1,000 jobs: 990 succeeded, 10 dead",
linking to the flow's paged list, so a chord of thousands draws as two boxes. A flow of more
than MAX_DRAWN jobs (or MAX_EDGES edges) is not drawn (its list pages it).

Reads Valkey through the flow's `:flow:<id>` / `:deps:<id>` keys and rows only, on every queue
the flow spans (`flows.members.spots`).
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from .. import ids
from ..engine.store import Queue
from ..flows.members import spots as flow_spots
from ..states import State
from . import hidden, sealed
from .errors import last_line
from .readmodels import FLOW_PAGE

MAX_DRAWN = 2_000
"""The largest flow drawn: its rows' states and edges are read in one pipeline."""
MAX_EDGES = 50_000
"""The most edges read before a flow is deemed too large to draw (a group waiting for a group
has as many as the product of their sizes)."""
COLLAPSE_OVER = 8
"""Siblings beyond this many are drawn as one node."""
COLORS: dict[str, str] = {State.PENDING: "#79aec8", State.SCHEDULED: "#c7b8e6", State.ACTIVE: "#f2c46d",
                         State.WAITING: "#e4e4e4", State.SUCCEEDED: "#93cf93", State.DEAD: "#e68a8a",
                         State.CANCELLED: "#c4c4c4", State.EXPIRED: "#dba3a3"}
WIDTH, HEIGHT, GAP_X, GAP_Y, PAD = 190, 40, 56, 12, 8


@dataclass
class Box:
    """One box: a job, or `members` siblings drawn as one."""

    key: str
    """The job's id, or the first member's id for a collapsed group."""
    position: int
    state: str = ""
    queue: str = ""
    """The queue the job is on (a flow may span several)."""
    handler: str = ""
    waits: int = 0
    error: str = ""
    quoted: tuple[str, ...] = ()
    """The values its queue hides among its arguments (`hidden.values`): masked in its error
    for a user who may not see them."""
    members: int = 1
    states: Counter[str] = field(default_factory=Counter)
    layer: int = 0
    x: int = 0
    y: int = 0


@dataclass
class Graph:
    nodes: list[Box]
    edges: set[tuple[str, str]]
    total: int
    """How many jobs the flow has (drawn or not)."""

    @property
    def drawn(self) -> bool:
        return bool(self.nodes)


def read(queue: Queue, flow_id: str) -> Graph:
    """The flow's jobs and edges, from every queue it spans, in a few pipelines (nothing drawn
    past MAX_DRAWN jobs)."""
    ids.validate_job_id(flow_id)
    spots = flow_spots(queue)
    keys = [q.shard(index).key(f"flow:{flow_id}") for q, index in spots]
    pipe = queue.client.pipeline(transaction=False)
    for key in keys:
        pipe.zcard(key)
    sizes = [int(n) for n in pipe.execute()]
    total = sum(sizes)
    if not total or total > MAX_DRAWN:
        return Graph([], set(), total)
    pipe = queue.client.pipeline(transaction=False)
    held = [at for at, size in enumerate(sizes) if size]
    for at in held:
        pipe.zrange(keys[at], 0, -1, withscores=True)
    placed = sorted((int(position), at, job_id) for at, found in zip(held, pipe.execute(),
                                                                     strict=True)
                    for job_id, position in found)
    pipe = queue.client.pipeline(transaction=False)
    for _, at, job_id in placed:
        q, index = spots[at]
        pipe.hmget(q.shard(index).job(job_id), "state", "dependents")
    rows = pipe.execute()
    nodes: dict[str, Box] = {}
    edges: set[tuple[str, str]] = set()
    spot_of: dict[str, tuple[Queue, int]] = {}
    for (position, at, job_id), (state, dependents) in zip(placed, rows, strict=True):
        if state is None:
            continue  # (its row expired)
        nodes[job_id] = Box(job_id, position, state, queue=spots[at][0].name)
        spot_of[job_id] = spots[at]
        for edge in (dependents or "").split():
            edges.add((job_id, edge.split(":", 1)[0]))
        if len(edges) > MAX_EDGES:
            return Graph([], set(), total)
    edges = {(a, b) for a, b in edges if b in nodes}
    return Graph(_collapse(nodes, edges, queue, spot_of), _edges_between(nodes, edges), total)


def _collapse(nodes: dict[str, Box], edges: set[tuple[str, str]], queue: Queue,
              spot_of: dict[str, tuple[Queue, int]]) -> list[Box]:
    """Layer the jobs, fold large sibling sets into one node each, and read what the boxes
    drawn one per job show (handler, what a waiting job waits for, last error)."""
    before, after = defaultdict(set), defaultdict(set)
    for a, b in edges:
        before[b].add(a)
        after[a].add(b)
    _layers(nodes, before, after)
    siblings: dict[tuple[int, frozenset[str], frozenset[str]], list[Box]] = defaultdict(list)
    for node in nodes.values():
        siblings[(node.layer, frozenset(before[node.key]), frozenset(after[node.key]))].append(node)
    shown: list[Box] = []
    for found in siblings.values():
        if len(found) > COLLAPSE_OVER:
            first = min(found, key=lambda n: n.position)
            group = Box(first.key, first.position, members=len(found),
                         states=Counter(n.state for n in found), layer=first.layer)
            for node in found:
                node.key = group.key  # (its edges now end at the group)
            shown.append(group)
        else:
            shown.extend(found)
    _details(queue, [n for n in shown if n.members == 1], spot_of)
    return sorted(shown, key=lambda n: (n.layer, n.position))


def _layers(nodes: dict[str, Box], before: dict[str, set[str]], after: dict[str, set[str]]
            ) -> None:
    """Each node's layer: the longest path to it from a job waiting for nothing (in
    topological order, so a chain of thousands costs one pass)."""
    left = {key: len(before[key]) for key in nodes}
    ready = [key for key, count in left.items() if not count]
    while ready:
        key = ready.pop()
        for dependent in after[key]:
            nodes[dependent].layer = max(nodes[dependent].layer, nodes[key].layer + 1)
            left[dependent] -= 1
            if not left[dependent]:
                ready.append(dependent)


def _edges_between(nodes: dict[str, Box], edges: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """The edges between the boxes drawn (a group's members' edges end at the group)."""
    return {(nodes[a].key, nodes[b].key) for a, b in edges}


def _details(queue: Queue, shown: list[Box], spot_of: dict[str, tuple[Queue, int]]) -> None:
    pipe = queue.client.pipeline(transaction=False)
    for node in shown:
        q, index = spot_of[node.key]
        shard = q.shard(index)
        pipe.hmget(shard.job(node.key), "payload", "last_error").scard(shard.key(f"deps:{node.key}"))
    replies = pipe.execute()
    for node, (payload, error), waits in zip(shown, replies[0::2], replies[1::2], strict=True):
        try:
            body = json.loads(payload or "{}")
            node.handler = str(body.get("handler", ""))
        except (ValueError, AttributeError):
            node.handler, body = "?", None
        if error:
            node.quoted = tuple(hidden.values(body, hidden.hidden_for(node.queue)))
        node.waits = int(waits) if node.state == State.WAITING else 0
        node.error = sealed.label(error or "")  # (a sealed error is never opened here)


def layout(graph: Graph) -> tuple[int, int]:
    """Place the nodes: a column per layer, left to right, each column's boxes top to bottom in
    the flow's order; the drawing's (width, height)."""
    rows: Counter[int] = Counter()
    for node in graph.nodes:
        node.x = PAD + node.layer * (WIDTH + GAP_X)
        node.y = PAD + rows[node.layer] * (HEIGHT + GAP_Y)
        rows[node.layer] += 1
    layers = max((n.layer for n in graph.nodes), default=0) + 1
    return (2 * PAD + layers * WIDTH + (layers - 1) * GAP_X,
            2 * PAD + max(rows.values(), default=1) * (HEIGHT + GAP_Y) - GAP_Y)


def svg(graph: Graph, job_url: str, list_url: str) -> SafeString:
    """The graph as an inline SVG: `job_url` with "QUEUE" and "JOBID" in place of a job's queue
    and id, `list_url` the flow's paged list."""
    width, height = layout(graph)
    at = {n.key: n for n in graph.nodes}
    lines = format_html_join("", '<line class="jq-edge" x1="{}" y1="{}" x2="{}" y2="{}" '
                                 'marker-end="url(#jq-arrow)"/>',
                             ((at[a].x + WIDTH, at[a].y + HEIGHT // 2, at[b].x - 2,
                               at[b].y + HEIGHT // 2) for a, b in sorted(graph.edges)))
    boxes = format_html_join("", "{}", ((_box(n, job_url, list_url),)
                                        for n in graph.nodes))
    return format_html(
        '<svg class="jq-flow" role="img" aria-label="the flow as a graph" width="{}" height="{}" '
        'viewBox="0 0 {} {}" xmlns="http://www.w3.org/2000/svg" font-size="11">'
        '<defs><marker id="jq-arrow" viewBox="0 0 8 8" refX="8" refY="4" markerWidth="7" '
        'markerHeight="7" orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="#888"/></marker></defs>'
        '<g stroke="#888" stroke-width="1.2">{}</g>{}</svg>',
        width, height, width, height, lines, boxes)


def _box(node: Box, job_url: str, list_url: str) -> SafeString:
    if node.members > 1:
        counts = ", ".join(f"{n:,} {state}" for state, n in node.states.most_common())
        state = node.states.most_common(1)[0][0]
        page = (node.position - 1) // FLOW_PAGE + 1
        return format_html(
            '<a href="{}?page={}#flow-jobs"><g class="jq-node jq-group" data-members="{}" '
            'data-state="{}"><title>{}</title><rect x="{}" y="{}" width="{}" height="{}" rx="5" '
            'fill="{}" stroke="#555" stroke-dasharray="4 2"/><text x="{}" y="{}" '
            'font-weight="bold">{} jobs</text><text x="{}" y="{}">{}</text></g></a>',
            list_url, page, node.members, state, f"{node.members:,} jobs: {counts}",
            node.x, node.y, WIDTH, HEIGHT, COLORS.get(state, "#eee"), node.x + 6, node.y + 15,
            f"{node.members:,}", node.x + 6, node.y + 31, _cut(counts, 32))
    doing = f"waits for {node.waits}" if node.waits else node.state
    error = last_line(node.error) if node.error else ""
    if not node.queue:  # (a job of a queue the user may not see: console/veil.py)
        return format_html(
            '<g class="jq-node jq-veiled" data-state="{}"><title>{}</title>'
            '<rect x="{}" y="{}" width="{}" height="{}" rx="5" fill="{}" stroke="#555"/>'
            '<text x="{}" y="{}" font-weight="bold">{}</text><text x="{}" y="{}">{}</text></g>',
            node.state, f"{node.handler} · {doing}", node.x, node.y, WIDTH, HEIGHT,
            COLORS.get(node.state, "#eee"), node.x + 6, node.y + 15, _cut(node.handler, 28),
            node.x + 6, node.y + 31, _cut(doing, 32))
    return format_html(
        '<a href="{}"><g class="jq-node" data-job="{}" data-state="{}"><title>{}</title>'
        '<rect x="{}" y="{}" width="{}" height="{}" rx="5" fill="{}" stroke="#555"/>'
        '<text x="{}" y="{}" font-weight="bold">{}</text><text x="{}" y="{}">{}</text></g></a>',
        job_url.replace("QUEUE", node.queue, 1).replace("JOBID", node.key), node.key, node.state,
        f"{node.key} · {node.handler} · {doing}" + (f" · {error}" if error else ""),
        node.x, node.y, WIDTH, HEIGHT, COLORS.get(node.state, "#eee"),
        node.x + 6, node.y + 15, _cut(node.handler.rsplit(".", 1)[-1] or node.key, 28),
        node.x + 6, node.y + 31, _cut(doing + (f" · {error}" if error else ""), 32))


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
