"""Bulk actions on every job a search matches: confirmed with the count, run outside the request,
one LogEntry, one operation however often it is confirmed, its permission, and a runner killed
mid-way (a real `manage.py jobqueue bulk` process, SIGKILL) resumed by the next, each job acted
on once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.test import Client

from jobqueue import Queue
from jobqueue.console import bulk, search
from jobqueue.console.query import Query
from jobqueue.models import BulkOperation, Job
from jobqueue.spec import JobSpec
from tests.workers import database_url, wait_for

pytestmark = pytest.mark.django_db(transaction=True)
BULK = "/admin/jobqueue/job/live/search/bulk/"
ROOT = Path(__file__).resolve().parents[2]
ECHO = "tests.jobapp.jobs.echo"


def dead_jobs(count: int, queue: str = "default", **kwargs: Any) -> list[str]:
    """`count` jobs on `queue` that ran once and died."""
    live = Queue(queue)
    refs = live.enqueue_many(
        [JobSpec({"handler": ECHO, "args": [i], "kwargs": kwargs}, max_attempts=1) for i in range(count)]
    )
    while leases := live.dequeue(count=500):
        for lease in leases:
            live.nack(lease, "boom")
    return [ref.id for ref in refs]


def finished(pk: int) -> BulkOperation:
    wait_for(lambda: BulkOperation.objects.get(pk=pk).status not in bulk.UNDER_WAY, timeout=60)
    return BulkOperation.objects.get(pk=pk)


def asked(client: Client, **form: str) -> str:
    """Ask for a bulk action: its page's URL, once the operation is counted."""
    response = client.post(BULK, form)
    assert response.status_code == 302 and "/bulk/" in response["Location"], response
    assert finished(pk_of(response["Location"])).status == "counted"
    return response["Location"]


def pk_of(url: str) -> int:
    return int(url.rstrip("/").rsplit("/", 1)[1])


def test_a_bulk_retry_is_confirmed_with_its_count_runs_outside_the_request_and_is_logged_once(
    admin_client: Client,
) -> None:
    retried = dead_jobs(30, tenant="acme")
    others = dead_jobs(5, tenant="other")
    url = asked(admin_client, q="kwargs.tenant=acme", where="live", action="retry")
    page = admin_client.get(url).content.decode()
    assert "<b>30</b> live jobs match" in page and "kwargs.tenant=acme" in page
    assert Queue("default").counts()["dead"] == 35 and LogEntry.objects.count() == 0
    response = admin_client.post(url + "decide/", {"confirm": "yes"})
    assert response.status_code == 302 and response["Location"] == url
    operation = finished(pk_of(url))
    assert (operation.status, operation.done, operation.skipped) == ("done", 30, 0)
    queue = Queue("default")
    assert {queue.get(job_id).state for job_id in retried} == {"pending"}  # type: ignore[union-attr]
    assert {queue.get(job_id).state for job_id in others} == {"dead"}  # type: ignore[union-attr]
    [entry] = LogEntry.objects.all()
    assert "Retry 30 live job(s) matching" in entry.change_message
    assert "kwargs.tenant=acme" in entry.change_message
    progress = admin_client.get(url).content.decode()
    assert "30 done, 0 skipped of 30" in progress and 'http-equiv="refresh"' not in progress


def test_a_bulk_delete_of_history_rows_and_a_dropped_one(admin_client: Client) -> None:
    now = datetime.now(UTC)
    for i in range(12):
        Job.objects.create(
            id=f"JOBdel{i:08d}",
            queue="default",
            state="succeeded",
            payload={"handler": ECHO, "args": [i % 2]},
            finished_at=now,
        )
    Job.objects.create(
        id="JOBdurable0001",
        queue="durable",
        state="pending",
        durable=True,
        payload={"handler": ECHO, "args": [1]},
    )
    dropped = asked(admin_client, q="args.0=0", where="history", action="delete")
    admin_client.post(dropped + "decide/", {})
    assert BulkOperation.objects.get(pk=pk_of(dropped)).status == "dropped"
    url = asked(admin_client, q="args.0=1", where="history", action="delete")
    assert "<b>6</b> history jobs match" in admin_client.get(url).content.decode()
    admin_client.post(url + "decide/", {"confirm": "yes"})
    assert finished(pk_of(url)).done == 6
    assert Job.objects.filter(queue="default").count() == 6
    assert Job.objects.filter(pk="JOBdurable0001").exists()  # unfinished: never deleted
    assert LogEntry.objects.count() == 1


def test_clicking_twice_starts_one_operation(admin_client: Client) -> None:
    dead_jobs(1500)
    form = {"state": "dead", "where": "live", "action": "retry"}
    url = asked(admin_client, **form)
    assert asked(admin_client, **form) == url  # asked twice: the same one, counted again
    first = admin_client.post(url + "decide/", {"confirm": "yes"})
    second = admin_client.post(url + "decide/", {"confirm": "yes"})
    assert first["Location"] == second["Location"] == url
    assert BulkOperation.objects.count() == 1 and LogEntry.objects.count() == 1
    operation = finished(pk_of(url))
    assert (operation.total, operation.done, operation.skipped) == (1500, 1500, 0)


