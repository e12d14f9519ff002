"""What a curious staff user or a leaked error page can get: every console page wants Django's
view permission on jobs, forms refuse numbers too long to parse, an action names the job's own
queue, /metrics compares its token as bytes, and error reports hide the Valkey password."""

from __future__ import annotations

import secrets
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse
from django.views.debug import ExceptionReporter

from jobqueue import Queue, chain, conf
from jobqueue.conf import get_client
from jobqueue.embedded import free_port
from jobqueue.history.mirror import upsert
from jobqueue.models import BulkOperation
from jobqueue.operations import schedule
from jobqueue.urls import console_urls
from tests import workers
from tests.jobapp import jobs

pytestmark = pytest.mark.django_db(transaction=True)

def every_console_url(job_id: str, flow_id: str, bulk_id: int = 1) -> list[tuple[str, str]]:
    """(method, path) of everything the console mounts: each page by GET, each action (a view
    that takes POSTs only) by POST, read from `console_urls`, so that a page or action added
    later is tried too."""
    values = {"name": "default", "queue": "default", "job_id": job_id, "flow_id": flow_id,
              "pk": bulk_id}
    found = []
    for pattern in console_urls(admin.site):
        kwargs = {key: values.get(key) for key in pattern.pattern.converters}
        if str(pattern.pattern).startswith("schedules/<"):
            kwargs["name"] = "beat"
        view_class = getattr(pattern.callback, "view_class", None)
        posted = view_class is not None and view_class.http_method_names == ["post"]
        found.append(("POST" if posted else "GET", reverse(f"admin:{pattern.name}", kwargs=kwargs)))
    return found


def user_with(client: Client, *codenames: str) -> Client:
    """`client` logged in as a staff user with exactly these jobqueue permissions."""
    user = User.objects.create_user("op", "op@example.com", "pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="jobqueue",
                                                        codename__in=codenames))
    client.force_login(user)
    return client


def test_every_console_page_and_action_wants_view_job_even_from_staff(client: Client,
                                                                       settings: Any) -> None:
    settings.JOBQUEUE = {**settings.JOBQUEUE,
                         "SCHEDULE": {"beat": {"job": "tests.jobapp.jobs.noop", "every": 60}}}
    job_id = workers.dead_job({"api_key": "k-123"}, "ValueError: with the key k-123")
    flow = chain(jobs.add.s(1, 1), jobs.add.s(2)).enqueue()
    counted = BulkOperation.objects.create(action="retry", query={"state": "dead"},
                                           status="counted", total=1)
    urls = every_console_url(job_id, flow.id, counted.pk)
    assert len(urls) == 25 and sum(method == "POST" for method, _ in urls) == 13
    enqueue = reverse("admin:jobqueue_enqueue")
    urls.append(("POST", enqueue))  # (its form is a GET, the enqueue a POST)
    every_right = [p.codename for p in Permission.objects.filter(content_type__app_label="jobqueue")
                   if p.codename not in ("view_job", "change_job")]
    curious = user_with(client, *every_right)
    for method, path in urls:
        response = curious.get(path) if method == "GET" else curious.post(
            path, {"priority": "5", "count": "2", "confirm": "yes", "lane": "acme", "cap": "3",
                   "action": "retry", "state": "dead", "handler": "tests.jobapp.jobs.noop"})
        assert response.status_code == 403, (method, path)
        assert "k-123" not in response.content.decode()
    queue = Queue("default")
    assert queue.get(job_id).state == "dead" and not queue.is_paused()  # type: ignore[union-attr]
    assert queue.layout(fresh=True).live == 1 and not LogEntry.objects.exists()  # (nor enqueued)
    assert list(BulkOperation.objects.values_list("status", flat=True)) == ["counted"]
    assert queue.client.get("emq:{default#cap}:limit") is None  # (no global cap set)
    assert not schedule.state(get_client()).get("beat", {}).get("paused")
    User.objects.all().delete()
    viewer = user_with(client, "view_job")
    for path in [path for method, path in urls if method == "GET"]:
        assert viewer.get(path).status_code == (403 if path == enqueue else 200), path


