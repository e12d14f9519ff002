"""A history search page answers within its budget however large the history: it reads the
rows newest first in bounded chunks, and when its budget runs out before the page fills it says
how far it searched, with a link (a cursor in the URL) that searches older rows. Run this module
on MariaDB, PostgreSQL and SQLite (DATABASE_URL)."""

from __future__ import annotations

import html
import re
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from jobqueue.console import historyscan
from jobqueue.console.query import Query
from jobqueue.models import Job
from tests.console.test_search import NOW, SEARCH, ids, row

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def small_budget(monkeypatch: Any) -> None:
    """Chunks of 2 rows, then 4; a page reads at most 6 rows (and has a minute for them)."""
    monkeypatch.setattr(historyscan, "CHUNK_FIRST", 2)
    monkeypatch.setattr(historyscan, "CHUNK_LEAST", 1)
    monkeypatch.setattr(historyscan, "CHUNK_MAX", 4)
    monkeypatch.setattr(historyscan, "ROW_BUDGET", 6)
    monkeypatch.setattr(historyscan, "TIME_BUDGET", 60.0)


def history_of(count: int) -> list[str]:
    """`count` finished rows, one a second, newest first (every fifth: kwargs.k=1, with the
    word "needle" in its arguments), then two unfinished ones (a durable queue's: no
    finished_at); returns the ids that match kwargs.k=1, newest first (unfinished first)."""
    for i in range(count):
        row(f"JOBscan{i:07d}", i, ago=10 + i, k=1 if i % 5 == 0 else 0,
            note="needle" if i % 5 == 0 else "")
    for i in (0, 1):
        Job.objects.create(id=f"JOBopen{i:07d}", queue="default", state="pending", attempts=0,
                           payload={"handler": "x", "args": [], "kwargs": {"k": 1}})
    finished = [f"JOBscan{i:07d}" for i in range(count) if i % 5 == 0]
    return ["JOBopen0000001", "JOBopen0000000", *finished]


def next_link(page: str) -> dict[str, str] | None:
    found = re.search(r'<a href="([^"]+)" id="search-next"', page)
    return dict(parse_qsl(urlsplit(html.unescape(found[1])).query)) if found else None


def test_an_unnarrowed_search_stops_at_its_budget_and_links_to_older_rows(
    admin_client: Client, small_budget: None
) -> None:
    want = history_of(30)
    params: dict[str, str] | None = {"where": "history", "q": "kwargs.k=1"}
    pages, seen = [], []
    while params is not None:
        response = admin_client.get(SEARCH, params)
        assert response.status_code == 200, response.content.decode()[-2000:]
        page = response.content.decode()
        pages.append(page)
        seen += ids(page)
        params = next_link(page)
        assert len(pages) < 20
    assert seen == want  # every match once, newest first: the unfinished rows first
    first = pages[0]
    assert 'id="search-cut"' in first and "6 rows read" in first and "search older" in first
    assert ids(first) == ["JOBopen0000001", "JOBopen0000000", "JOBscan0000000"]
    assert "finished since" in pages[1]  # (it says how far back it searched)
    assert 'id="search-cut"' not in pages[-1] and "the search is complete" in pages[-1]


@pytest.mark.parametrize("q", ["needle", "kwargs.note~NEED"])
def test_plain_text_and_contains_are_bounded_too(admin_client: Client, small_budget: None, q: str) -> None:
    history_of(30)
    page = admin_client.get(SEARCH, {"where": "history", "q": q}).content.decode()
    assert ids(page) == ["JOBscan0000000"] and "6 rows read" in page and next_link(page)


