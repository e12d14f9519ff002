"""Access per queue, read adversarially: what a user of one queue could still see or do of the
queues not granted to them (flows across queues, "waits for" lists, the history of a queue
Valkey has forgotten, charts, console enqueue, periodic jobs in the admin)."""

from __future__ import annotations

import json
import signal
from datetime import UTC, datetime
from typing import Any

import pytest
from django.contrib.auth.models import Group, Permission, User
from django.test import Client

from jobqueue import Queue, chain, chord, conf
from jobqueue.flows.members import members
from jobqueue.history.mirror import upsert
from jobqueue.history.rollup import TOTAL
from jobqueue.models import Job, Rollup, Schedule
from tests import workers
from tests.jobapp import jobs

pytestmark = pytest.mark.django_db(transaction=True)
LIVE = "/admin/jobqueue/job/live"
ACCESS = {"billing": {"view": ["support"], "act": ["billing-ops"]}, "secret": {"act": ["ops"]},
          "archive": {"view": ["support"], "act": ["billing-ops"]}}
"""`archive`: a queue granted by name that Valkey no longer knows (its jobs are history only)."""
ADD = "tests.jobapp.jobs.add"


def member(name: str, *groups: str, superuser: bool = False) -> Client:
    """A client logged in as a staff user with every jobqueue permission, in `groups`."""
    user = User.objects.create_user(name, f"{name}@example.com", "pw", is_staff=True,
                                    is_superuser=superuser)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="jobqueue"))
    user.groups.set([Group.objects.get_or_create(name=group)[0] for group in groups])
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def granted(settings: Any) -> None:
    settings.JOBQUEUE = {**settings.JOBQUEUE, "CONSOLE": {"ACCESS": ACCESS}}
    conf.reset()


def row(job_id: str, queue: str) -> None:
    """A finished job of `queue` in the history alone."""
    upsert([{"id": job_id, "state": "dead", "lane": "acme",
             "payload": '{"handler": "tests.jobapp.jobs.add", "args": [1, 2]}'}], queue)


def known(*queues: str) -> None:
    """`queues` known to Valkey (each has held a job), as a flow across them needs."""
    for queue in queues:
        jobs.noop.using(queue=queue).enqueue()


def test_a_flow_page_veils_the_ids_and_waits_of_the_jobs_of_a_queue_not_granted(
        granted: None) -> None:
    known("billing", "secret")
    ref = chord([jobs.add.using(queue="secret").s(7, 1), jobs.add.using(queue="billing").s(2, 2)],
                jobs.total.using(queue="billing").s()).enqueue()
    [hidden] = [job.id for job in members(ref.id, "billing") if job.queue == "secret"]
    sam = member("sam", "support")
    page = sam.get(f"{LIVE}/flows/billing/{ref.id}/").content.decode()
    assert "3 jobs" in page and "(a queue you may not see)" in page
    assert hidden not in page  # (neither its row, nor the graph, nor the callback's "waits for")
    assert "/jobs/secret/" not in page
    whole = member("boss", superuser=True).get(f"{LIVE}/flows/billing/{ref.id}/").content.decode()
    assert hidden in whole and "/jobs/secret/" in whole


def test_a_job_page_does_not_name_the_jobs_it_waits_for_on_a_queue_not_granted(
        granted: None) -> None:
    known("billing", "secret")
    ref = chord([jobs.add.using(queue="secret").s(7, 1), jobs.add.using(queue="billing").s(2, 2)],
                jobs.total.using(queue="billing").s()).enqueue()
    placed = {job.queue: job.id for job in members(ref.id, "billing") if job.id != ref.id}
    page = member("sam", "support").get(f"{LIVE}/jobs/billing/{ref.id}/").content.decode()
    assert "2 jobs" in page and placed["billing"] in page
    assert placed["secret"] not in page and "1 more" in page
    whole = member("boss", superuser=True).get(f"{LIVE}/jobs/billing/{ref.id}/").content.decode()
    assert placed["secret"] in whole


def test_a_flow_with_no_job_on_a_granted_queue_is_not_found_through_one(granted: None) -> None:
    known("billing", "secret")
    flow = chain(jobs.add.using(queue="secret").s(1, 1), jobs.add.using(queue="secret").s(2)).enqueue()
    assert member("sam", "support").get(f"{LIVE}/flows/billing/{flow.id}/").status_code == 404
    boss = member("boss", superuser=True)
    assert boss.get(f"{LIVE}/flows/secret/{flow.id}/").status_code == 200


