"""What a first look at the console shows, in a real browser: the dashboard's cards hold their
tables at 1400 pixels, a queue's page opens on what is there, per-queue access as a user of
another group sees it."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Group, Permission, User

from jobqueue import Queue, conf
from jobqueue.history.mirror import upsert
from tests.console.test_browser import browser, login, page, shot  # noqa: F401 (fixtures)
from tests.jobapp import jobs

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
LIVE = "/admin/jobqueue/job/live"
OVERFLOWING = """() => [...document.querySelectorAll("section.jq-card")].filter(card => {
    const table = card.querySelector("table");
    return table.scrollWidth > card.clientWidth
        || table.getBoundingClientRect().right > card.getBoundingClientRect().right + 0.5;
}).map(card => card.dataset.queue)"""


@pytest.mark.parametrize("width", [1400, 1024, 700])
def test_no_dashboard_card_cuts_its_count_table_off(page: Any, width: int) -> None:  # noqa: F811
    User.objects.create_superuser("admin", "admin@example.com", "admin")
    for name in ("default", "emails", "billing-with-a-long-name", "reports"):
        jobs.add.using(queue=name).enqueue_many([(i, i) for i in range(123_456 % 97)])
    page.set_viewport_size({"width": width, "height": 900})
    login(page, "admin", "admin")
    page.wait_for_selector("section.jq-card[data-queue=reports]")
    assert page.locator("section.jq-card").count() == 4
    assert page.evaluate(OVERFLOWING) == []
    if width == 1400:
        shot(page, "console-dashboard-1400.png", clip={"x": 300, "y": 0, "width": 1100, "height": 600})


def test_a_queue_page_opens_on_its_deepest_lane_and_else_on_what_is_there(page: Any) -> None:  # noqa: F811
    User.objects.create_superuser("admin", "admin@example.com", "admin")
    jobs.add.using(lane="tenant-9").enqueue_many([(i, i) for i in range(84)])
    jobs.add.using(lane="tenant-2").enqueue_many([(i, i) for i in range(3)])
    login(page, "admin", "admin")
    page.goto(f"{LIVE}/queues/default/")
    assert "84 pending on shard 0 in lane tenant-9" in page.inner_text("p.jq-pages")
    shot(page, "console-queue-opening.png", selector="h2:text-is('Jobs')", height=330)
    page.click("a[href*='lane=tenant-2']")
    assert "3 pending on shard 0 in lane tenant-2" in page.inner_text("p.jq-pages")
    queue = Queue("emails")
    ref = jobs.always_fails.using(queue="emails", max_attempts=1).enqueue("x")
    [lease] = queue.dequeue(count=1)
    queue.nack(lease, "ValueError: x")
    page.goto(f"{LIVE}/queues/emails/")
    assert "1 dead on shard 0" in page.inner_text("p.jq-pages")
    assert page.is_visible(f"a[href$='/jobs/emails/{ref.id}/']")


def test_a_user_of_another_group_sees_and_does_only_what_is_granted(page: Any, settings: Any  # noqa: F811
                                                                    ) -> None:
    settings.JOBQUEUE = {**settings.JOBQUEUE, "CONSOLE": {"ACCESS": {
        "billing": {"view": ["support"]}, "secret": {"act": ["ops"]}}}}
    conf.reset()
    sam = User.objects.create_user("sam", "sam@example.com", "pw", is_staff=True)
    sam.user_permissions.set(Permission.objects.filter(content_type__app_label="jobqueue"))
    sam.groups.add(Group.objects.create(name="support"))
    hidden = jobs.add.using(queue="secret", lane="acme").enqueue(1, 1).id
    shown = jobs.add.using(queue="billing", lane="acme").enqueue(1, 1).id
    upsert([{"id": "JOB0000000000s", "state": "dead",
             "payload": '{"handler": "tests.jobapp.jobs.add", "args": [1, 2]}'}], "secret")
    upsert([{"id": "JOB0000000000b", "state": "dead",
             "payload": '{"handler": "tests.jobapp.jobs.add", "args": [1, 2]}'}], "billing")
    login(page, "sam", "pw")
    page.wait_for_selector("section.jq-card[data-queue=billing]")
    assert page.locator("section.jq-card").count() == 1
    shot(page, "console-access-dashboard.png", clip={"x": 0, "y": 0, "width": 1100, "height": 560})
    assert page.locator("section.jq-card input[value=Pause]").count() == 0
    page.fill("input[name=id]", "acme")
    page.click("input[value=Find]")
    page.wait_for_selector(f"text={shown}")
    assert hidden not in page.content()
    response = page.goto(f"{LIVE}/jobs/secret/{hidden}/")
    assert response.status == 404
    page.goto(f"{LIVE}/jobs/billing/{shown}/")
    assert page.locator("input[value=Cancel]").count() == 0
    status = page.evaluate("""async (url) => {
        const token = document.cookie.match(/csrftoken=([^;]+)/)[1];
        const r = await fetch(url, {method: "POST", headers: {"X-CSRFToken": token},
                                    body: new URLSearchParams({confirm: "yes"})});
        return r.status; }""", f"{LIVE}/jobs/billing/{shown}/cancel/")
    assert status == 403 and Queue("billing").get(shown).state == "pending"  # type: ignore[union-attr]
    page.goto("/admin/jobqueue/job/")
    assert "JOB0000000000b" in page.content() and "JOB0000000000s" not in page.content()
    page.check("input[name=_selected_action][value=JOB0000000000b]")
    page.select_option("select[name=action]", "retry_selected")
    page.click("button[name=index]")
    assert "You may not act on queue(s) billing" in page.inner_text(".messagelist")
    assert Queue("billing").get("JOB0000000000b") is None