def test_a_full_page_ends_mid_chunk_and_the_next_takes_up_there(monkeypatch: Any) -> None:
    """Pages of 3 in chunks of up to 50: a page stops at its third match, inside a chunk, and
    the next page starts right after it; rows finished at the same moment are told apart by id."""
    monkeypatch.setattr(historyscan, "CHUNK_FIRST", 7)
    monkeypatch.setattr(historyscan, "TIME_BUDGET", 60.0)
    for i in range(20):
        row(f"JOBtie{i:08d}", i, ago=100 + i // 4, k=1 if i % 2 else 0)  # four rows a second
    query = Query.parse({"where": "history", "q": "kwargs.k=1"})
    seen, cursor = [], ""
    for _ in range(10):
        page = historyscan.page(query, None, True, cursor, per_page=3)
        assert len(page.jobs) <= 3 and not page.cut_short
        seen += [job.id for job in page.jobs]
        if page.next is None:
            break
        cursor = page.next
    ordered = sorted(((100 + i // 4, -i), f"JOBtie{i:08d}") for i in range(20) if i % 2)
    assert seen == [job_id for _, job_id in ordered]


def test_a_narrowed_search_reads_only_the_rows_its_index_gives(
    admin_client: Client, small_budget: None
) -> None:
    """A handler's, state's or time range's rows are chunked through their own index: the
    rows of other handlers do not count against the budget."""
    history_of(30)
    row("JOBrare0000001", 1, ago=5000, handler="tests.jobapp.jobs.add", k=1)
    page = admin_client.get(
        SEARCH, {"where": "history", "q": "kwargs.k=1", "handler": "tests.jobapp.jobs.add"}
    ).content.decode()
    assert ids(page) == ["JOBrare0000001"] and "the search is complete" in page
    since = (NOW - timedelta(seconds=12)).strftime("%Y-%m-%dT%H:%M:%S")
    page = admin_client.get(SEARCH, {"where": "history", "q": "kwargs.k=1", "since": since}).content.decode()
    assert ids(page) == ["JOBscan0000000"] and "the search is complete" in page  # (no unfinished rows)


def test_the_time_budget_stops_after_one_chunk_at_least(monkeypatch: Any) -> None:
    monkeypatch.setattr(historyscan, "CHUNK_FIRST", 4)
    monkeypatch.setattr(historyscan, "TIME_BUDGET", 0.0)
    history_of(30)
    page = historyscan.page(Query.parse({"where": "history", "q": "kwargs.k=1"}), None, True)
    assert page.cut_short and page.looked_at == 2 and page.next  # the two unfinished rows: one chunk
    after = historyscan.page(Query.parse({"where": "history", "q": "kwargs.k=1"}), None, True, page.next)
    assert [job.id for job in after.jobs] == ["JOBscan0000000"] and after.looked_at == 4
    assert after.reached == Job.objects.get(pk="JOBscan0000003").finished_at


@pytest.mark.parametrize("cursor", ["x", "f.12.JOB", "f.notanumber.JOBscan0000001", "u.", "u.JOB/../x",
                                    "f." + "9" * 30 + ".JOBscan0000001"])
def test_a_bad_cursor_is_a_clear_error(admin_client: Client, cursor: str) -> None:
    response = admin_client.get(SEARCH, {"where": "history", "q": "kwargs.k=1", "cursor": cursor})
    assert response.status_code == 400
    assert "malformed history cursor" in response.content.decode()


def test_the_history_list_finds_its_queues_by_index_probes_and_reads_no_date_drill_down(
    admin_client: Client,
) -> None:
    """Neither the queue filter nor a date hierarchy reads every row of the history (a
    DISTINCT over a million rows took most of a second)."""
    for i, queue in enumerate(["alpha", "beta", "beta", "gamma"]):
        row(f"JOBlist{i:07d}", i, queue=queue)
    with CaptureQueriesContext(connection) as queries:
        page = admin_client.get("/admin/jobqueue/job/").content.decode()
    assert all(f"?queue={name}" in page for name in ("alpha", "beta", "gamma"))
    assert not [q["sql"] for q in queries.captured_queries if "DISTINCT" in q["sql"].upper()]
    beta = admin_client.get("/admin/jobqueue/job/?queue=beta").content.decode()
    assert beta.count("/admin/jobqueue/job/live/jobs/beta/JOBlist") == 2 and "/jobs/alpha/" not in beta
