"""Access per queue (`JOBQUEUE["CONSOLE"]["ACCESS"]`): a user of another group sees nothing of a
queue not granted to them, anywhere in the console or the history, and acts only where granted."""

from __future__ import annotations

import json
import re
import signal
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Group, Permission, User
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import Client

from jobqueue import Queue, chain, conf, grants
from jobqueue.exceptions import ConfigurationError
from jobqueue.history.mirror import upsert
from tests import workers
from tests.jobapp import jobs

pytestmark = pytest.mark.django_db(transaction=True)
LIVE = "/admin/jobqueue/job/live"
ACCESS = {"billing": {"view": ["support"], "act": ["billing-ops"]}, "secret": {"act": ["ops"]}}


def dead_in(queue: str, arg: Any = 1) -> str:
    """A job of `queue` that ran once and died."""
    ref = jobs.always_fails.using(queue=queue, max_attempts=1, lane="acme").enqueue(arg)
    target = Queue(queue)
    [lease] = target.dequeue(count=1)
    target.nack(lease, "Traceback (most recent call last):\n  File \"x.py\", line 1\nValueError: no")
    return ref.id


def member(client: Client, name: str, *groups: str, superuser: bool = False) -> Client:
    """`client` logged in as a staff user with every jobqueue permission, in `groups`."""
    user = User.objects.create_user(name, f"{name}@example.com", "pw", is_staff=True,
                                    is_superuser=superuser)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="jobqueue"))
    user.groups.set([Group.objects.get_or_create(name=group)[0] for group in groups])
    client.force_login(user)
    return client


@pytest.fixture
def granted(settings: Any) -> dict[str, str]:
    settings.JOBQUEUE = {**settings.JOBQUEUE, "CONSOLE": {"ACCESS": ACCESS}}
    conf.reset()
    found = {queue: dead_in(queue) for queue in ("billing", "secret", "default")}
    upsert([{"id": "JOB0000000000b", "state": "dead", "lane": "acme",
             "payload": '{"handler": "tests.jobapp.jobs.add", "args": [1, 2]}'}], "billing")
    upsert([{"id": "JOB0000000000s", "state": "dead", "lane": "acme",
             "payload": '{"handler": "tests.jobapp.jobs.add", "args": [1, 2]}'}], "secret")
    return found


def test_a_viewer_of_one_queue_sees_it_alone_everywhere_and_acts_nowhere(
        client: Client, granted: dict[str, str]) -> None:
    sam = member(client, "sam", "support")
    page = sam.get(f"{LIVE}/").content.decode()
    assert 'data-queue="billing"' in page and 'data-queue="secret"' not in page
    assert 'data-queue="default"' not in page and 'value="Pause"' not in page
    assert sam.get(f"{LIVE}/queues/secret/").status_code == 404
    billing = sam.get(f"{LIVE}/queues/billing/").content.decode()
    assert granted["billing"] in billing and 'value="Retry"' not in billing
    # an id typed into the URL: the same 404 as for a job that does not exist
    assert sam.get(f"{LIVE}/jobs/secret/{granted['secret']}/").status_code == 404
    assert sam.get(f"{LIVE}/jobs/secret/JOB0000000000z/").status_code == 404
    assert sam.get(f"{LIVE}/jobs/default/{granted['default']}/").status_code == 404
    job = sam.get(f"{LIVE}/jobs/billing/{granted['billing']}/").content.decode()
    assert "ValueError: no" in job and 'value="Retry"' not in job
    assert sam.get(f"{LIVE}/find/?id={granted['secret']}").status_code == 200  # "no job"
    assert sam.get(f"{LIVE}/find/?id=JOB0000000000s").status_code == 200
    assert sam.get(f"{LIVE}/find/?id={granted['billing']}").status_code == 302
    waiting = {queue: jobs.add.using(queue=queue, lane="acme").enqueue(1, 1).id
               for queue in ("billing", "secret")}
    found = sam.get(f"{LIVE}/find/?id=acme").content.decode()  # a lane: live and history
    assert waiting["billing"] in found and "JOB0000000000b" in found
    assert waiting["secret"] not in found and "JOB0000000000s" not in found
    stuck = sam.get(f"{LIVE}/stuck/?pending_over=1").content.decode()
    assert granted["billing"] in stuck and granted["secret"] not in stuck
    flow = chain(jobs.add.using(queue="secret").s(1, 1), jobs.add.using(queue="secret").s(2)).enqueue()
    assert sam.get(f"{LIVE}/flows/secret/{flow.id}/").status_code == 404
    # actions: 403 on a queue seen only, 404 on one not seen at all
    assert sam.post(f"{LIVE}/jobs/billing/{granted['billing']}/retry/").status_code == 403
    assert sam.post(f"{LIVE}/jobs/secret/{granted['secret']}/retry/").status_code == 404
    assert sam.post(f"{LIVE}/jobs/secret/{granted['secret']}/cancel/",
                    {"confirm": "yes"}).status_code == 404
    assert sam.post(f"{LIVE}/queues/billing/pause/").status_code == 403
    assert sam.post(f"{LIVE}/queues/secret/pause/").status_code == 404
    assert sam.post(f"{LIVE}/queues/secret/resize/", {"count": "2", "confirm": "yes"}).status_code == 404
    assert sam.post(f"{LIVE}/queues/billing/set_global_concurrency/", {"cap": "3"}).status_code == 403
    assert not Queue("billing").is_paused() and not Queue("secret").is_paused()
    assert Queue("secret").get(granted["secret"]).state == "dead"  # type: ignore[union-attr]
    assert not LogEntry.objects.exists()


