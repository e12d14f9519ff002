"""How long the console's pages take: the dashboard with 20 queues and 100,000 waiting jobs, a
flow of 20,000 jobs, the stuck page over 1,000 running jobs of 64 KB, the history charts (their
rollup built from 1,000,000 finished jobs, then filled as 10,000,000 or more would fill it: every
minute and hour of 30 days for 100 queue × handler pairs), the console's search over the live
jobs and a bulk retry of every dead job of a queue (`--bulk N` of them), and (with --history-db)
the history search at 300,000 rows, before and after its indexes.

    .venv/bin/python bench/console.py
    .venv/bin/python bench/console.py --history-db mysql://root@127.0.0.1:3306/jq_bench_console
    .venv/bin/python bench/console.py --only charts --history-db postgres://postgres@127.0.0.1:5432/jq_bench_charts

The history database is dropped and created again (MySQL/MariaDB); without it everything runs on
a throwaway SQLite file and the search is not measured.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from _common import django_setup, valkey

HISTORY_ROWS = 300_000
FLOW_JOBS = 20_000
STUCK_JOBS, STUCK_PAYLOAD = 1_000, 64 * 1024


def timed(fn: Callable[[], Any], runs: int) -> tuple[float, float]:
    """(median, max) milliseconds of `runs` calls of `fn`."""
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times), max(times)


def show(name: str, times: tuple[float, float], note: str = "") -> None:
    print(f"  {name:<44} median {times[0]:8.1f} ms   max {times[1]:8.1f} ms   {note}")


def dashboard(client: Any) -> None:
    from jobqueue import Queue
    from jobqueue.spec import JobSpec

    for n in range(20):
        specs = [JobSpec({"handler": "x", "args": [i], "kwargs": {}}, lane=f"t{i % 50}")
                 for i in range(5_000)]
        Queue(f"queue-{n:02d}").enqueue_many(specs)
    print("\nadmin console, 20 queues × 5,000 waiting jobs (100,000), 50 lanes each")

    def page() -> None:
        response = client.get("/admin/jobqueue/job/live/")
        assert response.status_code == 200 and response.content.count(b"jq-card") >= 20

    show("dashboard", timed(page, 15))
    show("queue page (page 90 of pending)", timed(
        lambda: client.get("/admin/jobqueue/job/live/queues/queue-07/?state=pending&page=90"), 10))


def flow(client: Any, sent: Callable[[], int]) -> None:
    from jobqueue import chord, flows
    from project.demo.jobs import send_welcome_email

    ref = chord([send_welcome_email.s(i) for i in range(FLOW_JOBS)], send_welcome_email.s()).enqueue()
    base = "/admin/jobqueue/job/live"
    print(f"\na chord of {FLOW_JOBS:,} jobs and its callback (every job waiting or pending)")
    for name, url in (("flow page 1", f"{base}/flows/default/{ref.id}/"),
                      ("flow page 401 (the last)", f"{base}/flows/default/{ref.id}/?page=401"),
                      ("the callback's job page", f"{base}/jobs/default/{ref.id}/")):
        times = timed(lambda url=url: client.get(url), 5)
        before = sent()
        size = len(client.get(url).content)
        show(name, times, f"{size / 1024:,.0f} KB page, {(sent() - before) / 1024:,.0f} KB from Valkey")
    show("flows.members (the whole flow, API)", timed(lambda: flows.members(ref.id), 3))


def stuck(client: Any, sent: Callable[[], int]) -> None:
    from jobqueue import Queue
    from jobqueue.spec import JobSpec

    queue = Queue("stuck")
    blob = "x" * STUCK_PAYLOAD
    for start in range(0, STUCK_JOBS, 100):
        queue.enqueue_many([JobSpec({"handler": "x", "args": [blob, i]}) for i in range(start, start + 100)])
    assert len(queue.dequeue(count=STUCK_JOBS, lease=3600)) == STUCK_JOBS
    print(f"\nthe stuck page, {STUCK_JOBS:,} running jobs of {STUCK_PAYLOAD // 1024} KB on one shard")
    url = "/admin/jobqueue/job/live/stuck/?running_over=1"
    times = timed(lambda: client.get(url), 5)
    before = sent()
    client.get(url)
    show("stuck page", times, f"{(sent() - before) / 1024:,.0f} KB from Valkey per view")


def live_search(client: Any) -> None:
    """The search page over the dashboard's 100,000 waiting jobs (20 queues)."""
    base = "/admin/jobqueue/job/live/search/"
    print("\nlive search over the 100,000 waiting jobs (20 queues), a page of 50")
    for name, query in (("a handler in every queue (first page)", "?handler=x"),
                        ("an argument no job has (stops short)", "?q=args.0%3D-1"),
                        ("an argument in one queue", "?queue=queue-07&q=args.0%3D4999"),
                        ("plain text in one lane, by its index", "?queue=queue-07&state=pending"
                                                                "&lane=t7&q=4957")):
        page = client.get(base + query)
        assert page.status_code == 200
        show(name, timed(lambda query=query: client.get(base + query), 5),
             "cut short" if b"stopped short" in page.content else "")


