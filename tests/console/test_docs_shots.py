"""The console's pages as the docs show them, in a real browser (chromium) at a 1400-pixel-wide
window: search (live and history), a bulk retry's confirmation and progress, the history charts,
the periodic jobs kept in the database, the enqueue form, a restricted user's view, hidden
arguments and sealed values. Each test sets up what an operator would find (scene.py), checks
that the page shows it (not an error, not an empty table) and saves the page's content:
bench/screenshots.py runs them with JOBQUEUE_SHOTS=docs/img (else they go to var/screenshots/)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import Group, Permission, User

from jobqueue import conf
from tests.console import scene
from tests.console.test_browser import browser, login, shot  # noqa: F401 (fixtures)
from tests.encryption.conftest import NEW, kid
from tests.inprocess import burst
from tests.jobapp import jobs

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
LIVE = "/admin/jobqueue/job/live"
WIDTH = 1400


@pytest.fixture
def wide(browser: Any, live_server: Any, settings: Any) -> Iterator[Any]:  # noqa: F811
    """A 1400-pixel-wide window, the admin's side bar folded (the content is what is shown), on
    the scene's queues and periodic jobs."""
    settings.JOBQUEUE = {
        **settings.JOBQUEUE,
        "QUEUES": {**settings.JOBQUEUE["QUEUES"], **scene.QUEUES},
        "SCHEDULE": {"cleanup-sessions": {"job": "tests.jobapp.jobs.noop", "every": 3600},
                     "morning-digest": {"job": "tests.jobapp.jobs.noop", "cron": "0 7 * * mon-fri",
                                        "queue": "emails"}},
    }
    conf.reset()
    context = browser.new_context(base_url=live_server.url, viewport={"width": WIDTH, "height": 900})
    context.add_init_script("localStorage.setItem('django.admin.navSidebarIsOpen', 'false')")
    page = context.new_page()
    page.on("dialog", lambda dialog: pytest.fail(f"a script ran: {dialog.message}"))
    yield page
    context.close()


def opened(page: Any, path: str) -> Any:
    response = page.goto(path)
    assert response.status == 200, (path, response.status)
    return page


def content(page: Any, name: str, selector: str = "#content", height: float = 900, width: float = WIDTH
            ) -> None:
    """Save what `selector` holds: its first `height` pixels down and `width` across."""
    box = page.locator(selector).first.bounding_box()
    assert box and box["x"] + box["width"] <= WIDTH, f"{selector} is {box}, past the window"
    page.set_viewport_size({"width": WIDTH, "height": max(900, int(box["y"] + height) + 1)})  # (all in view)
    box = page.locator(selector).first.bounding_box()
    shot(page, name, clip={"x": box["x"], "y": box["y"], "width": min(box["width"], width),
                           "height": min(box["height"], height)})
    page.set_viewport_size({"width": WIDTH, "height": 900})


def not_overflowing(page: Any) -> None:
    """Nothing on the page is wider than the window (no side scroll)."""
    assert page.evaluate("document.documentElement.scrollWidth") <= WIDTH


CUT_WORDS = """selector => [...document.querySelectorAll(selector)].flatMap(cell => {
    const text = cell.firstChild, cut = [];
    for (const word of text.textContent.matchAll(/[\\w-]+/g)) {
        const range = document.createRange();
        range.setStart(text, word.index);
        range.setEnd(text, word.index + word[0].length);
        if (range.getClientRects().length > 1) cut.push(word[0]);
    }
    return cut;
})"""
"""The words of cells that a line break cuts in two."""


def admin() -> None:
    User.objects.create_superuser("admin", "admin@example.com", "admin")


def test_search_live_and_history_then_retry_every_match(wide: Any) -> None:
    admin()
    found = scene.live_jobs()
    scene.history_week()
    login(wide, "admin", "admin")
    opened(wide, f"{LIVE}/search/?q=kwargs.tenant%3Dacme&state=dead&queue=emails")
    rows = wide.locator("#search-results tr[data-job]")
    assert rows.count() == 50 and "SMTPRecipientsRefused" in wide.inner_text("#search-results")
    not_overflowing(wide)
    content(wide, "console-search-live.png", height=700)

    opened(wide, f"{LIVE}/search/?q=kwargs.tenant%3Dacme&state=dead&where=history")
    assert wide.locator("#search-results tr[data-job]").count() > 5
    assert "CardDeclined" in wide.inner_text("#search-results")
    not_overflowing(wide)
    content(wide, "console-search-history.png", height=700)

    opened(wide, f"{LIVE}/search/?q=kwargs.tenant%3Dacme&state=dead&queue=emails")
    wide.click("button[value=retry]")
    wide.wait_for_selector("#bulk-count", timeout=30_000)
    assert "64" in wide.inner_text("#bulk-count")
    content(wide, "console-bulk-confirm.png", width=1140)
    wide.click("input[value='Yes, retry 64 jobs']")
    wide.wait_for_selector("#bulk-status:text-is('done')", timeout=60_000)
    assert "64 done, 0 skipped of 64" in wide.inner_text("#bulk-progress")
    content(wide, "console-bulk-progress.png", width=1140)
    assert len(found["dead"]) == 64


