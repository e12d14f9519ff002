"""How long the console's pages take: the dashboard with 20 queues and 100,000 waiting jobs, a
flow of 20,000 jobs, the stuck page over 1,000 running jobs of 64 KB, and (with --history-db)
the history search at 300,000 rows, before and after its indexes; the console's search over the
live jobs and a bulk retry of every dead job of a queue (`--bulk N` of them).

    .venv/bin/python bench/console.py
    .venv/bin/python bench/console.py --history-db mysql://root@127.0.0.1:3306/jq_bench_console

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--history-db", help="a MySQL/MariaDB URL to measure the search on (dropped first)")
    parser.add_argument("--bulk", type=int, default=20_000, help="dead jobs a bulk retry retries")
    args = parser.parse_args()
    with valkey() as url, tempfile.TemporaryDirectory() as tmp:
        os.environ["DJANGO_ALLOWED_HOSTS"] = "testserver"
        database = args.history_db or f"sqlite:///{tmp}/bench.sqlite3"
        if args.history_db:
            name = args.history_db.rsplit("/", 1)[1]
            subprocess.run(["mysql", "-uroot", "-h127.0.0.1", "-e", f"DROP DATABASE IF EXISTS {name}; "
                            f"CREATE DATABASE {name} CHARACTER SET utf8mb4"], check=True)
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
        dashboard(client)
        live_search(client)
        bulk_retry(args.bulk, user)
        flow(client, sent)
        stuck(client, sent)
        if args.history_db:
            search(args.history_db)


if __name__ == "__main__":
    main()