def test_the_history_of_a_granted_queue_valkey_forgot_is_searched_and_no_other(
        granted: None) -> None:
    row("JOB0000000000a", "archive")  # granted by name, unknown to Valkey
    row("JOB0000000000g", "gone")  # named by no grant: closed
    row("JOB0000000000s", "secret")
    sam = member("sam", "support")
    found = sam.get(f"{LIVE}/search/?q=args.0%3D1&where=history").content.decode()
    assert "JOB0000000000a" in found
    assert "JOB0000000000g" not in found and "JOB0000000000s" not in found
    named = sam.get(f"{LIVE}/search/?queue=archive&where=history").content.decode()
    assert "JOB0000000000a" in named
    assert "JOB0000000000g" not in sam.get(f"{LIVE}/search/?queue=gone&where=history").content.decode()
    assert sam.get(f"{LIVE}/jobs/archive/JOB0000000000a/").status_code == 200
    assert sam.get(f"{LIVE}/jobs/gone/JOB0000000000g/").status_code == 404


def test_the_charts_count_the_granted_queues_alone_even_in_their_total(granted: None) -> None:
    hour = datetime.fromtimestamp(int(datetime.now(UTC).timestamp()) // 3600 * 3600, UTC)
    for queue, count in (("billing", 3), ("archive", 5), ("secret", 100), ("gone", 1000)):
        for handler in (TOTAL, ADD):
            Rollup.objects.create(resolution=3600, start=hour, queue=queue, handler=handler,
                                  succeeded=count)
    sam = member("sam", "support")
    page = sam.get(f"{LIVE}/charts/?range=day").content.decode()
    assert "8 job(s) finished" in page  # billing's 3 and archive's 5
    assert 'data-queue="archive"' in page and 'data-queue="billing"' in page
    assert 'data-queue="secret"' not in page and 'data-queue="gone"' not in page
    assert "0 job(s) finished" in sam.get(f"{LIVE}/charts/?range=day&queue=secret").content.decode()
    boss = member("boss", superuser=True)
    assert "1108 job(s) finished" in boss.get(f"{LIVE}/charts/?range=day").content.decode()


def test_console_enqueue_needs_act_on_the_queue(granted: None, settings: Any) -> None:
    form = {"handler": ADD, "args": "[1, 2]", "kwargs": "{}"}
    sam = member("sam", "support")  # views billing only
    refused = sam.post(f"{LIVE}/enqueue/", {**form, "queue": "billing"})
    assert refused.status_code == 400 and "may not enqueue" in refused.content.decode()
    olga = member("olga", "billing-ops")
    assert olga.post(f"{LIVE}/enqueue/", {**form, "queue": "billing"}).status_code == 302
    assert olga.post(f"{LIVE}/enqueue/", {**form, "queue": "secret"}).status_code == 400
    settings.JOBQUEUE = {**settings.JOBQUEUE, "CONSOLE": {"ACCESS": {"*": {"view": ["watch"]}}}}
    conf.reset()
    watcher = member("wanda", "watch")  # sees every queue, acts on none
    assert watcher.post(f"{LIVE}/enqueue/", {**form, "queue": "default"}).status_code == 400
    assert Queue("secret").counts().get("pending", 0) == 0
    assert Queue("default").counts().get("pending", 0) == 0


def test_the_periodic_jobs_admin_keeps_to_the_granted_queues(granted: None, settings: Any) -> None:
    settings.JOBQUEUE = {**settings.JOBQUEUE,
                         "SCHEDULE": {"beat": {"job": "tests.jobapp.jobs.noop", "every": 60,
                                               "queue": "secret"},
                                      "bill": {"job": "tests.jobapp.jobs.noop", "every": 60,
                                               "queue": "billing"}}}
    conf.reset()
    hidden = Schedule.objects.create(name="db-secret", job="tests.jobapp.jobs.noop", every=60,
                                     queue="secret", args=["s3cr3t-arg"])
    shown = Schedule.objects.create(name="db-bill", job="tests.jobapp.jobs.noop", every=60,
                                    queue="billing")
    sam = member("sam", "support")
    listed = sam.get("/admin/jobqueue/schedule/").content.decode()
    assert "db-bill" in listed and "db-secret" not in listed
    assert 'data-schedule="bill"' in listed and 'data-schedule="beat"' not in listed
    assert sam.get(f"/admin/jobqueue/schedule/{hidden.pk}/change/").status_code == 302  # not found
    assert sam.post(f"/admin/jobqueue/schedule/{hidden.pk}/delete/", {"post": "yes"}).status_code == 302
    assert Schedule.objects.filter(pk=hidden.pk).exists()
    # a view-only user may read a visible queue's periodic job, not change it
    assert 'name="_save"' not in sam.get(f"/admin/jobqueue/schedule/{shown.pk}/change/").content.decode()
    sam.post(f"/admin/jobqueue/schedule/{shown.pk}/change/",
             {"name": "db-bill", "job": "tests.jobapp.jobs.noop", "every": "5", "timezone": "UTC",
              "args": "[]", "kwargs": "{}", "queue": "billing", "lane": "", "enabled": "on"})
    assert Schedule.objects.get(pk=shown.pk).every == 60
    sam.post("/admin/jobqueue/schedule/", {"action": "delete_selected", "post": "yes",
                                           "_selected_action": [shown.pk, hidden.pk]})
    assert Schedule.objects.count() == 2
    new = {"job": "tests.jobapp.jobs.noop", "every": "60", "timezone": "UTC", "args": "[]",
           "kwargs": "{}", "lane": "", "enabled": "on"}
    sam.post("/admin/jobqueue/schedule/add/", {**new, "name": "sams", "queue": "billing"})
    olga = member("olga", "billing-ops")
    olga.post("/admin/jobqueue/schedule/add/", {**new, "name": "olgas-secret", "queue": "secret"})
    assert not Schedule.objects.filter(name__in=["sams", "olgas-secret"]).exists()
    answer = olga.post("/admin/jobqueue/schedule/add/", {**new, "name": "olgas", "queue": "billing"})
    assert answer.status_code == 302 and Schedule.objects.filter(name="olgas").exists()
    assert Job.objects.count() == 0


def test_closed_by_default_without_any_grant_shows_no_queue_in_a_search(settings: Any) -> None:
    settings.JOBQUEUE = {**settings.JOBQUEUE, "CONSOLE": {"OPEN_BY_DEFAULT": False}}
    conf.reset()
    ref = jobs.add.using(queue="secret").enqueue(1, 1)
    row("JOB0000000000s", "secret")
    nobody = member("nobody")
    assert 'data-queue="secret"' not in nobody.get(f"{LIVE}/").content.decode()
    live = nobody.get(f"{LIVE}/search/?state=pending&where=live").content.decode()
    history = nobody.get(f"{LIVE}/search/?q=args.0%3D1&where=history").content.decode()
    assert ref.id not in live
    assert "JOB0000000000s" not in history
    assert nobody.post(f"{LIVE}/search/bulk/", {"state": "pending", "where": "live",
                                                "action": "cancel"}).status_code == 403
    assert Queue("secret").counts().get("pending") == 1


def test_a_view_only_user_posts_no_action_at_all(granted: None) -> None:
    known("billing")
    ref = jobs.add.using(queue="billing", lane="acme").enqueue(1, 1)
    row("JOB0000000000b", "billing")
    sam = member("sam", "support")
    assert sam.post(f"{LIVE}/jobs/billing/{ref.id}/reprioritize/", {"priority": "5"}).status_code == 403
    assert sam.post(f"{LIVE}/jobs/billing/{ref.id}/cancel/", {"confirm": "yes"}).status_code == 403
    assert sam.post(f"{LIVE}/queues/billing/set_lane_concurrency/",
                    {"lane": "acme", "cap": "1"}).status_code == 403
    assert sam.post(f"{LIVE}/queues/billing/resume/").status_code == 403
    assert sam.post(f"{LIVE}/search/bulk/", {"q": "args.0=1", "where": "history",
                                             "action": "retry"}).status_code == 403
    assert sam.post(f"{LIVE}/search/bulk/", {"where": "live", "queue": "billing",
                                             "action": "cancel"}).status_code == 403
    assert Queue("billing").get(ref.id).priority == 0  # type: ignore[union-attr]
    assert Queue("billing").get("JOB0000000000b") is None


def test_a_shard_row_is_changed_or_deleted_only_by_who_acts_on_its_queue(granted: None) -> None:
    from jobqueue.models import Shard

    billing = Shard.objects.create(queue="billing", index=0)
    secret = Shard.objects.create(queue="secret", index=0)
    sam = member("sam", "support")
    assert "secret" not in sam.get("/admin/jobqueue/shard/").content.decode()
    assert sam.get(f"/admin/jobqueue/shard/{secret.pk}/change/").status_code == 302  # not found
    sam.post(f"/admin/jobqueue/shard/{billing.pk}/delete/", {"post": "yes"})
    sam.post(f"/admin/jobqueue/shard/{billing.pk}/change/",
             {"queue": "billing", "index": "0", "status": "retired", "pending": "0",
              "scheduled": "0", "active": "0", "dead": "0"})
    assert Shard.objects.get(pk=billing.pk).status == "active"
    olga = member("olga", "billing-ops")
    assert olga.post(f"/admin/jobqueue/shard/{billing.pk}/delete/", {"post": "yes"}).status_code == 302
    assert not Shard.objects.filter(pk=billing.pk).exists()


def test_a_worker_serving_a_queue_not_granted_too_shows_no_counts_of_it(
        settings: Any, valkey_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    settings.JOBQUEUE = {**settings.JOBQUEUE, "URL": valkey_server.url,
                         "CONSOLE": {"ACCESS": ACCESS}}
    conf.reset()
    monkeypatch.setenv("JOBQUEUE_TEST_QUEUES", json.dumps({"secret": {}, "billing": {}}))
    for _ in range(7):
        jobs.noop.using(queue="secret").enqueue()
    worker = workers.start_worker(valkey_server.url, "--queues", "secret,billing")
    sam, boss = member("sam", "support"), member("boss", superuser=True)
    try:
        workers.wait_for(lambda: '<td>7</td>' in boss.get(f"{LIVE}/workers/").content.decode(),
                         timeout=60)
        for url in (f"{LIVE}/workers/", f"{LIVE}/"):
            shown = sam.get(url).content.decode()
            entry = shown[shown.index("jq-workers"):]
            entry = entry[:entry.index("</table>")]
            assert "billing" in entry and "secret" not in entry and "<td>7</td>" not in entry
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(20) == 0


def test_a_hidden_argument_quoted_in_an_error_is_masked_where_the_error_is_shown(
        settings: Any) -> None:
    settings.JOBQUEUE = {**settings.JOBQUEUE, "QUEUES": {
        **settings.JOBQUEUE["QUEUES"], "payments": {"hidden_args": ["card", 1]}}}
    conf.reset()
    error = "ValueError: card '5500-0000-1234' declined for 4111-1111-9876 (amount 12)"
    payments = Queue("payments")
    echo = jobs.echo.using(queue="payments")
    flow = chain(echo.s("alice", "4111-1111-9876", card="5500-0000-1234", amount=12),
                 echo.s()).enqueue()
    [lease] = payments.dequeue(count=1)
    payments.nack(lease, error, fatal=True)
    Job.objects.create(id="JOBpaid0000001", queue="payments", state="dead", attempts=1, lane="acme",
                       payload={"handler": ADD, "args": ["bob", "4111-1111-9876"],
                                "kwargs": {"card": "5500-0000-1234"}},
                       last_error=error, history=[{"attempt": 1, "error": error}],
                       finished_at=datetime.now(UTC))
    op = member("op")
    User.objects.get(username="op").user_permissions.remove(
        Permission.objects.get(codename="view_hidden_args"))
    pages = [op.get(f"{LIVE}/jobs/payments/{lease.job_id}/"),
             op.get(f"{LIVE}/search/?queue=payments&where=live"),
             op.get(f"{LIVE}/search/?queue=payments&where=history"),
             op.get("/admin/jobqueue/job/JOBpaid0000001/change/"),
             op.get(f"{LIVE}/flows/payments/{flow.id}/"),
             op.get(f"{LIVE}/find/?id=acme")]  # (a history row found by its lane)
    for page in pages:
        text = page.content.decode()
        assert page.status_code == 200 and "declined" in text
        assert "5500-0000-1234" not in text and "4111-1111-9876" not in text, page.request
    boss = member("boss", superuser=True).get(f"{LIVE}/jobs/payments/{lease.job_id}/").content.decode()
    assert "5500-0000-1234" in boss and "(amount 12)" in boss