def test_history_charts_of_a_week_and_of_one_handler(wide: Any) -> None:
    admin()
    finished = scene.history_week()
    login(wide, "admin", "admin")
    opened(wide, f"{LIVE}/charts/?range=week")
    summary = wide.inner_text("#jq-chart-summary")
    assert re.match(r"\d+ job\(s\) finished in the last 7 days", summary)
    assert int(summary.split()[0]) > finished * 0.95  # (the oldest few fall before the range)
    assert wide.locator("svg.jq-history-chart").count() == 4
    assert wide.locator("svg.jq-history-chart rect").count() > 100  # bars: the week has a shape
    not_overflowing(wide)
    content(wide, "console-charts-week.png", height=590, width=880)
    totals = wide.inner_text("table.jq-chart-totals")
    assert all(handler in totals for handler in (scene.RECEIPT, scene.CHARGE, scene.REPORT))
    content(wide, "console-charts-totals.png", selector="table.jq-chart-totals")
    wide.click(f"tr[data-handler='{scene.CHARGE}'] td:nth-child(2) a")
    assert "in queue billing by" in wide.inner_text("#jq-chart-summary")


def test_periodic_jobs_in_the_database_beside_the_settings(wide: Any) -> None:
    admin()
    stored = scene.stored_schedule()
    login(wide, "admin", "admin")
    opened(wide, "/admin/jobqueue/schedule/")
    assert "nightly-revenue" in wide.inner_text("#result_list")
    assert "cleanup-sessions" in wide.inner_text("#jq-settings-schedules")
    not_overflowing(wide)
    content(wide, "console-schedules-admin.png")
    opened(wide, f"/admin/jobqueue/schedule/{stored.pk}/change/")
    assert wide.input_value("#id_cron") == "30 2 * * *"
    content(wide, "console-schedule-form.png", height=760, width=700)
    opened(wide, f"{LIVE}/schedules/")
    assert "database" in wide.inner_text("tr[data-schedule=nightly-revenue]")
    assert "settings (read-only)" in wide.inner_text("tr[data-schedule=morning-digest]")
    not_overflowing(wide)
    content(wide, "console-schedules.png", width=1200)


def test_enqueue_a_job_with_a_field_refused(wide: Any) -> None:
    admin()
    login(wide, "admin", "admin")
    opened(wide, f"{LIVE}/enqueue/")
    wide.select_option("#id_handler", "tests.jobapp.jobs.echo")
    wide.fill("#id_args", '["order-2231"]')
    wide.fill("#id_kwargs", '{"tenant": "acme", "resend": true}')
    wide.fill("#id_queue", "emails")
    wide.fill("#id_lane", "acme")
    wide.fill("#id_debounce", "30")
    wide.click("input[value=Enqueue]")
    wide.wait_for_selector("ul[data-field=debounce]")
    assert wide.input_value("#id_kwargs") == '{"tenant": "acme", "resend": true}'
    not_overflowing(wide)
    content(wide, "console-enqueue.png", height=1400, width=800)


def test_a_restricted_user_and_hidden_arguments(wide: Any, settings: Any) -> None:
    settings.JOBQUEUE = {**settings.JOBQUEUE, "CONSOLE": {"ACCESS": {"billing": {"view": ["support"]}}}}
    conf.reset()
    found = scene.live_jobs()
    sam = User.objects.create_user("sam", "sam@example.com", "pw", is_staff=True)
    sam.user_permissions.set(Permission.objects.filter(content_type__app_label="jobqueue")
                             .exclude(codename="view_hidden_args"))
    sam.groups.add(Group.objects.create(name="support"))
    login(wide, "sam", "pw")
    opened(wide, f"{LIVE}/search/?queue=billing")
    text = wide.inner_text("#search-results")
    assert "•••" in text and "4111" not in text and "order-1800" in text
    assert wide.query_selector("#bulk-form") is None  # (view only: no bulk action)
    assert wide.evaluate(CUT_WORDS, "#search-results td.jq-args") == []  # (lines break between words)
    not_overflowing(wide)
    content(wide, "console-hidden-args.png", height=600)
    opened(wide, f"{LIVE}/jobs/billing/{found['declined'][0]}/")
    assert wide.locator("input[value=Retry]").count() == 0 and "•••" in wide.inner_text("#content")
    content(wide, "console-access-job.png", height=800, width=1140)
    assert wide.goto(f"{LIVE}/queues/emails/").status == 404


def test_a_sealed_job_to_a_user_without_the_permission(wide: Any, settings: Any) -> None:
    settings.JOBQUEUE = {**settings.JOBQUEUE, "ENCRYPTION_KEYS": [NEW],
                         "QUEUES": {**settings.JOBQUEUE["QUEUES"], "vault": {"encrypt": True}}}
    conf.reset()
    dead = jobs.confide.using(queue="vault", lane="acme").enqueue("4111 1111 1111 1111", fail=True)
    burst("vault")
    op = User.objects.create_user("op", "op@example.com", "pw", is_staff=True)
    op.user_permissions.set(Permission.objects.filter(codename__in=["view_job", "retry_job"]))
    login(wide, "op", "pw")
    opened(wide, f"{LIVE}/jobs/vault/{dead.id}/")
    assert f"🔒 sealed (key {kid(NEW)})" in wide.inner_text("#content")
    assert "4111" not in wide.content()
    not_overflowing(wide)
    content(wide, "console-sealed-job.png", height=850, width=1140)