def test_the_history_changelist_and_its_bulk_retry_keep_to_the_granted_queues(
        client: Client, granted: dict[str, str]) -> None:
    sam = member(client, "sam", "support")
    listed = sam.get("/admin/jobqueue/job/").content.decode()
    assert "JOB0000000000b" in listed and "JOB0000000000s" not in listed
    assert "?queue=secret" not in listed  # (the queue filter offers the visible queues only)
    assert sam.get("/admin/jobqueue/job/JOB0000000000s/change/").status_code == 302  # "not found"
    retried = sam.post("/admin/jobqueue/job/", {"action": "retry_selected", "post": "yes",
                                                "_selected_action": ["JOB0000000000b",
                                                                     "JOB0000000000s"]})
    assert retried.status_code == 302
    assert Queue("billing").get("JOB0000000000b") is None  # nothing retried: view only
    assert Queue("secret").get("JOB0000000000s") is None
    User.objects.all().delete()
    olga = member(client, "olga", "billing-ops")
    olga.post("/admin/jobqueue/job/", {"action": "retry_selected", "post": "yes",
                                       "_selected_action": ["JOB0000000000b", "JOB0000000000s"]})
    assert Queue("billing").get("JOB0000000000b").state == "pending"  # type: ignore[union-attr]
    assert Queue("secret").get("JOB0000000000s") is None  # not hers: not even in her list


def test_act_lets_a_user_act_and_a_superuser_sees_everything(client: Client,
                                                            granted: dict[str, str]) -> None:
    olga = member(client, "olga", "billing-ops")
    assert olga.post(f"{LIVE}/jobs/billing/{granted['billing']}/retry/").status_code == 302
    assert Queue("billing").get(granted["billing"]).state == "pending"  # type: ignore[union-attr]
    assert 'value="Pause"' in olga.get(f"{LIVE}/").content.decode()
    User.objects.all().delete()
    root = member(client, "root", superuser=True)
    page = root.get(f"{LIVE}/").content.decode()
    assert all(f'data-queue="{queue}"' in page for queue in ("billing", "secret", "default"))
    assert root.get(f"{LIVE}/jobs/secret/{granted['secret']}/").status_code == 200