def bulk_retry(count: int, user: Any) -> None:
    """A bulk retry of `count` dead jobs: the count its confirmation shows, then the run."""
    from jobqueue import Queue
    from jobqueue.console import bulk
    from jobqueue.console.query import Query
    from jobqueue.spec import JobSpec

    queue = Queue("bulk")
    for start in range(0, count, 5_000):
        queue.enqueue_many([JobSpec({"handler": "x", "args": [i], "kwargs": {"tenant": "a"}},
                                    max_attempts=1) for i in range(start, min(count, start + 5_000))])
    while leases := queue.dequeue(count=1_000, lease=3600):
        for lease in leases:
            queue.nack(lease, "boom")
    print(f"\nbulk retry of {count:,} dead jobs (queue bulk, beside 100,000 waiting elsewhere)")
    work = bulk.Bulk.of("retry", Query.parse({"queue": "bulk", "q": "kwargs.tenant=a"}), None)
    operation = work.start(user)
    started = time.perf_counter()
    bulk.Runner().run()  # the count its page shows, to be confirmed
    counted = time.perf_counter() - started
    operation.refresh_from_db()
    assert bulk.Bulk.confirm(operation, user)
    started = time.perf_counter()
    bulk.Runner().run()
    ran = time.perf_counter() - started
    operation.refresh_from_db()
    assert (operation.total, operation.done, queue.counts()["dead"]) == (count, count, 0), operation
    print(f"  the count (before the confirmation): {counted:.2f} s; the retries: {ran:.2f} s "
          f"({count / ran:,.0f} jobs/s)")


def history_row(n: int, at: datetime) -> dict[str, Any]:
    from jobqueue.models import written_fields

    row: dict[str, Any] = {f.attname: None for f in written_fields()}
    row.update(id=f"JOB{n:011d}", queue="default", shard=0, lane=f"tenant-{n % 1000}",
               state="succeeded", priority=0, attempts=1, max_attempts=3, last_error="",
               unique_key=f"order-{n}", worker="w", durable=False, relayed=True, mirrored_at=at,
               payload={"handler": f"app.jobs.h{n % 50}", "args": [n]},
               finished_at=at - timedelta(seconds=n))
    return row


def search(url: str) -> None:
    from django.core.management import call_command
    from django.db.models import Q

    try:
        from jobqueue.console import readmodels
    except ImportError:  # a checkout from before the rooms
        from jobqueue import readmodels
    from jobqueue.models import Job, insert_jobs

    now = datetime.now(UTC)  # (rows written with today's columns, then the history before its
    for start in range(0, HISTORY_ROWS, 5_000):  # indexes: the migrations since 0009 undone)
        insert_jobs(history_row(n, now) for n in range(start + 1, start + 5_001))
    call_command("migrate", "jobqueue", "0009", verbosity=0)
    print(f"\nhistory search, {HISTORY_ROWS:,} rows ({url.split('://')[0]})")

    def old(text: str) -> None:  # the search before: one OR over the three, handler from the JSON
        list(Job.objects.filter(Q(lane=text) | Q(unique_key=text) | Q(payload__handler=text))
             .order_by("-finished_at").values_list("id", "finished_at")[:50])

    cases = (("no match", "nothing-matches"), ("a lane", "tenant-7"), ("a unique key", "order-99"),
             ("a handler", "app.jobs.h7"))
    for name, text in cases:
        show(f"before: {name}", timed(lambda text=text: old(text), 5))
    started = time.perf_counter()
    call_command("migrate", "jobqueue", verbosity=0)
    print(f"  migrations 0010… (handler column, its indexes, the columns since): "
          f"{time.perf_counter() - started:.1f} s")
    for name, text in cases:
        show(f"after: {name}", timed(lambda text=text: readmodels.search(text), 5))
    from jobqueue.console import search as console_search
    from jobqueue.console.query import Query

    for name, params in (("argument equals (args.0=150000)", {"q": "args.0=150000"}),
                         ("argument equals, one handler", {"q": "args.0=150007",
                                                           "handler": "app.jobs.h7"}),
                         ("argument contains (args.0~99999)", {"q": "args.0~99999"}),
                         ("plain text (order-99)", {"q": "order-99"})):
        query = Query.parse({**params, "where": "history"})
        show(f"console search: {name}", timed(
            lambda query=query: list(console_search.history(query, None)[:51]), 3))


CHART_ROWS = 1_000_000
CHART_QUEUES, CHART_HANDLERS = 5, 20


def chart_rows(count: int, now: datetime) -> Any:
    """`count` finished jobs as the mirror hands them to the rollup, over 30 days."""
    span = 30 * 86_400
    for n in range(count):
        finished = now - timedelta(seconds=n * span / count)
        run, wait = timedelta(milliseconds=5 + n % 997), timedelta(milliseconds=1 + n % 89)
        yield {"state": "succeeded" if n % 50 else "dead", "finished_at": finished,
               "queue": f"q{n % CHART_QUEUES}", "handler": f"app.jobs.h{n % CHART_HANDLERS}",
               "attempts": 1 + (n % 50 == 0), "started_at": finished - run,
               "enqueued_at": finished - run - wait}


