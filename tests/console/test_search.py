"""The console's search: the history by the database's own JSON operators (run this module on
MariaDB, PostgreSQL and SQLite: DATABASE_URL), live jobs by a bounded scan, bad input, and hidden
arguments (masked, and not searchable, without their permission)."""

from __future__ import annotations

import html
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.test import Client

from jobqueue import Queue, conf
from jobqueue.console import search
from jobqueue.console.query import Query
from jobqueue.exceptions import ConfigurationError
from jobqueue.models import Job
from tests.console.test_console import staff

pytestmark = pytest.mark.django_db(transaction=True)
SEARCH = "/admin/jobqueue/job/live/search/"
ECHO = "tests.jobapp.jobs.echo"
NOW = datetime.now(UTC)


def row(
    job_id: str,
    *args: Any,
    state: str = "dead",
    queue: str = "default",
    ago: float = 60,
    handler: str = ECHO,
    **kwargs: Any,
) -> Job:
    return Job.objects.create(
        id=job_id,
        queue=queue,
        state=state,
        lane="",
        attempts=1,
        payload={"handler": handler, "args": list(args), "kwargs": kwargs},
        finished_at=NOW - timedelta(seconds=ago),
    )


def ids(page: str) -> list[str]:
    return re.findall(r'<tr data-job="([^"]+)"', page)


def found(client: Client, **params: str) -> list[str]:
    response = client.get(SEARCH, params)
    assert response.status_code == 200, response.content.decode()[-2000:]
    return ids(response.content.decode())


def test_history_search_by_argument_paths_state_handler_and_time(admin_client: Client) -> None:
    row("JOBhist0000001", 42, "x", order={"id": 42, "city": "Edinburgh"}, email="ada@example.com")
    row("JOBhist0000002", "42", order={"id": "42", "city": "Leith"}, state="succeeded", ago=7200)
    row("JOBhist0000003", 7, order={"id": 7, "tags": ["a", "b"]}, handler="tests.jobapp.jobs.add")
    row("JOBhist0000004", True, order=None)
    history = {"where": "history"}
    assert found(admin_client, q="kwargs.order.id=42", **history) == ["JOBhist0000001", "JOBhist0000002"]
    assert found(admin_client, q='kwargs.order.id="42"', **history) == ["JOBhist0000001", "JOBhist0000002"]
    assert found(admin_client, q="args.0=42", **history) == ["JOBhist0000001", "JOBhist0000002"]
    assert found(admin_client, q="args.1=x", **history) == ["JOBhist0000001"]
    assert found(admin_client, q="args.0=true", **history) == ["JOBhist0000004"]
    assert found(admin_client, q="kwargs.order.city~EDIN", **history) == ["JOBhist0000001"]
    assert found(admin_client, q="kwargs.order.tags.1=b", **history) == ["JOBhist0000003"]
    assert found(admin_client, q="kwargs.order.id=42 kwargs.order.city=Leith", **history) == [
        "JOBhist0000002"
    ]
    assert found(admin_client, q="kwargs.order.id=42", state="dead", **history) == ["JOBhist0000001"]
    assert found(admin_client, handler="tests.jobapp.jobs.add", **history) == ["JOBhist0000003"]
    since = (NOW - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M")
    assert "JOBhist0000002" not in found(admin_client, since=since, **history)
    assert found(admin_client, q="kwargs.missing=1", **history) == []
    # plain text: an id, or text in the arguments
    assert found(admin_client, q="JOBhist0000003", **history) == ["JOBhist0000003"]
    assert found(admin_client, q="ada@example", **history) == ["JOBhist0000001"]


def test_history_search_pages_newest_first(admin_client: Client) -> None:
    for i in range(55):
        row(f"JOBpage{i:07d}", i, ago=1000 - i)
    page = admin_client.get(SEARCH, {"where": "history", "state": "dead"}).content.decode()
    assert len(ids(page)) == 50 and ids(page)[0] == "JOBpage0000054" and "next ›" in page
    link = re.search(r'<a href="\?([^"]+)" id="search-next"', page)
    assert link is not None and "cursor=" in link[1]  # (the place the page stopped: shareable)
    second = admin_client.get(SEARCH + "?" + html.unescape(link[1]))
    assert ids(second.content.decode()) == [f"JOBpage{i:07d}" for i in range(4, -1, -1)]
    assert "the search is complete" in second.content.decode()


def test_live_search_by_path_and_text_pages_and_says_when_the_scan_stopped_short(
    admin_client: Client, monkeypatch: Any
) -> None:
    queue = Queue("default")
    refs = [
        queue.enqueue({"handler": ECHO, "args": [i], "kwargs": {"order": {"id": i % 3}}}) for i in range(30)
    ]
    emails = Queue("emails").enqueue({"handler": ECHO, "args": [], "kwargs": {"to": "bo@x.org"}})
    assert len(found(admin_client, q="kwargs.order.id=1")) == 10
    assert found(admin_client, q="bo@x.org") == [emails.id]
    assert found(admin_client, q="kwargs.to~BO@", queue="emails") == [emails.id]
    assert found(admin_client, q="args.0=29", state="pending") == [refs[29].id]
    monkeypatch.setattr(search, "SCAN_CHUNK", 4)
    monkeypatch.setattr(search, "SCAN_BUDGET", 8)
    page = admin_client.get(SEARCH, {"q": "args.0=29"}).content.decode()
    assert "The scan stopped short after reading" in page and "go on scanning" in page
    seen: set[str] = set()
    cursor = ""
    for _ in range(40):  # the whole keyspace, a page (8 rows read) at a time
        step = search.live(Query.parse({"q": "kwargs.order.id=0"}), None, cursor)
        seen |= {job.id for job in step.jobs}
        if step.next is None:
            break
        cursor = step.next
    assert seen == {ref.id for i, ref in enumerate(refs) if i % 3 == 0}


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"q": "args.x=1"}, "args takes a position"),
        ({"q": "kwargs..a=1"}, "malformed path"),
        ({"q": 'kwargs.a="open'}, "unbalanced double quote"),
        ({"state": "sleeping"}, "unknown state 'sleeping'"),
        ({"since": "yesterday"}, "since must be a date or time"),
        ({"lane": "no spaces"}, "invalid lane name"),
        ({"where": "elsewhere", "q": "x"}, "use live or history"),
        ({"q": "kwargs.a={}"}, "compare a path's value with"),
    ],
)
def test_bad_search_input_is_a_message_on_the_page(
    admin_client: Client, params: dict[str, str], message: str
) -> None:
    response = admin_client.get(SEARCH, params)
    assert response.status_code == 400
    assert message in response.content.decode().replace("&#x27;", "'")
    assert 'id="search-error"' in response.content.decode()