def test_open_by_default_opens_the_queues_no_grant_names(client: Client, settings: Any,
                                                       granted: dict[str, str]) -> None:
    settings.JOBQUEUE = {**settings.JOBQUEUE,
                         "CONSOLE": {"ACCESS": ACCESS, "OPEN_BY_DEFAULT": True}}
    conf.reset()
    nobody = member(client, "nobody")
    page = nobody.get(f"{LIVE}/").content.decode()
    assert 'data-queue="default"' in page and 'data-queue="billing"' not in page
    assert nobody.get(f"{LIVE}/jobs/default/{granted['default']}/").status_code == 200
    assert nobody.get(f"{LIVE}/jobs/billing/{granted['billing']}/").status_code == 404
    listed = nobody.get("/admin/jobqueue/job/").content.decode()
    assert "JOB0000000000b" not in listed


def test_every_queue_grant_and_no_grants_at_all(client: Client, settings: Any) -> None:
    dead_in("secret")
    ops = member(client, "ops", "ops")
    assert 'data-queue="secret"' in ops.get(f"{LIVE}/").content.decode()
    settings.JOBQUEUE = {**settings.JOBQUEUE, "CONSOLE": {"ACCESS": {"*": {"view": ["ops"]}}}}
    conf.reset()
    assert 'data-queue="secret"' in ops.get(f"{LIVE}/").content.decode()
    assert ops.post(f"{LIVE}/queues/secret/pause/").status_code == 403
    settings.JOBQUEUE = {**settings.JOBQUEUE, "CONSOLE": {"ACCESS": {"*": {"view": ["other"]}}}}
    conf.reset()
    assert 'data-queue="secret"' not in ops.get(f"{LIVE}/").content.decode()


def test_the_workers_and_periodic_jobs_pages_show_only_the_granted_queues(
        client: Client, settings: Any, valkey_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    settings.JOBQUEUE = {**settings.JOBQUEUE, "URL": valkey_server.url, "CONSOLE": {"ACCESS": ACCESS},
                         "SCHEDULE": {"beat": {"job": "tests.jobapp.jobs.noop", "every": 60,
                                               "queue": "secret"},
                                      "bill": {"job": "tests.jobapp.jobs.noop", "every": 60,
                                               "queue": "billing"}}}
    conf.reset()
    monkeypatch.setenv("JOBQUEUE_TEST_QUEUES", json.dumps({"secret": {}, "billing": {}}))
    worker = workers.start_worker(valkey_server.url, "--queues", "secret,billing")
    sam = member(client, "sam", "support")
    try:
        workers.wait_for(lambda: "data-worker=" in sam.get(f"{LIVE}/workers/").content.decode(),
                         timeout=60)
        shown = sam.get(f"{LIVE}/workers/").content.decode()
        row = shown[shown.index("data-worker="):]
        assert "billing" in row[:row.index("</tr>")] and "secret" not in shown
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(20) == 0
    periodic = sam.get(f"{LIVE}/schedules/").content.decode()
    assert 'data-schedule="bill"' in periodic and 'data-schedule="beat"' not in periodic
    assert 'value="Run now"' not in periodic
    assert sam.post(f"{LIVE}/schedules/beat/run/", {"confirm": "yes"}).status_code == 404
    assert sam.post(f"{LIVE}/schedules/bill/run/", {"confirm": "yes"}).status_code == 403


@pytest.mark.parametrize(("raw", "says"), [
    ({"ACCES": {}}, "did you mean 'ACCESS'"),
    ({"ACCESS": {"bad name!": {"view": ["x"]}}}, "invalid queue name"),
    ({"ACCESS": {"billing": {"veiw": ["x"]}}}, "did you mean 'view'"),
    ({"ACCESS": {"billing": {"view": "support"}}}, "list of Django group names"),
    ({"ACCESS": {"billing": {}}}, "must be a dict such as"),
    ({"OPEN_BY_DEFAULT": "yes"}, "True or False"),
    ([], "must be a dict"),
])
def test_a_wrong_access_setting_is_one_clear_error(raw: Any, says: str, settings: Any) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(says)):
        grants.parse(raw)
    settings.JOBQUEUE = {**settings.JOBQUEUE, "CONSOLE": raw}
    with pytest.raises(SystemCheckError, match=r"jobqueue\.E009"):
        call_command("check", "--tag", "jobqueue")