def test_a_retry_through_another_queues_url_finds_no_job_and_logs_nothing(client: Client) -> None:
    User.objects.create_superuser("root", "root@example.com", "pw")
    client.login(username="root", password="pw")
    job_id = "JOB0000000000e"
    upsert([{"id": job_id, "state": "dead", "payload": '{"handler": "tests.jobapp.jobs.add", '
             '"args": [1, 2]}'}], "emails")  # only in the history, of queue emails
    base = "/admin/jobqueue/job/live/jobs"
    assert client.post(f"{base}/default/{job_id}/retry/").status_code == 404
    assert client.get(f"{base}/default/{job_id}/").status_code == 404
    assert Queue("emails").get(job_id) is None and not LogEntry.objects.exists()
    assert client.post(f"{base}/emails/{job_id}/retry/").status_code == 302
    assert Queue("emails").get(job_id).state == "pending"  # type: ignore[union-attr]
    [entry] = LogEntry.objects.all()
    assert "(emails," in entry.object_repr


def test_numbers_too_long_to_parse_are_a_form_error_not_a_500(client: Client) -> None:
    User.objects.create_superuser("root", "root@example.com", "pw")
    client.login(username="root", password="pw")
    huge = "9" * 5000
    url = "/admin/jobqueue/job/live/queues/default/"
    for action, data, said in [
            ("resize", {"count": huge, "confirm": "yes"}, "shard count must be an integer"),
            ("resize", {"count": "٣"}, "shard count must be an integer"),
            ("set_lane_concurrency", {"lane": "acme", "cap": huge}, "Lane cap on default:"),
            ("set_lane_concurrency", {"lane": "acme", "cap": "٣"}, "Lane cap on default:")]:
        response = client.post(url + action + "/", data, follow=True)
        assert response.status_code == 200 and said in response.content.decode(), (action, data)
    assert Queue("default").layout(fresh=True).live == 1 and not LogEntry.objects.exists()
    ref = jobs.add.enqueue(1, 1)
    shown = client.post(f"/admin/jobqueue/job/live/jobs/default/{ref.id}/reprioritize/",
                        {"priority": huge}, follow=True).content.decode()
    assert "-100…100" in shown and Queue("default").get(ref.id).priority == 0  # type: ignore[union-attr]
    for query in (f"?page={huge}", f"?shard={huge}", f"stuck/?pending_over={huge}"):
        path = url + query if not query.startswith("stuck") else "/admin/jobqueue/job/live/" + query
        assert client.get(path).status_code == 200, query


def test_metrics_compare_the_token_as_bytes(client: Client, settings: Any) -> None:
    settings.JOBQUEUE = {**settings.JOBQUEUE, "METRICS_TOKEN": "s3cret"}
    conf.reset()
    for header in ("Bearer é", "Bearer s3cret\u20ac", "é", "Bearer s3cret "):
        assert client.get("/metrics", HTTP_AUTHORIZATION=header).status_code == 401, header
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret").status_code == 200
    settings.JOBQUEUE = {**settings.JOBQUEUE, "METRICS_TOKEN": "sécret"}
    conf.reset()
    # A WSGI server hands header bytes over as Latin-1 text: the UTF-8 of "é" is "Ã©" there.
    utf8 = "Bearer sécret".encode().decode("latin-1")
    assert client.get("/metrics", HTTP_AUTHORIZATION=utf8).status_code == 200


def test_error_pages_and_reports_hide_the_valkey_password_and_the_metrics_token(
        settings: Any, caplog: pytest.LogCaptureFixture) -> None:
    """Valkey down behind a password, /metrics asked with its token: the debug page (DEBUG on)
    does not show the password; the report a production site mails or logs (DEBUG off, built
    as Django's AdminEmailHandler builds it) shows neither, the view's own variables included."""
    password, token = secrets.token_hex(8), secrets.token_hex(8)
    port = free_port()  # nothing listens there
    settings.JOBQUEUE = {"URL": f"redis://jq:{password}@127.0.0.1:{port}/0", "METRICS_TOKEN": token}
    conf.reset()
    client = Client(raise_request_exception=False)
    settings.DEBUG = True
    page = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {token}").content.decode()
    assert "JOBQUEUE" in page and f"redis://********************@127.0.0.1:{port}/0" in page
    assert password not in page
    settings.DEBUG = False
    caplog.clear()
    assert client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {token}").status_code == 500
    [logged] = [r for r in caplog.records if r.name == "django.request" and r.exc_info]
    report = ExceptionReporter(logged.request, *logged.exc_info, is_email=True)  # type: ignore[attr-defined, misc]
    for shown in (report.get_traceback_html(), report.get_traceback_text()):
        assert "metrics.py" in shown and "JOBQUEUE" in shown
        assert password not in shown and token not in shown
