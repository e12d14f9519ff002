"""Prometheus metrics, read from Valkey at each scrape: every worker's work is counted there (in
each shard's `meta` and `hist` hashes, by the same scripts that record it), so any web process
reports the whole fleet.

    path("metrics", jobqueue.metrics.view)    # open, unless JOBQUEUE["METRICS_TOKEN"] is set

- `jobqueue_jobs{queue,state}` — jobs by state now (gauge; `Queue.counts()`);
- `jobqueue_oldest_wait_seconds{queue}` — the longest wait among ready jobs (gauge);
- `jobqueue_jobs_finished_total{queue,outcome}` — runs recorded: `succeeded`, `failed` (to be
  retried), `dead`, `cancelled`, and jobs that `expired` before they started (counter);
- `jobqueue_job_duration_seconds{queue}` — run time of recorded runs (histogram);
- `jobqueue_rate_limit_tokens{queue}` — jobs a rate-limited queue would admit now (gauge);
- `jobqueue_lane_active{queue,lane}` — running jobs that hold a slot of their lane's cap, for
  the LANE_TOP busiest lanes of each queue only (gauge; bounded cardinality);
- `jobqueue_worker_recycles_total{reason}` — worker processes that made way for a fresh one
  (`runworker --max-jobs`: `max_jobs`, `--max-memory`: `max_memory`) (counter);
- `jobqueue_overrunning_runs{worker}` — runs of plain handlers past their `timeout` whose threads
  have not returned: recorded failed, each still holding a slot of its worker (gauge; from the
  workers' presence entries, `{emq}:workers`, which the worker's presence.py writes);
- `jobqueue_global_concurrency{queue}` — the global cap in force, and
  `jobqueue_global_permits{queue}` — its permits held now (what runs or is about to, over every
  worker), for queues with a cap only (gauges).
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Iterator
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.views.decorators.debug import sensitive_variables
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ..conf import get_client, get_config
from ..engine import backlog, lanes, layouts, permits
from ..engine.store import Queue, known_queues
from ..keys import RECYCLE_REASONS, RECYCLES_KEY, WORKERS_KEY
from ..states import State

OUTCOMES = ("succeeded", "failed", "dead", "cancelled", "expired")
LANE_TOP = 10
"""Lanes per queue that `jobqueue_lane_active` reports (the busiest): one series per tenant of a
large fleet would swamp Prometheus."""
BUCKETS_MS = (5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 300000)
"""The histogram's upper bounds in ms: the same list as DURATION_BUCKETS in _counters.lua."""


