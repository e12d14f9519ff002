"""How long every console page takes, in one run, at scale: 1,000,000 history rows (over 30 days,
5 queues, 50 handlers, 1,000 lanes, added to the charts' rollup as the mirror adds them) and
100,000 live jobs (20 queues × 5,000 waiting, 50 lanes each), beside a chord of 20,000 jobs,
1,000 running jobs of 64 KB and the dead jobs of a bulk retry (`--bulk`, 100,000). Each page is
timed in this process through Django's test client (server time: no network, no browser) against
500 ms (the median of its runs; the max is shown too), the bulk retry of every dead job against
60 s (its count, then its retries), and the charts again over a full rollup (what 10,000,000
jobs or more would fill). It ends with a table, PASS or MISS a line.

    .venv/bin/python bench/console.py --db mysql://root@127.0.0.1:3306/jq_bench_console
    .venv/bin/python bench/console.py --db postgres://postgres@127.0.0.1:5432/jq_bench_console
    .venv/bin/python bench/console.py --only charts --db postgres://postgres@127.0.0.1:5432/jq_bench_charts

The database is dropped and created again (`--history-db` is the old name of `--db`); without it
everything runs on a throwaway SQLite file. `--history-rows`, `--bulk`: smaller runs.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import console_data as data
from _common import django_setup, valkey

PAGE_MS = 500.0
BULK_S = 60.0
LIVE = "/admin/jobqueue/job/live"
RESULTS: list[tuple[str, float, float, float, str]] = []
"""(what, median, max, target, note) each, in the units the target is in."""


def timed(fn: Callable[[], Any], runs: int) -> tuple[float, float]:
    """(median, max) milliseconds of `runs` calls of `fn`."""
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times), max(times)


def page(client: Any, name: str, url: str, runs: int = 5, note: Callable[[bytes], str] | None = None) -> None:
    """Time a GET of `url` (it must answer 200) and record it against PAGE_MS."""
    response = client.get(url)
    assert response.status_code == 200, (url, response.status_code, response.content[-1000:])
    median, most = timed(lambda: client.get(url), runs)
    said = note(response.content) if note else ""
    RESULTS.append((name, median, most, PAGE_MS, said))
    print(f"  {name:<58} median {median:8.1f} ms   max {most:8.1f} ms   {said}", flush=True)


def live_pages(client: Any, waiting: str, flow_id: str, history_id: str) -> None:
    print("\nlive pages")
    page(client, "dashboard (20 queues, 100,000 waiting)", f"{LIVE}/")
    page(client, "queue page (page 90 of pending)", f"{LIVE}/queues/queue-07/?state=pending&page=90")
    page(client, "job page (a waiting job)", f"{LIVE}/jobs/queue-07/{waiting}/")
    page(client, "job page (a history row)", f"{LIVE}/jobs/q0/{history_id}/")
    page(client, f"flow page 1 (a chord of {data.FLOW_JOBS:,})", f"{LIVE}/flows/default/{flow_id}/")
    page(client, "flow page 401 (its callback)", f"{LIVE}/flows/default/{flow_id}/?page=401")
    page(client, "stuck page (1,000 running jobs of 64 KB)", f"{LIVE}/stuck/?running_over=1")
    page(client, "workers page", f"{LIVE}/workers/")
    page(client, "schedules list", f"{LIVE}/schedules/")
    page(client, "enqueue form", f"{LIVE}/enqueue/")


def history_pages(client: Any, rows: int, history_id: str) -> None:
    print(f"\nhistory pages ({rows:,} rows)")
    page(client, "history list (admin changelist)", "/admin/jobqueue/job/")
    page(client, "history list, one queue and state",
         "/admin/jobqueue/job/?queue=q1&state__exact=dead")
    page(client, "history row (admin change page)", f"/admin/jobqueue/job/{history_id}/change/")


def charts(client: Any, label: str) -> None:
    print(f"\ncharts, {label}")
    for span in ("hour", "day", "week", "month"):
        page(client, f"charts {span} ({label})", f"{LIVE}/charts/?range={span}")
    page(client, f"charts month, one queue ({label})", f"{LIVE}/charts/?range=month&queue=q1")
    page(client, f"charts day, one handler ({label})",
         f"{LIVE}/charts/?range=day&queue=q1&handler=app.jobs.h1")


def searched(content: bytes) -> str:
    """What a search page found: its rows, the rows it read, and whether it stopped short."""
    text = content.decode()
    found = f"{text.count('<tr data-job=')} found"
    read = re.search(r"([0-9]+) (?:job|history) rows read", text)
    return found + (f", {int(read[1]):,} rows read" if read else "") + (
        ", cut short" if 'id="search-cut"' in text else "")


def searches(client: Any, rows: int) -> None:
    base = f"{LIVE}/search/?"
    old, recent = rows - 7, 12_345
    print(f"\nsearch, history ({rows:,} rows) and live (100,000 waiting)")
    for name, query in (
        ("history: handler + argument equals",
         f"where=history&handler=app.jobs.h7&q=args.0%3D{old - old % 50 + 7}"),
        ("history: state + contains", "where=history&state=dead&q=kwargs.email~user9999"),
        ("history: lane + plain text", "where=history&lane=tenant-345&q=city-45"),
        ("history: one hour + argument equals",
         "where=history&since={since}&until={until}&q=kwargs.order.id%3D{id}"),
        ("history: argument equals, recent match", f"where=history&q=kwargs.order.id%3D{recent}"),
        ("history: argument equals, oldest row", f"where=history&q=args.0%3D{old}"),
        ("history: argument equals, no match", "where=history&q=args.0%3D-1"),
        ("history: contains", "where=history&q=kwargs.email~user99999%40"),
        ("history: plain text (a unique key)", "where=history&q=order-99"),
        ("history: plain text, no match", "where=history&q=nothing-matches"),
        ("live: a handler, every queue", "handler=x"),
        ("live: argument equals, no match (stops short)", "q=args.0%3D-1"),
        ("live: argument contains, no match (stops short)", "q=args.0~zz"),
        ("live: plain text, no match (stops short)", "q=nothing-matches"),
        ("live: one queue + argument equals", "queue=queue-07&q=args.0%3D4999"),
        ("live: queue, state, lane + plain text", "queue=queue-07&state=pending&lane=t7&q=4957"),
    ):
        query = query.format(**_hour_ago(rows))
        page(client, f"search {name}", base + query, runs=3, note=searched)


def _hour_ago(rows: int) -> dict[str, Any]:
    """A one-hour window a day back, and a row inside it."""
    now = datetime.now(UTC)
    since = now - timedelta(days=1)
    n = int(86_400 * rows / data.SPAN) - 100
    until = since + timedelta(hours=1)
    return {"since": since.strftime("%Y-%m-%dT%H:%M"), "until": until.strftime("%Y-%m-%dT%H:%M"), "id": n}


def bulk_retry(client: Any, count: int, user: Any) -> None:
    """A bulk retry of every dead job of queue bulk: the count its confirmation shows, its
    confirmation page, then the retries."""
    from jobqueue.console import bulk
    from jobqueue.console.query import Query

    print(f"\nbulk retry of {count:,} dead jobs (queue bulk)")
    work = bulk.Bulk.of("retry", Query.parse({"queue": "bulk", "q": "kwargs.tenant=a"}), None)
    operation = work.start(user)
    started = time.perf_counter()
    bulk.Runner().run()  # the count its page shows, to be confirmed
    counted = time.perf_counter() - started
    page(client, f"bulk confirm page ({count:,} counted)", f"{LIVE}/bulk/{operation.pk}/")
    operation.refresh_from_db()
    assert bulk.Bulk.confirm(operation, user)
    started = time.perf_counter()
    bulk.Runner().run()
    ran = time.perf_counter() - started
    operation.refresh_from_db()
    assert (operation.total, operation.done) == (count, count), operation
    RESULTS.append((f"bulk retry of {count:,} dead jobs: count + retries (s)", counted + ran, counted + ran,
                    BULK_S, f"count {counted:.1f} s, retries {ran:.1f} s ({count / ran:,.0f} jobs/s)"))
    print(f"  the count: {counted:.2f} s; the retries: {ran:.2f} s ({count / ran:,.0f} jobs/s)")


def table() -> None:
    print("\n| what | median | max | target | result | note |\n|---|---:|---:|---:|---|---|")
    for name, median, most, target, note in RESULTS:
        unit = " s" if target == BULK_S else " ms"
        verdict = "PASS" if median < target else "**MISS**"
        print(f"| {name} | {median:,.1f}{unit} | {most:,.1f}{unit} | {target:,.0f}{unit} | {verdict} "
              f"| {note} |")
    missed = sum(median >= target for _, median, _, target, _ in RESULTS)
    print(f"\n{len(RESULTS) - missed} of {len(RESULTS)} within their targets (each page by the median "
          "of its runs)")


def analyzed() -> float:
    """Statistics of the history gathered, as a database that has run a while has them (a
    planner that knows only the first rows of a bulk load chose a full scan for a chunk's edge
    on PostgreSQL); the seconds it took."""
    from django.db import connection

    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute({"mysql": "ANALYZE TABLE jobqueue_job", "postgresql": "ANALYZE jobqueue_job"}.get(
            connection.vendor, "ANALYZE"))
        if connection.vendor == "mysql":
            cursor.fetchall()
    return time.perf_counter() - started


def prepare(url: str | None, tmp: str) -> str:
    if not url:
        return f"sqlite:///{tmp}/bench.sqlite3"
    name = url.rsplit("/", 1)[1]
    if url.startswith("postgres"):
        subprocess.run(["psql", "-h127.0.0.1", "-Upostgres", "-qc", f"DROP DATABASE IF EXISTS {name}",
                        "-c", f"CREATE DATABASE {name}"], check=True)
    else:
        subprocess.run(["mysql", "-uroot", "-h127.0.0.1", "-e", f"DROP DATABASE IF EXISTS {name}; "
                        f"CREATE DATABASE {name} CHARACTER SET utf8mb4"], check=True)
    return url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", "--history-db", dest="db", help="a MySQL/MariaDB or PostgreSQL URL (its "
                        "database dropped first); default: a throwaway SQLite file")
    parser.add_argument("--only", choices=["charts"], help="measure the history charts only")
    parser.add_argument("--history-rows", type=int, default=1_000_000)
    parser.add_argument("--bulk", type=int, default=100_000, help="dead jobs a bulk retry retries")
    args = parser.parse_args()
    with valkey() as url, tempfile.TemporaryDirectory() as tmp:
        os.environ["DJANGO_ALLOWED_HOSTS"] = "testserver"
        django_setup(url, prepare(args.db, tmp))
        from django.contrib.auth.models import User
        from django.core.management import call_command
        from django.db import connection
        from django.test import Client

        call_command("migrate", verbosity=0)
        user = User.objects.create_superuser("bench", "b@example.com", "pw")
        client = Client()
        client.login(username="bench", password="pw")
        print(f"(rough numbers: one run on a shared machine; {connection.vendor})", flush=True)
        started = time.perf_counter()
        took = data.build_history(args.history_rows, datetime.now(UTC))
        print(f"{args.history_rows:,} history rows written (and added to the rollup) in {took:.0f} s; "
              f"ANALYZE in {analyzed():.1f} s", flush=True)
        if args.only != "charts":
            built = time.perf_counter()
            waiting = data.build_waiting()
            flow_id = data.build_flow()
            data.build_stuck()
            data.build_dead(args.bulk)
            print(f"live jobs built in {time.perf_counter() - built:.0f} s", flush=True)
            history_id = f"JOB0{args.history_rows // 2:010d}"
            live_pages(client, waiting, flow_id, history_id)
            history_pages(client, args.history_rows, history_id)
            searches(client, args.history_rows)
            bulk_retry(client, args.bulk, user)
        charts(client, f"rollup of the {args.history_rows:,} rows")
        from jobqueue.models import Rollup

        Rollup.objects.all().delete()
        filled = time.perf_counter()
        written = data.filled_rollup(datetime.now(UTC))
        print(f"\nthe full rollup: {written:,} rows in {time.perf_counter() - filled:.0f} s")
        charts(client, "full rollup")
        print(f"\nthe whole run: {time.perf_counter() - started:.0f} s")
        table()


if __name__ == "__main__":
    main()
