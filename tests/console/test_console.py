"""The operator console through Django's test client: pages, permissions, actions, escaping."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.test import Client

from jobqueue import Queue, conf, get_job
from jobqueue.history.mirror import upsert
from jobqueue.models import Job
from jobqueue.spec import JobSpec
from tests import workers
from tests.jobapp import jobs

pytestmark = pytest.mark.django_db(transaction=True)

XSS = "<script>alert('x')</script>"


def staff(client: Client, *perms: str) -> Client:
    user = User.objects.create_user("op", "op@example.com", "pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=perms))
    client.login(username="op", password="pw")
    return client


def dead_job(arg: Any = XSS) -> str:
    return workers.dead_job(arg, f"ValueError: {XSS}")


def test_dashboard_shows_a_rate_limit_and_how_full_its_bucket_is(admin_client: Client,
                                                                    settings: Any) -> None:
    settings.JOBQUEUE = {**settings.JOBQUEUE, "QUEUES": {"default": {"rate": "10/m"}}}
    conf.reset()
    queue = Queue("default")
    queue.enqueue_many([JobSpec(i) for i in range(5)])
    assert "rate 10/m, bucket 10.0" in admin_client.get("/admin/jobqueue/job/live/").content.decode()
    assert len(queue.dequeue(count=5)) == 5
    page = admin_client.get("/admin/jobqueue/job/live/").content.decode()
    assert "rate 10/m, bucket 5.0" in page and "<meter" in page


def test_dashboard_lists_every_queue_with_counts_and_pause(admin_client: Client) -> None:
    jobs.add.enqueue_many([(1, 1)] * 3)
    jobs.add.using(queue="emails", lane="player-1").enqueue(1, 2)
    page = admin_client.get("/admin/jobqueue/job/live/").content.decode()
    assert 'data-queue="default"' in page and 'data-queue="emails"' in page
    assert ">3<" in page and 'value="Pause"' in page and "<svg" in page
    assert "player-1 (1)" in page


def test_non_staff_users_are_sent_to_the_login_page(client: Client) -> None:
    User.objects.create_user("joe", "joe@example.com", "pw")
    client.login(username="joe", password="pw")
    for url in ("/admin/jobqueue/job/live/", "/admin/jobqueue/job/live/find/?id=JOB00000000001",
                "/admin/jobqueue/job/live/stuck/"):
        response = client.get(url)
        assert response.status_code == 302 and "/admin/login/" in response["Location"]
    assert client.post("/admin/jobqueue/job/live/queues/default/pause/").status_code == 302
    assert not Queue("default").is_paused()


def test_find_leads_to_the_job_page_and_escapes_payload_and_error(admin_client: Client) -> None:
    job_id = dead_job()
    response = admin_client.get(f"/admin/jobqueue/job/live/find/?id={job_id}")
    assert response.status_code == 302
    assert response["Location"] == f"/admin/jobqueue/job/live/jobs/default/{job_id}/"
    page = admin_client.get(response["Location"]).content.decode()
    assert XSS not in page and "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
    assert 'value="Retry"' in page and 'value="Cancel"' not in page


def test_find_explains_unknown_text_and_ids(admin_client: Client) -> None:
    bad = admin_client.get("/admin/jobqueue/job/live/find/?id=<b>nope").content.decode()
    assert "No job has the id, lane, unique key or handler" in bad
    assert "&lt;b&gt;nope" in bad and "<b>nope" not in bad
    unknown = admin_client.get("/admin/jobqueue/job/live/find/?id=JOB00000000001")
    assert unknown.status_code == 200 and "No job JOB00000000001" in unknown.content.decode()
    assert admin_client.get("/admin/jobqueue/job/live/jobs/default/JOB00000000001/").status_code == 404
    assert admin_client.get("/admin/jobqueue/job/live/jobs/default/nope/").status_code == 404


def test_retry_reprioritize_cancel_and_their_log_entries(admin_client: Client) -> None:
    job_id = dead_job()
    assert admin_client.post(f"/admin/jobqueue/job/live/jobs/default/{job_id}/retry/").status_code == 302
    assert get_job(job_id).state == "pending"  # type: ignore[union-attr]
    url = f"/admin/jobqueue/job/live/jobs/default/{job_id}/"
    admin_client.post(url + "reprioritize/", {"priority": "42"})
    assert get_job(job_id).priority == 42  # type: ignore[union-attr]
    response = admin_client.post(url + "reprioritize/", {"priority": "500"}, follow=True)
    assert "-100…100" in response.content.decode() and get_job(job_id).priority == 42  # type: ignore[union-attr]
    confirm = admin_client.post(url + "cancel/")
    assert confirm.status_code == 200 and "Yes, cancel it" in confirm.content.decode()
    assert get_job(job_id).state == "pending"  # type: ignore[union-attr]
    admin_client.post(url + "cancel/", {"confirm": "yes"})
    assert get_job(job_id).state == "cancelled"  # type: ignore[union-attr]
    messages = list(LogEntry.objects.values_list("change_message", flat=True))
    assert len(messages) == 3 and any("priority 42" in m for m in messages)


def test_actions_need_their_own_permission(client: Client) -> None:
    job_id = dead_job()
    operator = staff(client, "view_job")
    assert operator.post(f"/admin/jobqueue/job/live/jobs/default/{job_id}/retry/").status_code == 403
    assert operator.post("/admin/jobqueue/job/live/queues/default/pause/").status_code == 403
    page = operator.get(f"/admin/jobqueue/job/live/jobs/default/{job_id}/").content.decode()
    assert 'value="Retry"' not in page
    assert get_job(job_id).state == "dead"  # type: ignore[union-attr]
    assert operator.get(f"/admin/jobqueue/job/live/jobs/default/{job_id}/retry/").status_code == 405


def test_pause_and_resume(admin_client: Client) -> None:
    jobs.add.enqueue(1, 1)
    admin_client.post("/admin/jobqueue/job/live/queues/default/pause/")
    assert Queue("default").is_paused()
    assert 'value="Resume"' in admin_client.get("/admin/jobqueue/job/live/").content.decode()
    admin_client.post("/admin/jobqueue/job/live/queues/default/resume/")
    assert not Queue("default").is_paused()


def test_queue_page_pages_through_jobs(admin_client: Client) -> None:
    jobs.add.enqueue_many([(i, i) for i in range(120)])
    page = admin_client.get("/admin/jobqueue/job/live/queues/default/?state=pending&page=3").content.decode()
    assert "page 3 of 3" in page
    assert page.count('<td><a href="/admin/jobqueue/job/live/jobs/default/JOB') == 20
    assert "<h2>Shards</h2>" in page
    assert admin_client.get("/admin/jobqueue/job/live/queues/default/?page=zz").status_code == 200
    assert admin_client.get("/admin/jobqueue/job/live/queues/a%20b/").status_code == 403


def test_stuck_view_shows_old_waits_and_dead_jobs(admin_client: Client) -> None:
    dead_job("stuck-dead")
    waiting = jobs.add.enqueue(1, 1)

    def page() -> str:
        return admin_client.get("/admin/jobqueue/job/live/stuck/?pending_over=1").content.decode()

    shown = page()
    assert "stuck-dead" not in shown  # payloads are not listed, ids are
    assert waiting.id not in shown
    workers.wait_for(lambda: waiting.id in page(), every=0.1)  # once it has waited a second
    shown = page()
    assert 'value="Retry"' in shown and 'value="Cancel"' in shown
    assert f'/admin/jobqueue/job/live/jobs/default/{waiting.id}/cancel/' in shown


def test_mirror_changelist_filters_and_bulk_retry_confirms_with_the_count(admin_client: Client) -> None:
    ids = [dead_job(i) for i in range(3)]
    queue = Queue("default")
    upsert([e for _, e in queue.client.xrange("emq:{default}:done")], "default")
    upsert([{"id": "JOB0000000000z", "state": "dead",
             "payload": '{"handler": "tests.jobapp.jobs.add", "args": [1, 2], "kwargs": {}}'}],
           "default")
    changelist = admin_client.get("/admin/jobqueue/job/?state__exact=dead").content.decode()
    assert all(i in changelist for i in ids)
    data = {"action": "retry_selected", "select_across": "1", "index": "0",
            "_selected_action": ids[:1]}
    confirm = admin_client.post("/admin/jobqueue/job/?state__exact=dead", data)
    assert '<b id="retry-count">4</b>' in confirm.content.decode()
    assert get_job(ids[0]).state == "dead"  # type: ignore[union-attr]
    admin_client.post("/admin/jobqueue/job/?state__exact=dead", {**data, "post": "yes"})
    assert {get_job(i).state for i in ids} == {"pending"}  # type: ignore[union-attr]
    recreated = get_job("JOB0000000000z")  # only in the mirror: re-created under its id
    assert recreated and recreated.source == "valkey" and recreated.state == "pending"
    assert Job.objects.count() == 4


def test_the_console_works_on_a_valkey_cluster(admin_client: Client, settings: Any,
                                               valkey_cluster: Any) -> None:
    settings.JOBQUEUE = {"URL": valkey_cluster.url, "QUEUES": {"wide": {"shards": 3}}}
    queue = Queue("wide")
    queue.client.flushall(target_nodes="primaries")
    refs = jobs.add.using(queue="wide").enqueue_many([(i, i) for i in range(30)])
    jobs.add.using(queue="wide", lane="p1").enqueue(1, 1)
    for url in ("/admin/jobqueue/job/live/", "/admin/jobqueue/job/live/queues/wide/?shard=2",
                "/admin/jobqueue/job/live/stuck/",
                f"/admin/jobqueue/job/live/jobs/wide/{refs[0].id}/"):
        response = admin_client.get(url)
        assert response.status_code == 200, url
    assert ">31<" in admin_client.get("/admin/jobqueue/job/live/").content.decode()
    admin_client.post("/admin/jobqueue/job/live/queues/wide/pause/")
    assert queue.is_paused() and queue.dequeue(count=5) == []


def test_mirror_changelist_filters_by_exact_lane_keeping_other_filters(admin_client: Client) -> None:
    upsert([{"id": f"JOB000000000{i:02d}", "state": "succeeded" if i % 2 else "dead",
             "lane": f"player-{i % 3}"} for i in range(12)], "default")
    page = admin_client.get("/admin/jobqueue/job/?state__exact=dead&lane=player-1").content.decode()
    shown = {f"JOB000000000{i:02d}" for i in range(12) if i % 2 == 0 and i % 3 == 1}
    assert all(i in page for i in shown)
    assert page.count("/admin/jobqueue/job/live/jobs/default/JOB") == len(shown)
    assert 'name="state__exact" value="dead"' in page and 'value="player-1"' in page


def test_stuck_view_flags_jobs_running_far_beyond_the_queues_usual_time(admin_client: Client) -> None:
    from datetime import UTC, datetime, timedelta

    finished = datetime.now(UTC)
    for i in range(30):  # the queue's history: runs of about half a second
        Job.objects.create(id=f"JOB00000000{i:03d}", queue="default", state="succeeded",
                           started_at=finished - timedelta(seconds=0.5), finished_at=finished)
    slow = jobs.add.enqueue(1, 1)
    quick = jobs.add.enqueue(2, 2)
    queue = Queue("default")
    leases = queue.dequeue(count=2, lease=60)
    queue.client.hset(f"emq:{{default}}:job:{slow.id}", "started_at",
                      int((time.time() - 5) * 1000))  # it has run for 5 s: 10× the usual
    page = admin_client.get("/admin/jobqueue/job/live/stuck/").content.decode()
    section = page.split("Running longer than")[1].split("Waiting longer than")[0]
    assert "3× the usual 0.50 s" in section and slow.id in section and quick.id not in section
    assert len(leases) == 2


def test_the_schedules_page_lists_ticks_and_runs_pauses_and_resumes(admin_client: Client,
                                                                     settings: Any) -> None:
    from jobqueue.conf import get_client
    from jobqueue.operations import schedule

    settings.JOBQUEUE = {**settings.JOBQUEUE, "SCHEDULE": {
        "nightly": {"job": "tests.jobapp.jobs.noop", "cron": "30 2 * * *", "timezone": "Europe/Paris"},
        "beat": {"job": "tests.jobapp.jobs.add", "every": 60, "args": [1, 2], "lane": "ops"}}}
    conf.reset()
    page = admin_client.get("/admin/jobqueue/job/live/schedules/").content.decode()
    assert "30 2 * * *" in page and "Europe/Paris" in page and "every 60 s" in page
    assert 'data-schedule="beat"' in page and "Run now" in page
    url = "/admin/jobqueue/job/live/schedules/beat/run/"
    assert "Run beat now?" in admin_client.post(url).content.decode()  # confirm first
    assert Queue("default").counts()["pending"] == 0
    assert admin_client.post(url, {"confirm": "yes"}).status_code == 302
    job_id = schedule.state(get_client())["beat"]["job"]
    info = get_job(job_id)
    assert info and info.lane == "ops" and info.payload == {
        "handler": "tests.jobapp.jobs.add", "args": [1, 2]}
    page = admin_client.get("/admin/jobqueue/job/live/schedules/").content.decode()
    assert f"/admin/jobqueue/job/live/jobs/default/{job_id}/" in page  # the last job, linked
    admin_client.post("/admin/jobqueue/job/live/schedules/beat/pause/")
    assert schedule.state(get_client())["beat"]["paused"]
    assert "paused" in admin_client.get("/admin/jobqueue/job/live/schedules/").content.decode()
    admin_client.post("/admin/jobqueue/job/live/schedules/beat/resume/")
    assert not schedule.state(get_client())["beat"].get("paused")
    assert LogEntry.objects.filter(change_message__startswith="Ran periodic job beat").exists()
    assert admin_client.post("/admin/jobqueue/job/live/schedules/gone/pause/").status_code == 404


def test_find_searches_lanes_unique_keys_and_handlers(admin_client: Client) -> None:
    finished = dead_job()  # jobs.always_fails, mirrored below
    in_lane = jobs.add.using(lane="tenant-7").enqueue_many([(1, 1), (2, 2)])
    keyed = jobs.add.using(unique_key="order-991").enqueue(3, 3)
    upsert([e for _, e in Queue("default").client.xrange("emq:{default}:done")], "default")

    def found(text: str) -> str:
        return admin_client.get("/admin/jobqueue/job/live/find/", {"id": text}).content.decode()

    page = found("tenant-7")
    assert all(ref.id in page for ref in in_lane) and keyed.id not in page
    assert keyed.id in found("order-991")
    assert finished in found("tests.jobapp.jobs.always_fails")


def test_the_workers_page_shows_what_each_worker_runs_its_rate_and_heartbeat(
        admin_client: Client) -> None:
    from jobqueue.worker import Worker, WorkerConfig
    from jobqueue.worker.executor import Outcome

    jobs.add.enqueue_many([(1, 2)] * 13)
    worker = Worker(WorkerConfig(queues=("default",), mirror=False, name="w-1"))
    worker.served.add(Queue("default"))
    leases = Queue("default").dequeue(count=13, worker="w-1")
    worker.held.add(leases)  # held, as while their handlers run
    running = leases.pop()
    for lease in leases:  # twelve of them finish, and are recorded as the main loop would
        worker.outcomes.finished(lease, Outcome(True, result="3"))
    worker.outcomes.record()
    worker.maintenance.advertise()
    page = admin_client.get("/admin/jobqueue/job/live/workers/").content.decode()
    assert 'data-worker="w-1"' in page and f"/admin/jobqueue/job/live/jobs/default/{running.job_id}/" in page
    assert "jobs/s" in page and "1/4" in page and "<td>12</td>" in page and "s ago" in page


def test_the_workers_page_counts_the_fresh_processes_that_took_a_workers_place(
        admin_client: Client) -> None:
    from jobqueue.worker import presence

    client = Queue("default").client
    for reason in ("max_jobs", "max_memory", "max_jobs"):  # (a recycled process says so)
        presence.recycled(client, "w-7", reason)
    presence.advertise(client, "w-7", {"pid": 1, "host": "h", "queues": ["default"],
                                       "running": 0, "concurrency": 4, "processed": 5,
                                       "failed": 0, "rate": 0.0, "jobs": []})
    page = admin_client.get("/admin/jobqueue/job/live/workers/").content.decode()
    assert "<th>recycled</th>" in page and "<td>0</td><td>3</td>" in page  # failed, recycled
    presence.goodbye(client, "w-7")  # its final stop: the count goes with it
    assert presence.workers(client) == [] and sorted(client.hkeys("{emq}:recycles")) == [
        "max_jobs", "max_memory"]


def test_the_job_page_lists_every_attempt(admin_client: Client) -> None:
    ref = jobs.always_fails.using(max_attempts=3).enqueue("x")
    queue = Queue("default")
    for n in range(3):
        [lease] = queue.dequeue(count=1, worker=f"w{n}")
        queue.nack(lease, f"boom {n} <b>", retry_in=0)
    info = queue.get(ref.id)
    assert info and info.state == "dead" and [a["attempt"] for a in info.history] == [1, 2]
    page = admin_client.get(f"/admin/jobqueue/job/live/jobs/default/{ref.id}/").content.decode()
    attempts = page[page.index('id="job-attempts"'):]
    assert all(f"boom {n} &lt;b&gt;" in attempts and f"w{n}" in attempts for n in range(3))
    upsert([e for _, e in queue.client.xrange("emq:{default}:done")], "default")
    assert [a["worker"] for a in Job.objects.get(pk=ref.id).info().history] == ["w0", "w1"]


def test_the_queue_page_shows_run_time_percentiles_per_handler(admin_client: Client) -> None:
    from datetime import UTC, datetime, timedelta

    start = datetime(2026, 11, 30, tzinfo=UTC)
    Job.objects.bulk_create(
        [Job(id=f"JOB{n:011d}", queue="default", state="succeeded", payload={"handler": handler},
             started_at=start, finished_at=start + timedelta(seconds=seconds))
         for n, (handler, seconds) in enumerate(
             [("app.jobs.fast", 0.01 * (i + 1)) for i in range(100)]
             + [("app.jobs.slow", 2.0 * (i + 1)) for i in range(10)], start=1)])
    page = admin_client.get("/admin/jobqueue/job/live/queues/default/").content.decode()
    table = page[page.index('class="jq-run-times"'):]
    assert table.index("app.jobs.slow") < table.index("app.jobs.fast")  # slowest first
    assert "0.500 s" in table and "0.950 s" in table and "10.000 s" in table


def test_the_admin_alone_mounts_the_console_and_links_to_it(admin_client: Client) -> None:
    """`INSTALLED_APPS` plus `admin.site.urls` is all it takes: the app index and the mirror's
    changelist lead to the console, and the root of the bundled project redirects there."""
    for url in ("/admin/jobqueue/", "/admin/jobqueue/job/"):
        assert 'href="/admin/jobqueue/job/live/"' in admin_client.get(url).content.decode()
    assert admin_client.get("/")["Location"] == "/admin/jobqueue/job/live/"


def test_a_project_can_mount_the_console_itself_and_its_links_stay_there(
        admin_client: Client, settings: Any) -> None:
    settings.ROOT_URLCONF = "tests.console_urlconf"
    job_id = dead_job()
    page = admin_client.get("/ops/jobs/").content.decode()
    assert 'href="/ops/jobs/stuck/"' in page and 'href="/ops/jobs/queues/default/"' in page
    found = admin_client.get(f"/ops/jobs/find/?id={job_id}")
    assert found["Location"] == f"/ops/jobs/jobs/default/{job_id}/"
    retried = admin_client.post(f"/ops/jobs/jobs/default/{job_id}/retry/")
    assert retried["Location"] == f"/ops/jobs/jobs/default/{job_id}/"


def test_the_queue_page_resizes_live_after_confirming_with_its_own_permission(
        admin_client: Client, client: Client) -> None:
    jobs.add.enqueue_many([(i, i) for i in range(10)])
    page = admin_client.get("/admin/jobqueue/job/live/queues/default/").content.decode()
    assert "1 live shard." in page and 'name="count"' in page
    url = "/admin/jobqueue/job/live/queues/default/resize/"
    confirm = admin_client.post(url, {"count": "3"}).content.decode()
    assert "from 1 to <b>3</b> live shards?" in confirm and Queue("default").shards == 1
    done = admin_client.post(url, {"count": "3", "confirm": "yes"})
    assert done.status_code == 302 and Queue("default").layout(fresh=True).live == 3
    assert LogEntry.objects.filter(change_message__contains="resized from 1 to 3").exists()
    page = admin_client.get(done["Location"]).content.decode()
    assert "3 live shards, settling from 1" in page or "3 live shards." in page
    for bad in ("0", "x", "2000", ""):
        shown = admin_client.post(url, {"count": bad, "confirm": "yes"}, follow=True).content.decode()
        assert "shard count must be an integer" in shown
    assert Queue("default").layout(fresh=True).live == 3
    operator = staff(client, "pause_queue")
    assert operator.post(url, {"count": "2", "confirm": "yes"}).status_code == 403
    assert 'name="count"' not in operator.get("/admin/jobqueue/job/live/queues/default/").content.decode()


def test_the_queue_page_shows_lane_caps_and_sets_one_live_with_its_own_permission(
        admin_client: Client, client: Client, settings: Any) -> None:
    settings.JOBQUEUE = {**settings.JOBQUEUE, "QUEUES": {"default": {"lane_concurrency": 2}}}
    conf.reset()
    jobs.add.using(lane="acme").enqueue_many([(i, i) for i in range(5)])
    Queue("default").dequeue(count=10)
    url = "/admin/jobqueue/job/live/queues/default/"
    page = admin_client.get(url).content.decode()
    assert "Caps from the settings: * 2" in page
    assert "<td>acme</td><td>2</td><td>2</td>" in page and "at its cap" in page
    done = admin_client.post(url + "set_lane_concurrency/", {"lane": "acme", "cap": "4"})
    assert done.status_code == 302 and Queue("default").dequeue(count=10)  # raised: 2 more
    assert LogEntry.objects.filter(change_message__contains="lane acme now runs at most 4").exists()
    page = admin_client.get(url).content.decode()
    assert "<td>acme</td><td>4</td><td>4</td>" in page and "set live" in page
    for bad in ({"lane": "acme", "cap": "0"}, {"lane": "a b", "cap": "3"}, {"lane": "", "cap": "3"},
                {"lane": "acme", "cap": "lots"}):
        shown = admin_client.post(url + "set_lane_concurrency/", bad, follow=True).content.decode()
        assert "Lane cap on default:" in shown
    admin_client.post(url + "set_lane_concurrency/", {"lane": "acme", "cap": ""})
    assert "set live" not in admin_client.get(url).content.decode()
    operator = staff(client, "pause_queue")
    assert operator.post(url + "set_lane_concurrency/", {"lane": "acme", "cap": "9"}).status_code == 403
    assert 'value="Set lane cap"' not in operator.get(url).content.decode()


def test_the_queue_page_shows_the_global_cap_and_sets_it_live_with_its_own_permission(
        admin_client: Client, client: Client, settings: Any) -> None:
    settings.JOBQUEUE = {**settings.JOBQUEUE, "QUEUES": {"default": {"global_concurrency": 2}}}
    conf.reset()
    jobs.add.enqueue_many([(i, i) for i in range(5)])
    assert len(Queue("default").dequeue(count=10)) == 2
    url = "/admin/jobqueue/job/live/queues/default/"
    page = admin_client.get(url).content.decode()
    assert "At most 2 job(s) of the queue run at once" in page and "(settings); 2 permit(s)" in page
    done = admin_client.post(url + "set_global_concurrency/", {"cap": "3"})
    assert done.status_code == 302 and len(Queue("default").dequeue(count=10)) == 1  # raised
    assert LogEntry.objects.filter(change_message__contains="at most 3 job(s) at once").exists()
    assert "At most 3 job(s)" in admin_client.get(url).content.decode()
    for bad in ("0", "lots", "-1", ""):  # (a blank field is no cap: lifting is a button)
        shown = admin_client.post(url + "set_global_concurrency/", {"cap": bad},
                                  follow=True).content.decode()
        assert "Global cap on default:" in shown
    assert "At most 3 job(s)" in admin_client.get(url).content.decode()
    admin_client.post(url + "set_global_concurrency/", {"cap": "", "lift": "1"})
    page = admin_client.get(url).content.decode()
    assert "No global cap (lifted live)" in page and 'value="Set global cap"' in page
    admin_client.post(url + "set_global_concurrency/", {"cap": "", "settings": "1"})
    page = admin_client.get(url).content.decode()
    assert "At most 2 job(s) of the queue run at once" in page and "(settings);" in page
    client_ = Queue("default").client
    assert client_.get("emq:{default#cap}:limit") is None
    assert client_.hget(Queue("default").shard(0).key("meta"), "gcap") is None
    operator = staff(client, "pause_queue")
    assert operator.post(url + "set_global_concurrency/", {"cap": "9"}).status_code == 403
    assert 'value="Set global cap"' not in operator.get(url).content.decode()


def test_expired_jobs_are_counted_shown_and_retryable(admin_client: Client) -> None:
    from tests.servers import server_ms

    queue = Queue("default")
    ref = jobs.add.using(expires=0.05).enqueue(1, 1)
    expires = int(queue.client.hget(queue.shard(0).job(ref.id), "expires_at"))
    workers.wait_for(lambda: server_ms(queue.client) > expires)
    assert queue.dequeue(count=1) == []
    assert "<th>expired</th>" in admin_client.get("/admin/jobqueue/job/live/").content.decode()
    page = admin_client.get(f"/admin/jobqueue/job/live/jobs/default/{ref.id}/").content.decode()
    assert "expired" in page and 'value="Retry"' in page
    admin_client.post(f"/admin/jobqueue/job/live/jobs/default/{ref.id}/retry/")
    assert get_job(ref.id).state == "pending"  # type: ignore[union-attr]


def test_the_flow_page_pages_a_large_flow_and_a_job_page_bounds_what_it_waits_for(
        admin_client: Client) -> None:
    from jobqueue import chord

    ref = chord([jobs.add.s(i, 1) for i in range(130)], jobs.total.s()).enqueue()
    base = "/admin/jobqueue/job/live"
    first = admin_client.get(f"{base}/flows/default/{ref.id}/").content.decode()
    assert first.count("<code>tests.jobapp.jobs.add</code>") == 50 and "page 1 of 3" in first
    assert "pending: <b>130</b>" in first and "waiting: <b>1</b>" in first  # the whole flow
    assert f'id="flow-callback">{ref.id}' in first
    last = admin_client.get(f"{base}/flows/default/{ref.id}/?page=3").content.decode()
    assert last.count("<code>tests.jobapp.jobs.add</code>") == 30 and "page 3 of 3" in last
    assert "<code>tests.jobapp.jobs.total</code>" in last and "130 jobs" in last
    assert last.count(f"{base}/jobs/default/JOB") <= 32 + 20  # its rows, at most 20 it waits for
    page = admin_client.get(f"{base}/jobs/default/{ref.id}/").content.decode()
    waits = page[page.index('id="job-flow"'):page.index("</tr>", page.index('id="job-flow"'))]
    assert "130 jobs" in waits and waits.count(f"{base}/jobs/default/JOB") == 20
    assert admin_client.get(f"{base}/flows/default/{ref.id}/?page=zz").status_code == 200


def test_the_stuck_and_queue_pages_never_pull_the_payloads_they_do_not_show(
        admin_client: Client) -> None:
    queue = Queue("default")
    jobs.add.enqueue_many([("x" * 200_000, i) for i in range(5)])
    assert len(queue.dequeue(count=5, lease=60)) == 5

    def sent() -> int:
        return int(queue.client.info("stats")["total_net_output_bytes"])

    for url in ("/admin/jobqueue/job/live/stuck/?running_over=1",
                "/admin/jobqueue/job/live/queues/default/?state=active"):
        before = sent()
        assert admin_client.get(url).status_code == 200
        assert sent() - before < 100_000, url  # five payloads are a million bytes


def test_a_search_reads_the_history_through_indexes_only(admin_client: Client) -> None:
    """The history search (lane, unique key, handler) runs no scan of the table, on any of the
    databases: a search that matches nothing costs as little as one that matches."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from jobqueue.console import readmodels

    Job.objects.bulk_create(
        [Job(id=f"JOB{n:011d}", queue="default", state="succeeded", lane=f"tenant-{n % 30}",
             unique_key=f"order-{n}", payload={"handler": f"app.jobs.h{n % 7}", "args": [n]})
         for n in range(1, 301)])
    for text, found in (("nothing-matches", 0), ("tenant-3", 10), ("order-42", 1),
                        ("app.jobs.h2", 43)):
        with CaptureQueriesContext(connection) as queries:
            assert len(readmodels.search(text)) == found, text
        selects = [q["sql"] for q in queries.captured_queries if "jobqueue_job" in q["sql"]]
        assert selects and all(_reads_through_an_index(sql) for sql in selects), selects



