"""The console in a real browser: Debian's chromium driven by Playwright against live_server.

Screenshots of the dashboard and a job page are saved under var/screenshots/ (CI artifacts).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from jobqueue import Queue, get_job
from tests.jobapp import jobs
from tests.workers import dead_job

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
CHROMIUM = Path("/usr/bin/chromium")
SHOTS = Path(__file__).resolve().parents[2] / "var" / "screenshots"
XSS = "<script>window.__pwned = 1</script>"


def shot(page: Any, name: str, clip: dict[str, float] | None = None, selector: str = "",
         above: float = 0, height: float = 0) -> None:
    """A screenshot into JOBQUEUE_SHOTS (bench/screenshots.py sets it to docs/img) or SHOTS:
    the page's `clip`, or the band from `above` pixels over `selector` down to its end (or
    `height` pixels)."""
    where = Path(os.environ.get("JOBQUEUE_SHOTS") or SHOTS)
    where.mkdir(parents=True, exist_ok=True)
    if selector:
        page.locator(selector).scroll_into_view_if_needed()
        box = page.locator(selector).bounding_box()
        top = max(box["y"] - above, 0)
        clip = {"x": 0, "y": top, "width": page.viewport_size["width"],
                "height": height or box["y"] + box["height"] + 8 - top}
    page.screenshot(path=str(where / name), clip=clip)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        if os.environ.get("CI"):
            pytest.fail("CI must have /usr/bin/chromium (.ci/run installs it)")
        pytest.skip("no /usr/bin/chromium on this machine")
    from playwright.sync_api import sync_playwright

    # Playwright's sync API runs an event loop in this thread; the ORM calls here stay synchronous.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM),
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        yield browser
        browser.close()


@pytest.fixture
def page(browser: Any, live_server: Any) -> Iterator[Any]:
    context = browser.new_context(base_url=live_server.url, viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.on("dialog", lambda dialog: pytest.fail(f"a script ran: {dialog.message}"))
    yield page
    context.close()


def login(page: Any, username: str, password: str) -> None:
    page.goto("/admin/login/?next=/admin/jobqueue/job/live/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("input[type=submit]")


def test_an_operator_finds_retries_reprioritizes_cancels_and_pauses(page: Any) -> None:
    User.objects.create_superuser("admin", "admin@example.com", "admin")
    dead_id = dead_job(XSS, f"ValueError: {XSS}")
    jobs.add.enqueue_many([(i, i) for i in range(25)])
    jobs.add.using(queue="emails", lane="player-7").enqueue(1, 2)
    login(page, "admin", "admin")
    page.wait_for_selector("section.jq-card[data-queue=default]")
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "dashboard.png"), full_page=True)

    page.fill("input[name=id]", dead_id)
    page.click("input[value=Find]")
    page.wait_for_selector("#job-payload")
    assert XSS in page.inner_text("#job-payload")  # shown as text …
    assert page.evaluate("window.__pwned") is None  # … never run
    assert page.inner_text("#job-state").startswith("dead")
    page.screenshot(path=str(SHOTS / "job.png"), full_page=True)

    page.click("input[value=Retry]")
    page.wait_for_selector(".messagelist .success")
    assert page.inner_text("#job-state") == "pending"

    page.fill("input[name=priority]", "55")
    page.click("input[value=Reprioritize]")
    page.wait_for_selector(".messagelist .success")
    assert page.inner_text("#job-priority") == "55" and get_job(dead_id).priority == 55  # type: ignore[union-attr]

    page.click("input[value=Cancel]")
    page.click("input[value='Yes, cancel it']")
    page.wait_for_selector(".messagelist .success")
    assert page.inner_text("#job-state") == "cancelled"

    page.goto("/admin/jobqueue/job/live/queues/default/")
    page.wait_for_selector("text=Lanes with ready work")
    page.screenshot(path=str(SHOTS / "queue.png"), full_page=True)
    page.goto("/admin/jobqueue/job/live/stuck/?pending_over=1")
    page.wait_for_selector("text=Leases expired")
    page.screenshot(path=str(SHOTS / "stuck.png"), full_page=True)

    page.goto("/admin/jobqueue/job/live/")
    page.click("section[data-queue=emails] input[value=Pause]")
    page.wait_for_selector("section[data-queue=emails] .jq-paused")
    assert Queue("emails").is_paused()
    page.click("section[data-queue=emails] input[value=Resume]")
    page.wait_for_selector("section[data-queue=emails] input[value=Pause]")
    assert not Queue("emails").is_paused()


def test_a_user_who_is_not_staff_is_refused(page: Any) -> None:
    User.objects.create_user("visitor", "v@example.com", "pw")
    login(page, "visitor", "pw")
    assert "staff account" in page.inner_text(".errornote")
    page.goto("/admin/jobqueue/job/live/")
    assert "/admin/login/" in page.url


def test_an_operator_runs_and_pauses_a_periodic_job(page: Any, settings: Any) -> None:
    from jobqueue import conf

    settings.JOBQUEUE = {**settings.JOBQUEUE, "SCHEDULE": {
        "nightly": {"job": "tests.jobapp.jobs.noop", "cron": "30 2 * * *"}}}
    conf.reset()
    User.objects.create_superuser("admin", "admin@example.com", "admin")
    login(page, "admin", "admin")
    page.click("text=Periodic jobs")
    page.wait_for_selector("tr[data-schedule=nightly]")
    page.click("tr[data-schedule=nightly] input[value='Run now']")
    page.click("input[value='Yes, run it now']")
    page.wait_for_selector(".messagelist .success")
    assert "Ran periodic job nightly now" in page.inner_text(".messagelist")
    assert Queue("default").counts()["pending"] == 1
    page.click("tr[data-schedule=nightly] input[value=Pause]")
    page.wait_for_selector("tr[data-schedule=nightly] .jq-paused")
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "schedules.png"), full_page=True)
    page.click("text=Workers")
    page.wait_for_selector("table.jq-workers")
    page.screenshot(path=str(SHOTS / "workers.png"), full_page=True)


def test_the_dashboard_moves_without_a_reload(page: Any) -> None:
    User.objects.create_superuser("admin", "admin@example.com", "admin")
    jobs.add.enqueue_many([(i, i) for i in range(3)])
    login(page, "admin", "admin")
    card = "section.jq-card[data-queue=default] table tr:nth-child(2) td:first-child"
    page.wait_for_selector(card)
    assert page.inner_text(card) == "3"
    page.evaluate("window.__before = 1")  # gone if the page were reloaded
    jobs.add.enqueue_many([(i, i) for i in range(4)])
    page.wait_for_function(f"document.querySelector({card!r}).innerText === '7'", timeout=12_000)
    assert page.evaluate("window.__before") == 1
    assert page.locator("svg.jq-chart text").first.is_visible()  # the charts have their scale


def test_an_operator_resizes_a_queue_from_its_page(page: Any) -> None:
    User.objects.create_superuser("admin", "admin@example.com", "admin")
    jobs.add.enqueue_many([(i, i) for i in range(5)])
    login(page, "admin", "admin")
    page.goto("/admin/jobqueue/job/live/queues/default/")
    page.fill("input[name=count]", "4")
    page.click("input[value='Resize…']")
    page.wait_for_selector("text=New jobs spread over all 4 shards at once")
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "resize-confirm.png"), full_page=True)
    page.click("input[value='Yes, resize it']")
    page.wait_for_selector(".messagelist .success")
    assert "resized from 1 to 4" in page.inner_text(".messagelist")
    assert Queue("default").layout(fresh=True).live == 4
    assert page.locator("table.jq-resizes td", has_text="console: admin").count() == 1
    page.screenshot(path=str(SHOTS / "queue-resized.png"), full_page=True)
