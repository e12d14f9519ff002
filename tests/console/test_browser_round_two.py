"""The history charts, the periodic jobs' admin and the enqueue form in a real browser (Debian's
chromium driven by Playwright against live_server); screenshots under var/screenshots/."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User

from jobqueue import Queue
from jobqueue.models import Schedule
from tests.console.test_browser import SHOTS, browser, login, page
from tests.console.test_round_two import history_rows

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
__all__ = ["browser", "page"]  # (the fixtures, shared with test_browser)


def test_an_operator_reads_the_history_charts_by_range_queue_and_handler(page: Any) -> None:
    User.objects.create_superuser("admin", "admin@example.com", "admin")
    history_rows()
    login(page, "admin", "admin")
    page.click("text=History charts")
    page.wait_for_selector("svg.jq-history-chart")
    assert page.locator("svg.jq-history-chart").count() == 4
    assert "40 job(s) finished in the last day" in page.inner_text("#jq-chart-summary")
    page.select_option("select[name=range]", "week")
    page.click("input[value=Show]")
    page.wait_for_selector("text=45 job(s) finished in the last 7 days")
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "charts.png"), full_page=True)
    page.click("tr[data-handler='app.jobs.send'] td:nth-child(2) a")
    page.wait_for_selector("text=40 job(s) finished in the last 7 days in queue default by")
    tooltips = page.locator("svg.jq-history-chart rect title").evaluate_all(
        "titles => titles.map(t => t.textContent)"
    )
    assert any("succeeded: " in text for text in tooltips)
    assert page.evaluate("document.querySelectorAll('script[src^=\"http\"]').length") == 0


def test_an_operator_adds_a_periodic_job_in_the_admin_and_sees_it_in_the_console(
    page: Any, settings: Any
) -> None:
    from jobqueue import conf

    settings.JOBQUEUE = {
        **settings.JOBQUEUE,
        "SCHEDULE": {"beat": {"job": "tests.jobapp.jobs.noop", "every": 60}},
    }
    conf.reset()
    User.objects.create_superuser("admin", "admin@example.com", "admin")
    login(page, "admin", "admin")
    page.goto("/admin/jobqueue/schedule/")
    assert "beat" in page.inner_text("#jq-settings-schedules")  # the settings', read-only
    page.goto("/admin/jobqueue/schedule/add/")
    page.fill("#id_name", "nightly")
    page.fill("#id_job", "tests.jobapp.jobs.nope")
    page.fill("#id_cron", "61 2 * * *")
    page.click("input[name=_save]")
    page.wait_for_selector(".errornote")
    errors = page.inner_text("#content-main")
    assert "no @job handler registered as" in errors and "values must be within 0…59" in errors
    page.fill("#id_job", "tests.jobapp.jobs.noop")
    page.fill("#id_cron", "30 2 * * *")
    page.fill("#id_kwargs", '{"report": "daily"}')
    page.click("input[name=_save]")
    page.wait_for_selector(".messagelist .success")
    assert Schedule.objects.get().kwargs == {"report": "daily"}
    page.goto("/admin/jobqueue/job/live/schedules/")
    row = page.inner_text("tr[data-schedule=nightly]")
    assert "database" in row and "30 2 * * *" in row
    assert "settings (read-only)" in page.inner_text("tr[data-schedule=beat]")
    page.screenshot(path=str(SHOTS / "schedules_database.png"), full_page=True)


def test_an_operator_enqueues_a_job_from_the_console(page: Any) -> None:
    User.objects.create_superuser("admin", "admin@example.com", "admin")
    login(page, "admin", "admin")
    page.click("text=Enqueue a job")
    page.select_option("#id_handler", "tests.jobapp.jobs.add")
    page.fill("#id_args", "[2, 3]")
    page.fill("#id_priority", "500")
    page.click("input[value=Enqueue]")
    page.wait_for_selector("ul[data-field=priority]")
    assert "priority must be an integer in -100…100, got 500" in page.inner_text("ul[data-field=priority]")
    assert page.input_value("#id_args") == "[2, 3]"  # what was typed is kept
    page.fill("#id_priority", "5")
    page.fill("#id_lane", "tenant-7")
    page.screenshot(path=str(SHOTS / "enqueue.png"), full_page=True)
    page.click("input[value=Enqueue]")
    page.wait_for_selector("#job-state")
    assert page.inner_text("#job-state").startswith("pending")
    assert "Enqueued job" in page.inner_text(".messagelist")
    assert Queue("default").counts()["pending"] == 1