@pytest.fixture
def hiding(settings: Any) -> None:
    settings.JOBQUEUE = {
        **settings.JOBQUEUE,
        "QUEUES": {**settings.JOBQUEUE["QUEUES"], "payments": {"hidden_args": ["card", 1]}},
    }
    conf.reset()


def test_hidden_arguments_are_masked_and_unsearchable_without_the_permission(
    client: Client, hiding: None
) -> None:
    live = Queue("payments").enqueue(
        {
            "handler": ECHO,
            "args": ["alice", "4111-1111"],
            "kwargs": {"card": "5500-0000", "amount": 12, "customer": {"card": "5600-0000"}},
        }
    )
    row(
        "JOBpaid0000001",
        "bob",
        "4222-2222",
        queue="payments",
        card="5511-1111",
        amount=3,
        customer={"card": "5611-1111"},
    )
    staff(client, "view_job")
    for where, job_id in (("live", live.id), ("history", "JOBpaid0000001")):
        page = client.get(SEARCH, {"queue": "payments", "where": where}).content.decode()
        assert ids(page) == [job_id] and "•••" in page
        assert "4111" not in page and "5500" not in page and "4222" not in page
    job_page = client.get(f"/admin/jobqueue/job/live/jobs/payments/{live.id}/").content.decode()
    assert "•••" in job_page and "5500" not in job_page and "alice" in job_page
    changelist = client.get("/admin/jobqueue/job/?queue=payments").content.decode()
    assert "•••" in changelist and "5511" not in changelist and "bob" in changelist
    row_page = client.get("/admin/jobqueue/job/JOBpaid0000001/change/")
    assert row_page.status_code == 200 and "bob" in row_page.content.decode()
    assert "•••" in row_page.content.decode() and "5511" not in row_page.content.decode()
    refused = client.get(SEARCH, {"q": "kwargs.card=5500-0000"})
    assert refused.status_code == 400 and "hidden argument" in refused.content.decode()
    assert client.get(SEARCH, {"q": "args.1~4111"}).status_code == 400
    for where in ("live", "history"):  # no probing through plain text either
        assert found(client, q="5500-0000", where=where) == []
        assert found(client, q="5511-1111", where=where) == []
    for where in ("live", "history"):  # nor through the text of a dict holding a hidden key
        assert found(client, q="kwargs.customer~5600", where=where) == []
        assert found(client, q="kwargs.customer~5611", where=where) == []
    assert found(client, q="kwargs.amount=12") == [live.id]  # what is not hidden still is


def test_hidden_arguments_are_shown_with_the_permission(client: Client, hiding: None) -> None:
    live = Queue("payments").enqueue(
        {"handler": ECHO, "args": ["alice", "4111-1111"], "kwargs": {"card": "5500-0000"}}
    )
    row("JOBpaid0000002", "bob", queue="payments", card="5511-1111")
    staff(client, "view_job", "view_hidden_args")
    assert found(client, q="kwargs.card=5500-0000") == [live.id]
    assert found(client, q="5511-1111", where="history") == ["JOBpaid0000002"]
    job_page = client.get(f"/admin/jobqueue/job/live/jobs/payments/{live.id}/").content.decode()
    assert "5500-0000" in job_page and "•••" not in job_page


@pytest.mark.parametrize("value", ["card", [""], [-1], [True], ["x" * 201], [[0]]])
def test_a_bad_hidden_args_option_is_one_clear_error(value: Any) -> None:
    with pytest.raises(ConfigurationError, match="hidden_args must be a list of at most 100"):
        conf.parse({"QUEUES": {"payments": {"hidden_args": value}}})


def test_a_results_error_reads_as_its_last_line_live_and_in_the_history(admin_client: Client) -> None:
    """As every other list of jobs: the exception and its message, not a traceback's first line
    (the whole text, on the job's page)."""
    traceback = ('Traceback (most recent call last):\n  File "shop/jobs.py", line 41, in send\n'
                 "    smtp.send_message(message)\nsmtplib.SMTPRecipientsRefused: mailbox unavailable\n")
    Job.objects.create(id="JOB0000000000t", queue="default", state="dead", lane="",
                       payload={"handler": ECHO, "args": [1]}, last_error=traceback,
                       enqueued_at=NOW, finished_at=NOW)
    live = Queue("default")
    live.enqueue({"handler": ECHO, "args": [2]}, max_attempts=1)
    [lease] = live.dequeue(count=1)
    live.nack(lease, traceback)
    for where in ("history", "live"):
        page = admin_client.get(SEARCH, {"state": "dead", "where": where}).content.decode()
        results = page[page.index('id="search-results"'):]
        assert '">smtplib.SMTPRecipientsRefused: mailbox unavailable</span>' in results, where
        assert ">Traceback" not in results, where  # (whole, only in the cell's title)