class ValkeyCollector:
    """Collects every known queue's figures from Valkey at scrape time."""

    def collect(self) -> Iterator[Any]:
        jobs = GaugeMetricFamily("jobqueue_jobs", "Jobs by state now", labels=["queue", "state"])
        oldest = GaugeMetricFamily("jobqueue_oldest_wait_seconds",
                                   "The longest wait among ready jobs", labels=["queue"])
        finished = CounterMetricFamily("jobqueue_jobs_finished", "Runs recorded, by outcome",
                                       labels=["queue", "outcome"])
        duration = HistogramMetricFamily("jobqueue_job_duration_seconds",
                                         "Run time of recorded runs", labels=["queue"])
        tokens = GaugeMetricFamily("jobqueue_rate_limit_tokens",
                                   "Jobs a rate-limited queue would admit now", labels=["queue"])
        lane_active = GaugeMetricFamily("jobqueue_lane_active",
                                        "Running jobs holding a slot of their lane's cap "
                                        "(the busiest lanes)", labels=["queue", "lane"])
        shards = GaugeMetricFamily("jobqueue_shards", "Shards of a queue by status",
                                   labels=["queue", "status"])
        global_cap = GaugeMetricFamily("jobqueue_global_concurrency",
                                       "The queue's global cap in force", labels=["queue"])
        global_permits = GaugeMetricFamily("jobqueue_global_permits",
                                           "Permits of the queue's global cap held now",
                                           labels=["queue"])
        resizes = CounterMetricFamily("jobqueue_shard_resizes",
                                      "Live resizes (by hand or automatic)",
                                      labels=["queue", "direction"])
        counted = {field: int(n) for field, n in
                   get_client().hgetall(layouts.RESIZES_KEY).items()}
        for name in known_queues():
            queue = Queue(name)
            layout = queue.layout(fresh=True)
            for status in ("active", "draining", "retired"):
                shards.add_metric([name, status],
                                  sum(layout.status(i) == status for i in range(layout.widest)))
            for direction in ("grow", "shrink"):
                resizes.add_metric([name, direction], counted.get(f"{name}:{direction}", 0))
            for state, count in queue.counts().items():
                if state in State.values:
                    jobs.add_metric([name, str(state)], count)
            wait = backlog.oldest_wait(queue)
            oldest.add_metric([name], wait or 0.0)
            totals = dict.fromkeys(OUTCOMES, 0)
            buckets = dict.fromkeys([*map(str, BUCKETS_MS), "+Inf"], 0)
            total_ms = 0
            for index in range(queue.all_shards()):
                meta = queue.client.hmget(queue.shard(index).key("meta"),
                                          [f"n_{o}" for o in OUTCOMES])
                for outcome, value in zip(OUTCOMES, meta, strict=True):
                    totals[outcome] += int(value or 0)
                hist = queue.client.hgetall(queue.shard(index).key("hist"))
                for le in buckets:
                    buckets[le] += int(hist.get(le) or 0)
                total_ms += int(hist.get("sum_ms") or 0)
            for outcome, value in totals.items():
                finished.add_metric([name, outcome], value)
            cumulative, running = [], 0
            for le, count in buckets.items():
                running += count
                bound = "+Inf" if le == "+Inf" else str(int(le) / 1000)
                cumulative.append((bound, running))
            duration.add_metric([name], cumulative, total_ms / 1000)
            level = backlog.bucket_level(queue, backlog.server_ms(queue))
            if level is not None:
                tokens.add_metric([name], level)
            for lane, active in lanes.busiest(queue.client, name, queue.all_shards(), LANE_TOP):
                lane_active.add_metric([name, lane], active)
            cap = permits.state(queue.client, name, queue.options)
            if cap.cap is not None:
                global_cap.add_metric([name], cap.cap)
                global_permits.add_metric([name], cap.held)
        yield from (jobs, oldest, finished, duration, tokens, lane_active, shards, resizes,
                    global_cap, global_permits, overrunning_runs(), _recycles())


def overrunning_runs() -> GaugeMetricFamily:
    """Each live worker's overrunning runs, as its last presence entry says."""
    gauge = GaugeMetricFamily("jobqueue_overrunning_runs", "Runs past their timeout whose "
                              "threads have not returned (each holds a slot)", labels=["worker"])
    for raw in get_client().hvals(WORKERS_KEY):
        try:
            entry = json.loads(raw)
            gauge.add_metric([str(entry["name"])], int(entry.get("overrunning") or 0))
        except (ValueError, KeyError, TypeError):
            continue
    return gauge


def _recycles() -> CounterMetricFamily:
    """Worker recycles by reason, as the recycling workers counted them (`presence.recycled`)."""
    recycles = CounterMetricFamily("jobqueue_worker_recycles",
                                   "Worker processes that made way for a fresh one",
                                   labels=["reason"])
    counted = get_client().hmget(RECYCLES_KEY, RECYCLE_REASONS)
    for reason, value in zip(RECYCLE_REASONS, counted, strict=True):
        recycles.add_metric([reason], int(value or 0))
    return recycles


@sensitive_variables("token")
def view(request: HttpRequest) -> HttpResponse:
    """Prometheus' text format; with METRICS_TOKEN set, only for `Authorization: Bearer <token>`."""
    token = get_config().metrics_token
    if token and not _bears(request.headers.get("Authorization", ""), token):
        return HttpResponse("metrics: a bearer token is required\n", status=401,
                            content_type="text/plain")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ValkeyCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)


@sensitive_variables("token")
def _bears(header: str, token: str) -> bool:
    """Whether an Authorization header is `Bearer <token>`, compared in constant time as bytes:
    the header as the client sent it (WSGI and ASGI hand header bytes over as Latin-1 text),
    the token as UTF-8. `compare_digest` refuses text outside ASCII, which anyone can send."""
    try:
        sent = header.encode("latin-1")
    except UnicodeEncodeError:  # (no server hands such text over; a test client may)
        return False
    return hmac.compare_digest(sent, f"Bearer {token}".encode())
