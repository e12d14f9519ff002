"""The console's history charts, its enqueue form and the periodic jobs kept in the database,
through Django's test client (the browser drives them in test_browser_round_two.py)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import User
from django.test import Client

from jobqueue import Queue, conf
from jobqueue.history.mirror import upsert
from jobqueue.models import Schedule
from tests.console.test_console import staff
from tests.history.test_rollup import event

pytestmark = pytest.mark.django_db(transaction=True)
CHARTS, ENQUEUE = "/admin/jobqueue/job/live/charts/", "/admin/jobqueue/job/live/enqueue/"




def history_rows() -> None:
    now = datetime.now(UTC)
    upsert(
        [
            event(
                i, "app.jobs.send", "succeeded" if i % 4 else "dead", 20, 100 + i, now - timedelta(minutes=i)
            )
            for i in range(40)
        ],
        "default",
    )
    upsert(
        [
            event(100 + i, "app.jobs.<b>bill</b>", "succeeded", 5, 10, now - timedelta(days=3))
            for i in range(5)
        ],
        "emails",
    )


@pytest.mark.parametrize("span", ["hour", "day", "week", "month", "bogus"])
def test_the_charts_page_draws_each_range(admin_client: Client, span: str) -> None:
    history_rows()
    page = admin_client.get(CHARTS, {"range": span}).content.decode()
    assert page.count('class="jq-history-chart"') == 4 and "<script" not in page.split("jq-nav")[1]
    finished = {"hour": 40, "day": 40, "week": 45, "month": 45, "bogus": 40}[span]
    assert f"{finished} job(s) finished" in page
    assert 'data-handler="app.jobs.send"' in page
    assert "<b>bill</b>" not in page and ("&lt;b&gt;bill&lt;/b&gt;" in page) == (finished == 45)


def test_the_charts_page_narrows_to_a_queue_and_a_handler(admin_client: Client) -> None:
    history_rows()
    page = admin_client.get(CHARTS, {"range": "week", "queue": "emails"}).content.decode()
    assert "5 job(s) finished" in page and 'data-handler="app.jobs.send"' not in page
    page = admin_client.get(CHARTS, {"range": "hour", "handler": "app.jobs.send"}).content.decode()
    assert "40 job(s) finished" in page and "dead" in page
    queue = admin_client.get("/admin/jobqueue/job/live/queues/emails/").content.decode()
    assert f"{CHARTS}?range=day&amp;queue=emails" in queue


def test_the_charts_follow_the_queues_a_user_may_see(admin_client: Client, monkeypatch: Any) -> None:
    """Every read goes through `ConsoleSite.visible_queues` (per-queue access narrows it)."""
    from jobqueue.console.site import ConsoleSite

    history_rows()
    monkeypatch.setattr(ConsoleSite, "visible_queues", lambda self, request: frozenset({"emails"}))
    page = admin_client.get(CHARTS, {"range": "week"}).content.decode()
    assert "5 job(s) finished" in page and 'data-queue="default"' not in page
    page = admin_client.get(CHARTS, {"range": "week", "queue": "default"}).content.decode()
    assert "0 job(s) finished" in page  # (enqueue asks `access.may_act`: test_access_review.py)


def test_the_charts_page_needs_the_view_permission(client: Client) -> None:
    assert staff(client).get(CHARTS).status_code == 403


# -- enqueue ------------------------------------------------------------------------------------


def test_an_operator_enqueues_a_job_and_lands_on_its_page(admin_client: Client) -> None:
    form = admin_client.get(ENQUEUE).content.decode()
    assert 'value="tests.jobapp.jobs.add"' in form and "csrfmiddlewaretoken" in form
    response = admin_client.post(
        ENQUEUE,
        {
            "handler": "tests.jobapp.jobs.add",
            "args": "[2, 3]",
            "kwargs": "{}",
            "queue": "emails",
            "lane": "tenant-7",
            "priority": "7",
            "delay": "",
            "max_attempts": "4",
        },
    )
    assert response.status_code == 302
    queue, job_id = response["Location"].rstrip("/").split("/")[-2:]
    info = Queue(queue).get(job_id)
    assert queue == "emails" and info is not None
    assert (info.payload, info.lane, info.priority, info.max_attempts) == (
        {"handler": "tests.jobapp.jobs.add", "args": [2, 3]},
        "tenant-7",
        7,
        4,
    )
    entry = LogEntry.objects.get()
    assert entry.object_id == job_id and "Enqueued job" in entry.change_message
    page = admin_client.get(response["Location"]).content.decode()
    assert f"Enqueued job {job_id}" in page


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"handler": "tests.jobapp.jobs.nope"}, "handler", "Select a valid choice"),
        ({"args": "[1,"}, "args", "args is not JSON"),
        ({"args": '{"a": 1}'}, "args", "args must be a JSON list"),
        ({"kwargs": "[1]"}, "kwargs", "kwargs must be a JSON object"),
        ({"priority": "500"}, "priority", "priority must be an integer in -100…100, got 500"),
        ({"priority": "high"}, "priority", "Enter a whole number"),
        ({"lease": "0"}, "lease", "lease must be within 0.001…86400 seconds"),
        ({"max_attempts": "0"}, "max_attempts", "max_attempts must be an integer in 1…1000"),
        ({"debounce": "5"}, "debounce", "debounce needs a unique_key"),
        ({"queue": "bad queue!"}, "queue", "queue"),
        ({"lane": "x" * 300}, "lane", "lane"),
        ({"job_id": "nope"}, "job_id", "malformed id"),
    ],
)
def test_the_enqueue_form_shows_what_enqueue_refuses(
    admin_client: Client, fields: dict[str, str], field: str | None, message: str
) -> None:
    data = {"handler": "tests.jobapp.jobs.add", "args": "[1, 2]", "kwargs": "{}", **fields}
    response = admin_client.post(ENQUEUE, data)
    page = response.content.decode()
    assert response.status_code == 400 and message.replace("'", "&#x27;") in page, page[-3000:]
    if field is not None:
        assert f'data-field="{field}"' in page
    assert sum(Queue(n).counts()["pending"] for n in ("default", "emails")) == 0
    assert not LogEntry.objects.exists()


def test_enqueueing_needs_its_own_permission_and_a_csrf_token(client: Client) -> None:
    viewer = staff(client, "view_job")
    assert viewer.get(ENQUEUE).status_code == 403
    assert viewer.post(ENQUEUE, {"handler": "tests.jobapp.jobs.noop"}).status_code == 403
    assert "Enqueue a job" not in viewer.get("/admin/jobqueue/job/live/").content.decode()
    checked = Client(enforce_csrf_checks=True)
    checked.force_login(User.objects.create_superuser("su", "su@example.com", "pw"))
    assert checked.post(ENQUEUE, {"handler": "tests.jobapp.jobs.noop"}).status_code == 403
    assert Queue("default").counts()["pending"] == 0


# -- periodic jobs in the database ----------------------------------------------------------------

ADD = "/admin/jobqueue/schedule/add/"


def schedule_form(**fields: Any) -> dict[str, Any]:
    return {
        "name": "nightly",
        "job": "tests.jobapp.jobs.noop",
        "cron": "",
        "every": "",
        "timezone": "UTC",
        "args": "[]",
        "kwargs": "{}",
        "queue": "",
        "lane": "",
        "priority": "",
        "enabled": "on",
        **fields,
    }


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"job": "tests.jobapp.jobs.nope"}, "no @job handler registered as"),
        ({"cron": "61 * * * *"}, "cron minute"),
        ({"cron": "* * *"}, "must have five fields"),
        ({"every": "5", "cron": "0 * * * *"}, "give exactly one of"),
        ({}, "give exactly one of"),
        ({"every": "0.5"}, "&#x27;every&#x27; must be seconds"),
        ({"every": "5", "timezone": "Mars/Base"}, "unknown timezone"),
        ({"every": "5", "priority": "300"}, "priority must be an integer"),
        ({"every": "5", "queue": "no spaces"}, "queue"),
        ({"every": "5", "args": '{"a": 1}'}, "must be a JSON list"),
        ({"every": "5", "name": "beat"}, "JOBQUEUE[&#x27;SCHEDULE&#x27;] has an entry named"),
    ],
)
def test_the_schedule_form_refuses_what_the_settings_would(
    admin_client: Client, settings: Any, fields: dict[str, str], message: str
) -> None:
    settings.JOBQUEUE = {
        **settings.JOBQUEUE,
        "SCHEDULE": {"beat": {"job": "tests.jobapp.jobs.noop", "every": 60}},
    }
    conf.reset()
    response = admin_client.post(ADD, schedule_form(**fields))
    page = response.content.decode()
    assert response.status_code == 200 and message in page, page[page.find("errorlist") - 200 :][:2000]
    assert not Schedule.objects.exists()


def test_schedules_from_both_places_are_listed_the_settings_ones_read_only(
    admin_client: Client, settings: Any
) -> None:
    settings.JOBQUEUE = {
        **settings.JOBQUEUE,
        "SCHEDULE": {"beat": {"job": "tests.jobapp.jobs.noop", "every": 60}},
    }
    conf.reset()
    response = admin_client.post(ADD, schedule_form(cron="30 2 * * *", kwargs='{"a": 1}'))
    assert response.status_code == 302
    Schedule.objects.create(name="off", job="tests.jobapp.jobs.noop", every=5, enabled=False)
    admin = admin_client.get("/admin/jobqueue/schedule/").content.decode()
    assert 'id="jq-settings-schedules"' in admin and 'data-schedule="beat"' in admin
    assert "nightly" in admin
    page = admin_client.get("/admin/jobqueue/job/live/schedules/").content.decode()
    for name in ("beat", "nightly", "off"):
        assert f'data-schedule="{name}"' in page
    assert "settings (read-only)" in page and "— (disabled)" in page
    run = admin_client.post("/admin/jobqueue/job/live/schedules/nightly/run/", {"confirm": "yes"})
    assert run.status_code == 302 and Queue("default").counts()["pending"] == 1
    assert json.loads(json.dumps(Schedule.objects.get(name="nightly").kwargs)) == {"a": 1}