def test_a_payload_of_any_shape_is_mirrored_and_its_handler_found() -> None:
    """The handler column the search uses is the database's own reading of the payload: a
    payload without one, or with a long or odd one, is mirrored all the same."""
    import json

    from jobqueue.console import readmodels

    long = "app.jobs." + "x" * 300
    payloads = ['{"handler": "app.jobs.a", "args": []}', "[1, 2]", '"text"', '{"handler": 5}',
                '{"handler": {"x": 1}}', json.dumps({"handler": long}), "", "{}"]
    ids = [f"JOB{n:011d}" for n in range(1, len(payloads) + 1)]
    upsert([{"id": job_id, "state": "dead", "payload": payload}
            for job_id, payload in zip(ids, payloads, strict=True)], "default")
    handlers = dict(Job.objects.values_list("id", "handler"))
    assert len(handlers) == len(payloads)
    assert handlers[ids[0]] == "app.jobs.a" and handlers[ids[5]] == long[:200]
    assert handlers[ids[1]] is None and handlers[ids[2]] is None and handlers[ids[6]] is None
    assert [info.id for info in readmodels.search("app.jobs.a")] == [ids[0]]
    assert [info.id for info in readmodels.search(long[:200])] == [ids[5]]

def _reads_through_an_index(sql: str) -> bool:
    """Whether the database's plan for `sql` reads `jobqueue_job` only through an index lookup
    (no scan of the table, nor of a whole index)."""
    from django.db import connection

    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute("EXPLAIN " + sql)
            names = [column[0] for column in cursor.description]
            rows = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
            return all(row["type"] not in ("ALL", "index") for row in rows
                       if row["table"] == "jobqueue_job")
        if connection.vendor == "sqlite":
            cursor.execute("EXPLAIN QUERY PLAN " + sql)
            steps = [row[-1] for row in cursor.fetchall() if "jobqueue_job" in row[-1]]
            return bool(steps) and all(step.startswith("SEARCH") for step in steps)
        cursor.execute("SET enable_seqscan = off")  # (a tiny table is scanned whatever its indexes)
        try:
            cursor.execute("EXPLAIN " + sql)
            plan = "\n".join(row[0] for row in cursor.fetchall())
        finally:
            cursor.execute("RESET enable_seqscan")
        return "Seq Scan" not in plan and "Filter:" not in plan