def test_the_default_is_open_without_grants_and_closed_with_them() -> None:
    assert grants.parse({}).open_by_default
    assert not grants.parse({"ACCESS": {"billing": {"view": ["support"]}}}).open_by_default
    both = grants.parse({"ACCESS": {"billing": {"act": ["ops"]}}})
    assert both.levels("billing", frozenset({"ops"})) == {"view", "act"}


def test_search_and_bulk_actions_keep_to_the_granted_queues(client: Client,
                                                             granted: dict[str, str]) -> None:
    """A search (live and history) shows only the queues the user may see; a bulk action reaches
    only those they may act on, and an operation recorded over more is not theirs to confirm."""
    sam = member(client, "sam", "support")  # views billing, acts nowhere
    live = sam.get(f"{LIVE}/search/?state=dead&where=live").content.decode()
    assert granted["billing"] in live
    assert granted["secret"] not in live and granted["default"] not in live
    history = sam.get(f"{LIVE}/search/?q=args.0%3D1&where=history").content.decode()
    assert "JOB0000000000b" in history and "JOB0000000000s" not in history
    # a bulk retry by a view-only user acts on nothing (no queue to act on)
    response = sam.post(f"{LIVE}/search/bulk/", {"state": "dead", "where": "live",
                                                 "action": "retry"})
    if response.status_code == 302 and "/bulk/" in response["Location"]:
        url = response["Location"]
        workers.wait_for(lambda: 'id="bulk-count"' in sam.get(url).content.decode(), timeout=30)
        sam.post(url + "decide/", {"confirm": "yes"})
    assert {Queue(q).get(granted[q]).state for q in granted} == {"dead"}  # type: ignore[union-attr]
    # an operator of billing retries billing's dead jobs alone
    bo = member(Client(), "bo", "billing-ops")
    response = bo.post(f"{LIVE}/search/bulk/", {"state": "dead", "where": "live",
                                                "action": "retry"})
    assert response.status_code == 302 and "/bulk/" in response["Location"], response
    url = response["Location"]
    workers.wait_for(lambda: 'id="bulk-count"' in bo.get(url).content.decode(), timeout=30)
    bo.post(url + "decide/", {"confirm": "yes"})
    workers.wait_for(lambda: Queue("billing").get(granted["billing"]).state == "pending",  # type: ignore[union-attr]
                     timeout=30)
    assert Queue("secret").get(granted["secret"]).state == "dead"  # type: ignore[union-attr]
    assert Queue("default").get(granted["default"]).state == "dead"  # type: ignore[union-attr]
    # sam may not confirm (nor see) an operation that reaches queues beyond theirs
    assert sam.post(url + "decide/", {"confirm": "yes"}).status_code in (403, 404)


def test_a_flow_across_queues_shows_the_jobs_of_a_queue_not_granted_veiled(
        client: Client, granted: dict[str, str]) -> None:
    """The flow page and its graph, seen from a granted queue: a member on a queue the user may
    not see keeps its place and state, not its handler, arguments or error."""
    from jobqueue import chord

    ref = chord([jobs.add.using(queue="secret").s(7, 1), jobs.add.using(queue="billing").s(2, 2)],
                jobs.total.using(queue="billing").s()).enqueue()
    sam = member(client, "sam", "support")
    page = sam.get(f"{LIVE}/flows/billing/{ref.id}/").content.decode()
    assert "3 jobs" in page and "(a queue you may not see)" in page
    assert sam.get(f"{LIVE}/flows/secret/{ref.id}/").status_code == 404
    boss = member(Client(), "boss", superuser=True)
    whole = boss.get(f"{LIVE}/flows/billing/{ref.id}/").content.decode()
    assert "(a queue you may not see)" not in whole
    # the secret member's handler shows (in its box and its row) to the superuser alone
    assert page.count("jobs.add") == whole.count("jobs.add") - 2 > 0
