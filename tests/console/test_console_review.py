"""What a review of the console's second round found: bad input in a search or an id typed into
a URL is one clear answer (never a 500, on any of the three databases: run this module with
DATABASE_URL), a bulk operation's page masks a hidden argument in its filter, and a bulk
operation of queues a user may not see is a 404 to them, as any id typed into a URL is."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from jobqueue import Queue
from jobqueue.models import BulkOperation
from tests import workers
from tests.console.test_access import member
from tests.console.test_search import hiding, row  # noqa: F401 (a fixture)

pytestmark = pytest.mark.django_db(transaction=True)
LIVE = "/admin/jobqueue/job/live"


@pytest.mark.parametrize(
    "q",
    [
        "\x00",
        "kwargs.a=\x00",
        "kwargs.a~x\x00",  # (PostgreSQL's text holds no NUL)
        '"\\u0000"',
        'kwargs.a="\\u0000"',
        'kwargs.a~"\\u0000"',
        '"\\ud800"',
        'kwargs.a="\\ud800"',
        'kwargs.a~"\\ud800"',  # (a lone surrogate: no UTF-8)
    ],
)
@pytest.mark.parametrize("where", ["live", "history"])
def test_a_search_with_text_no_database_stores_is_one_clear_error(
    admin_client: Client, q: str, where: str
) -> None:
    row("JOBhist0000001", 42, order={"id": 42})
    response = admin_client.get(f"{LIVE}/search/", {"q": q, "where": where})
    assert response.status_code == 400, response.content.decode()[-2000:]
    assert 'id="search-error"' in response.content.decode()


@pytest.mark.parametrize("params", [{"handler": "a\x00"}, {"lane": "a\x00"}, {"queue": "a\x00"}])
def test_a_search_field_with_a_nul_is_one_clear_error(admin_client: Client, params: dict[str, str]) -> None:
    response = admin_client.get(f"{LIVE}/search/", {**params, "where": "history"})
    assert response.status_code == 400, response.content.decode()[-2000:]


@pytest.mark.parametrize(
    "url",
    [
        f"{LIVE}/find/?id=%00",
        f"{LIVE}/find/?id=a%00b",
        "/admin/jobqueue/job/%00/change/",
        "/admin/jobqueue/job/%00/history/",
        "/admin/jobqueue/job/?lane=%00",
        f"{LIVE}/bulk/99999999999999999999999/",
        f"{LIVE}/jobs/default/%00/",
        f"{LIVE}/flows/default/%00/",
        f"{LIVE}/search/?q=args.99999999999999999999999%3D1&where=history",
    ],
)
def test_an_id_no_job_can_have_typed_into_a_url_is_never_a_500(admin_client: Client, url: str) -> None:
    row("JOBhist0000001", 42)
    assert admin_client.get(url).status_code in (200, 302, 400, 403, 404)
    assert (
        admin_client.post(f"{LIVE}/bulk/99999999999999999999999/decide/", {"confirm": "yes"}).status_code
        == 404
    )


def test_a_bulk_operations_page_masks_a_hidden_argument_in_its_filter(client: Client, hiding: None) -> None:  # noqa: F811
    """Who may see hidden arguments searched by one and acted on what it matched; the page of
    that operation, seen by one who may not, shows the filter with the value masked."""
    row("JOBpaid0000001", "bob", queue="payments", card="5511-1111")
    boss = member(client, "boss", superuser=True)
    response = boss.post(
        f"{LIVE}/search/bulk/", {"q": "kwargs.card=5511-1111", "where": "history", "action": "delete"}
    )
    assert response.status_code == 302 and "/bulk/" in response["Location"], response
    url = response["Location"]
    assert "5511-1111" in boss.get(url).content.decode()  # (they may see it)
    op = member(Client(), "op")  # every jobqueue permission ...
    User.objects.get(username="op").user_permissions.remove(  # ... but this one
        Permission.objects.get(codename="view_hidden_args")
    )
    page = op.get(url)
    assert page.status_code == 200
    assert "5511-1111" not in page.content.decode() and "kwargs.card=•••" in page.content.decode()
    workers.wait_for(lambda: BulkOperation.objects.get().status == "counted", timeout=30)
    assert "5511-1111" not in op.get(url).content.decode()


def test_a_bulk_operation_over_queues_a_user_may_not_see_is_a_404_to_them(
    client: Client, settings: Any
) -> None:
    """Its page and its decision both: the same answer as for an operation that does not exist."""
    from jobqueue import conf

    settings.JOBQUEUE = {
        **settings.JOBQUEUE,
        "CONSOLE": {"ACCESS": {"billing": {"view": ["support"]}, "secret": {"act": ["ops"]}}},
    }
    conf.reset()
    Queue("secret").enqueue({"handler": "tests.jobapp.jobs.add", "args": [1, 1]})
    ops = member(client, "olga", "ops")
    response = ops.post(f"{LIVE}/search/bulk/", {"queue": "secret", "where": "live", "action": "cancel"})
    assert response.status_code == 302 and "/bulk/" in response["Location"], response
    url = response["Location"]
    sam = member(Client(), "sam", "support")
    assert sam.get(url).status_code == 404
    assert sam.post(url + "decide/", {"confirm": "yes"}).status_code == 404
    assert sam.post(url + "decide/").status_code == 404
    assert BulkOperation.objects.get().status in ("counting", "counted")


def test_a_bulk_retry_of_history_rows_resumed_after_a_crash_acts_once_per_job() -> None:
    """A history row Valkey no longer holds is retried by creating its job again; the runner
    crashes before it saves that it did; the job runs and dies again meanwhile; the runner that
    resumes the operation acts on the chunk left in flight again, and must answer as the first
    did (its call id) rather than retry the job a second time."""
    from datetime import UTC, datetime, timedelta

    import redis as redis_client
    from django.conf import settings

    from jobqueue.console import bulk
    from jobqueue.console.query import Query
    from jobqueue.history.mirror import Mirror
    from tests.console.test_bulk import dead_jobs

    [job_id] = dead_jobs(1)
    assert Mirror([Queue("default")], consumer="t").step() >= 1
    redis_client.Redis.from_url(settings.JOBQUEUE["URL"]).flushall()  # (Valkey no longer holds it)
    user = User.objects.create_superuser("root", "root@example.com", "pw")
    work = bulk.Bulk.of("retry", Query.parse({"where": "history", "state": "dead"}), None)
    operation = work.start(user)
    bulk.Runner().run()
    operation.refresh_from_db()
    assert (operation.status, operation.total) == ("counted", 1)
    assert bulk.Bulk.confirm(operation, user)
    # what a runner that crashed mid-chunk leaves: the chunk in flight, acted on, not counted
    place = ("default", job_id, None)
    assert work.act([place], f"bulk{operation.pk}") == (1, 0)
    BulkOperation.objects.filter(pk=operation.pk).update(
        inflight=[list(place)],
        cursor=job_id,
        runner="crashed",
        lease_until=datetime.now(UTC) - timedelta(seconds=1),
    )
    live = Queue("default")
    [lease] = live.dequeue(count=1)  # the job ran again, and died again, meanwhile
    live.nack(lease, "boom again")
    assert live.get(job_id).state == "dead"  # type: ignore[union-attr]
    assert bulk.Runner().run() == 1
    operation.refresh_from_db()
    assert (operation.status, operation.done, operation.skipped) == ("done", 1, 0)
    assert live.get(job_id).state == "dead"  # type: ignore[union-attr]  (acted on once)


def test_the_stuck_page_offers_no_action_on_a_queue_seen_only(client: Client, settings: Any) -> None:
    """Its buttons would answer 403: a queue the user may only view shows its stuck jobs bare."""
    from jobqueue import conf
    from tests.console.test_access import dead_in

    settings.JOBQUEUE = {
        **settings.JOBQUEUE,
        "CONSOLE": {"ACCESS": {"billing": {"view": ["support"]}, "ops": {"act": ["support"]}}},
    }
    conf.reset()
    seen, mine = dead_in("billing"), dead_in("ops")
    page = member(client, "sam", "support").get(f"{LIVE}/stuck/").content.decode()
    assert seen in page and mine in page
    assert f"jobs/billing/{seen}/retry/" not in page and f"jobs/ops/{mine}/retry/" in page


def test_a_bulk_action_where_the_user_may_act_on_no_queue_is_a_403(client: Client, settings: Any) -> None:
    """A view-only user is offered no bulk button, and a bulk action they post anyway is refused
    (403) rather than recorded as an operation over nothing."""
    from jobqueue import conf
    from tests.console.test_access import dead_in

    settings.JOBQUEUE = {
        **settings.JOBQUEUE,
        "CONSOLE": {"ACCESS": {"billing": {"view": ["support"]}, "ops": {"act": ["support"]}}},
    }
    conf.reset()
    dead_in("billing"), dead_in("ops")
    sam = member(client, "sam", "support")
    page = sam.get(f"{LIVE}/search/", {"queue": "billing", "state": "dead"}).content.decode()
    assert 'id="search-results"' in page and 'id="bulk-form"' not in page
    assert 'id="bulk-form"' in sam.get(f"{LIVE}/search/", {"queue": "ops", "state": "dead"}).content.decode()
    for form in ({"queue": "billing", "state": "dead"}, {"queue": "secret", "state": "dead"}):
        response = sam.post(f"{LIVE}/search/bulk/", {**form, "where": "live", "action": "retry"})
        assert response.status_code == 403, form
    assert not BulkOperation.objects.exists()
    response = sam.post(f"{LIVE}/search/bulk/", {"state": "dead", "where": "live", "action": "retry"})
    assert response.status_code == 302 and BulkOperation.objects.get().scope == ["ops"]


@pytest.mark.parametrize("where", ["live", "history"])
@pytest.mark.parametrize("q", ["5511-1111", "kwargs.customer~5611"])
def test_a_bulk_actions_count_tells_nothing_of_hidden_arguments(
    client: Client,
    hiding: None,  # noqa: F811
    where: str,
    q: str,
) -> None:
    """Plain text and contains-terms of a user who may not see hidden arguments do not look into
    them in a search; nor may they in a bulk action, whose count would tell the value."""
    Queue("payments").enqueue(
        {
            "handler": "tests.jobapp.jobs.echo",
            "args": ["bob"],
            "kwargs": {"card": "5511-1111", "customer": {"card": "5611-1111"}},
        }
    )
    row("JOBpaid0000001", "bob", queue="payments", card="5511-1111", customer={"card": "5611-1111"})
    op = member(client, "op")
    User.objects.get(username="op").user_permissions.remove(
        Permission.objects.get(codename="view_hidden_args")
    )
    action = "cancel" if where == "live" else "delete"
    page = op.get(f"{LIVE}/search/", {"q": q, "where": where}).content.decode()
    assert 'id="search-results"' in page and 'id="bulk-form"' not in page
    response = op.post(f"{LIVE}/search/bulk/", {"q": q, "where": where, "action": action})
    assert response.status_code == 302 and "/bulk/" not in response["Location"]
    assert not BulkOperation.objects.exists()
    assert "hidden_args" in op.get(response["Location"]).content.decode()  # (the message says why)
    # where no queue it reaches hides arguments, a bulk action by text is theirs to take
    response = op.post(f"{LIVE}/search/bulk/", {"q": q, "queue": "default", "where": where, "action": action})
    assert response.status_code == 302 and "/bulk/" in response["Location"]


def test_every_console_action_is_a_csrf_protected_post() -> None:
    """Without the form's CSRF token a POST is refused (403) and changes nothing; a GET never
    acts (405). Bulk actions and decisions included."""
    from django.urls import reverse

    from tests.console.test_access import dead_in

    job_id = dead_in("default")
    User.objects.create_superuser("root", "root@example.com", "pw")
    browser = Client(enforce_csrf_checks=True)
    browser.login(username="root", password="pw")
    operation = BulkOperation.objects.create(
        action="retry", query={"state": "dead"}, status="counted", total=1
    )
    names = {
        "jobqueue_search_bulk": (),
        "jobqueue_bulk_decide": (operation.pk,),
        "jobqueue_job_retry": ("default", job_id),
        "jobqueue_job_cancel": ("default", job_id),
        "jobqueue_job_reprioritize": ("default", job_id),
        "jobqueue_queue_pause": ("default",),
        "jobqueue_queue_resume": ("default",),
        "jobqueue_queue_resize": ("default",),
        "jobqueue_queue_set_lane_concurrency": ("default",),
        "jobqueue_queue_set_global_concurrency": ("default",),
        "jobqueue_schedule_run": ("tick",),
        "jobqueue_schedule_pause": ("tick",),
        "jobqueue_schedule_resume": ("tick",),
    }
    form = {"state": "dead", "action": "retry", "confirm": "yes", "count": "2", "cap": "1", "lane": "x"}
    for name, args in names.items():
        url = reverse(f"admin:{name}", args=args)
        assert browser.post(url, form).status_code == 403, name
        assert browser.get(url).status_code == 405, name
    assert Queue("default").get(job_id).state == "dead"  # type: ignore[union-attr]
    assert not Queue("default").is_paused() and BulkOperation.objects.get().status == "counted"
    assert BulkOperation.objects.count() == 1