def filled_rollup(now: datetime) -> int:
    """Every minute of 2 days, hour of 35 days and day of 30 days, for each queue × handler
    pair and each queue's totals, with counts in a few bins each: the rollup of a history of
    10,000,000 jobs or more (each bucket of each pair holds some)."""
    from jobqueue.history import rollup

    written = 0
    for resolution, count in ((rollup.MINUTE, 2 * 1440), (rollup.HOUR, 35 * 24), (rollup.DAY, 31)):
        last = int(now.timestamp()) // resolution * resolution
        for step in range(0, count, 100):
            added: dict[tuple[Any, ...], dict[str, int]] = {}
            for i in range(step, min(step + 100, count)):
                start = datetime.fromtimestamp(last - i * resolution, UTC)
                for pair in range(CHART_QUEUES * CHART_HANDLERS):
                    counts = {"succeeded": 20 + pair, "dead": pair % 3, "retried": pair % 5,
                              f"w{3 + pair % 9}": 15, f"w{9 + i % 7}": 5, f"r{10 + pair % 11}": 17,
                              f"r{20 + i % 9}": 3}
                    queue = f"q{pair % CHART_QUEUES}"
                    added[resolution, start, queue, f"app.jobs.h{pair}"] = counts
                    total = added.setdefault((resolution, start, queue, rollup.TOTAL), {})
                    for column, n in counts.items():
                        total[column] = total.get(column, 0) + n
            rollup.write(added)
            written += len(added)
    return written


def charts(client: Any) -> None:
    from jobqueue.history import rollup
    from jobqueue.models import Rollup

    now = datetime.now(UTC)
    base = "/admin/jobqueue/job/live/charts/"
    pages = [(f"charts, {span}", f"{base}?range={span}") for span in ("hour", "day", "week", "month")]
    pages += [("charts, month, one queue", f"{base}?range=month&queue=q1"),
              ("charts, day, one handler", f"{base}?range=day&queue=q1&handler=app.jobs.h1")]
    started, batch = time.perf_counter(), []
    for row in chart_rows(CHART_ROWS, now):
        batch.append(row)
        if len(batch) == 10_000:
            rollup.add(batch, now)  # (as `jobqueue rollup` does: no bucket prune would drop)
            batch = []
    rollup.add(batch, now)
    elapsed = time.perf_counter() - started
    print(f"\nhistory charts: {CHART_ROWS:,} finished jobs over 30 days added to the rollup in "
          f"{elapsed:.1f} s ({Rollup.objects.count():,} rollup rows, as `manage.py jobqueue rollup` "
          "builds them)")
    for name, url in pages:
        assert client.get(url).status_code == 200
        show(name, timed(lambda url=url: client.get(url), 5))
    started = time.perf_counter()
    Rollup.objects.all().delete()
    written = filled_rollup(now)
    print(f"history charts, the rollup full ({written:,} rows: 100 queue × handler pairs and 5 "
          f"queues' totals, every minute of 2 days, hour of 35 days and day of 30 days; written "
          f"in {time.perf_counter() - started:.1f} s)")
    for name, url in pages:
        show(name, timed(lambda url=url: client.get(url), 5))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--history-db", help="a MySQL/MariaDB URL to measure the search on (dropped "
                                             "first), or a PostgreSQL one for the charts only")
    parser.add_argument("--only", choices=["charts"], help="measure the history charts only")
    parser.add_argument("--bulk", type=int, default=20_000, help="dead jobs a bulk retry retries")
    args = parser.parse_args()
    with valkey() as url, tempfile.TemporaryDirectory() as tmp:
        os.environ["DJANGO_ALLOWED_HOSTS"] = "testserver"
        database = args.history_db or f"sqlite:///{tmp}/bench.sqlite3"
        if args.history_db:
            name = args.history_db.rsplit("/", 1)[1]
            if args.history_db.startswith("postgres"):
                subprocess.run(["psql", "-h127.0.0.1", "-Upostgres", "-qc", f"DROP DATABASE IF EXISTS "
                                f"{name}", "-c", f"CREATE DATABASE {name}"], check=True)
            else:
                subprocess.run(["mysql", "-uroot", "-h127.0.0.1", "-e", f"DROP DATABASE IF EXISTS "
                                f"{name}; CREATE DATABASE {name} CHARACTER SET utf8mb4"], check=True)
        django_setup(url, database)
        from django.contrib.auth.models import User
        from django.core.management import call_command
        from django.test import Client

        from jobqueue.conf import get_client

        call_command("migrate", verbosity=0)
        user = User.objects.create_superuser("bench", "b@example.com", "pw")
        client = Client()
        client.login(username="bench", password="pw")

        def sent() -> int:
            return int(get_client().info("stats")["total_net_output_bytes"])

        print("(rough numbers: one run on a shared machine)")
        if args.only != "charts":
            dashboard(client)
            live_search(client)
            bulk_retry(args.bulk, user)
            flow(client, sent)
            stuck(client, sent)
        charts(client)
        if args.history_db and args.history_db.startswith("mysql") and args.only != "charts":
            search(args.history_db)


if __name__ == "__main__":
    main()