def test_each_bulk_action_needs_its_permission_and_a_post(client: Client) -> None:
    dead_jobs(3)
    user = User.objects.create_user("op", "op@example.com", "pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=("view_job", "cancel_job")))
    client.login(username="op", password="pw")
    form = {"state": "dead", "where": "live", "action": "retry"}
    assert client.post(BULK, form).status_code == 403
    assert client.post(BULK, {**form, "where": "history", "action": "delete"}).status_code == 403
    assert client.get(BULK, form).status_code == 405
    page = client.get("/admin/jobqueue/job/live/search/", {"state": "pending"}).content.decode()
    assert "Cancel all…" in page and "Retry all…" not in page
    assert BulkOperation.objects.count() == 0 and Queue("default").counts()["dead"] == 3
    refused = client.post(BULK, {"state": "dead", "where": "live", "action": "cancel"})
    assert refused.status_code == 302  # cancel applies to waiting or running jobs: a message
    assert "cancel applies to" in str(list(client.get(refused["Location"]).context["messages"]))
    other = bulk.Bulk.of("retry", Query.parse({"state": "dead"}), None).start(user)
    decide = f"/admin/jobqueue/job/live/bulk/{other.pk}/decide/"
    assert client.post(decide, {"confirm": "yes"}).status_code == 403


def test_a_bulk_retry_resumes_after_its_runner_is_killed_and_acts_on_each_job_once(
    valkey_server: Any,
) -> None:
    job_ids = dead_jobs(2000)
    user = User.objects.create_superuser("root", "root@example.com", "pw")
    operation = bulk.Bulk.of("retry", Query.parse({"state": "dead", "where": "live"}), None).start(user)
    bulk.Runner().run()  # counts it
    operation.refresh_from_db()
    assert (operation.status, operation.total) == ("counted", 2000)
    assert bulk.Bulk.confirm(operation, user)
    env = {
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "VALKEY_URL": valkey_server.url,
        "DATABASE_URL": database_url(),
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(ROOT),
    }
    runner = subprocess.Popen(
        [sys.executable, "manage.py", "jobqueue", "bulk", "--chunk", "10"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_for(lambda: BulkOperation.objects.get(pk=operation.pk).done >= 100, timeout=60)
        os.kill(runner.pid, signal.SIGKILL)
        runner.wait(timeout=10)
    finally:
        if runner.poll() is None:
            os.kill(runner.pid, signal.SIGKILL)
    midway = BulkOperation.objects.get(pk=operation.pk)
    assert midway.status == "running" and 100 <= midway.done < 2000
    assert bulk.Runner(chunk=10).run(wait=True) == 1  # waits out the dead runner's lease
    operation = BulkOperation.objects.get(pk=operation.pk)
    assert (operation.status, operation.done, operation.skipped) == ("done", 2000, 0)
    assert operation.running_key is None and operation.inflight == []
    queue = Queue("default")
    assert {queue.get(job_id).state for job_id in job_ids} == {"pending"}  # type: ignore[union-attr]
    assert queue.counts()["pending"] == 2000 and LogEntry.objects.count() == 1


def test_a_live_search_and_a_bulk_cancel_over_three_shards_standalone_and_on_a_cluster(
    valkey_url: str,
) -> None:
    wide = Queue("wide")
    refs = wide.enqueue_many(
        [JobSpec({"handler": ECHO, "args": [i], "kwargs": {"batch": i % 2}}, lane=f"t{i}") for i in range(90)]
    )
    assert len({wide.locate(ref.id) for ref in refs}) == 3  # (spread over the shards, by lane)
    odd = {ref.id for i, ref in enumerate(refs) if i % 2}
    seen, cursor = set(), ""
    while True:
        page = search.live(Query.parse({"queue": "wide", "q": "kwargs.batch=1"}), None, cursor, per_page=10)
        seen |= {job.id for job in page.jobs}
        if page.next is None:
            break
        cursor = page.next
    assert seen == odd
    user = User.objects.create_superuser("root", "root@example.com", "pw")
    operation = bulk.Bulk.of("cancel", Query.parse({"queue": "wide", "q": "kwargs.batch=1"}), None).start(
        user
    )
    bulk.Runner(chunk=7).run()
    operation.refresh_from_db()
    assert operation.total == 45 and bulk.Bulk.confirm(operation, user)
    bulk.Runner(chunk=7).run()
    operation.refresh_from_db()
    assert (operation.status, operation.done, operation.skipped) == ("done", 45, 0)
    assert {job_id: wide.get(job_id).state for job_id in odd} == dict.fromkeys(odd, "cancelled")  # type: ignore[union-attr]
    assert wide.counts()["pending"] == 45
