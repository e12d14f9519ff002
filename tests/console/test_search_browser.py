"""The search page and a bulk action in a real browser (chromium), the bulk flow with JavaScript
off: search by an argument path, share the URL, retry every match after the count, watch it
finish; hidden arguments masked for an operator without their permission."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User

from jobqueue import Queue, conf
from jobqueue.models import BulkOperation
from tests.console.test_browser import SHOTS, browser, login, page  # noqa: F401 (fixtures)
from tests.console.test_bulk import dead_jobs

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
SEARCH = "/admin/jobqueue/job/live/search/"


@pytest.fixture
def tab(browser: Any, live_server: Any) -> Any:  # noqa: F811
    context = browser.new_context(
        base_url=live_server.url, java_script_enabled=False, viewport={"width": 1280, "height": 900}
    )
    yield context.new_page()  # a page with JavaScript off
    context.close()


def test_an_operator_searches_by_argument_and_retries_every_match_without_javascript(tab: Any) -> None:
    User.objects.create_superuser("admin", "admin@example.com", "admin")
    acme = set(dead_jobs(60, tenant="acme"))
    others = dead_jobs(5, tenant="other")
    login(tab, "admin", "admin")
    tab.goto(SEARCH)
    tab.fill("input[name=q]", "kwargs.tenant=acme")
    tab.select_option("select[name=state]", "dead")
    tab.click("input[value=Search]")
    tab.wait_for_selector("#search-results")
    assert "q=kwargs.tenant%3Dacme" in tab.url and "state=dead" in tab.url  # shareable
    shown = {row.get_attribute("data-job") for row in tab.query_selector_all("tr[data-job]")}
    assert len(shown) == 50 and shown <= acme
    SHOTS.mkdir(parents=True, exist_ok=True)
    tab.screenshot(path=str(SHOTS / "search.png"), full_page=True)
    tab.click("#search-next")
    shown |= {row.get_attribute("data-job") for row in tab.query_selector_all("tr[data-job]")}
    assert shown == acme

    tab.click("button[value=retry]")
    tab.wait_for_selector("#bulk-count", timeout=30_000)  # counted outside the request
    assert re.search(r"\b60\s+live jobs match", tab.inner_text("#bulk-count"))
    tab.screenshot(path=str(SHOTS / "bulk-confirm.png"), full_page=True)
    tab.click("input[value='Yes, retry 60 jobs']")
    tab.wait_for_selector(".messagelist .success")
    # the page refreshes itself (a meta refresh: no script) until the operation is done
    tab.wait_for_selector("#bulk-status:text-is('done')", timeout=60_000)
    assert "60 done, 0 skipped of 60" in tab.inner_text("#bulk-progress")
    tab.screenshot(path=str(SHOTS / "bulk-progress.png"), full_page=True)
    queue = Queue("default")
    assert {queue.get(job_id).state for job_id in acme} == {"pending"}  # type: ignore[union-attr]
    assert {queue.get(job_id).state for job_id in others} == {"dead"}  # type: ignore[union-attr]
    assert BulkOperation.objects.count() == 1 and LogEntry.objects.count() == 1


def test_a_bad_search_is_a_message_and_hidden_arguments_are_masked(
    page: Any,  # noqa: F811
    settings: Any,
) -> None:
    settings.JOBQUEUE = {
        **settings.JOBQUEUE,
        "QUEUES": {**settings.JOBQUEUE["QUEUES"], "payments": {"hidden_args": ["card"]}},
    }
    conf.reset()
    Queue("payments").enqueue(
        {"handler": "tests.jobapp.jobs.echo", "args": ["alice"], "kwargs": {"card": "4111-1111"}}
    )
    user = User.objects.create_user("op", "op@example.com", "pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename="view_job"))
    login(page, "op", "pw")
    page.goto(SEARCH + "?q=args.x%3D1")
    assert "args takes a position" in page.inner_text("#search-error")
    page.goto(SEARCH + "?queue=payments")
    page.wait_for_selector("#search-results")
    text = page.inner_text("#search-results")
    assert "•••" in text and "4111" not in text and "alice" in text
    assert page.query_selector("#bulk-form") is None  # no bulk action without a permission
    page.fill("input[name=q]", "kwargs.card=4111-1111")
    page.click("input[value=Search]")
    assert "hidden argument" in page.inner_text("#search-error")