def test_the_job_page_shows_the_run_limit_and_a_timed_out_attempt(admin_client: Client) -> None:
    ref = jobs.always_fails.using(timeout=1.5, max_attempts=2).enqueue("x")
    queue = Queue("default")
    [lease] = queue.dequeue(count=1, worker="w0")
    queue.nack(lease, "jobqueue.exceptions.JobTimeout: the run passed its timeout of 1.5 s",
               retry_in=0)
    page = admin_client.get(f"/admin/jobqueue/job/live/jobs/default/{ref.id}/").content.decode()
    assert "1.5 s per run" in page[page.index('id="job-timeout"'):]
    assert "JobTimeout" in page[page.index('id="job-attempts"'):]


def test_the_workers_page_and_the_metrics_show_overrunning_runs(admin_client: Client) -> None:
    from jobqueue.worker import Worker, WorkerConfig

    worker = Worker(WorkerConfig(queues=("default",), mirror=False, name="w-1"))
    worker.served.add(Queue("default"))
    worker.held.overrun()  # (a run past its timeout whose thread has not returned)
    worker.maintenance.advertise()
    page = admin_client.get("/admin/jobqueue/job/live/workers/").content.decode()
    assert "+ 1 overrunning" in page
    metrics = admin_client.get("/metrics").content.decode()
    assert 'jobqueue_overrunning_runs{worker="w-1"} 1.0' in metrics
