"""A flow drawn as its graph (console/flowgraph.py), and errors shown by their last line."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from jobqueue import Queue, chain, chord, group
from jobqueue.console.errors import last_line
from tests.console.test_browser import browser, login, page, shot  # noqa: F401 (fixtures)
from tests.jobapp import jobs

pytestmark = pytest.mark.django_db(transaction=True)
LIVE = "/admin/jobqueue/job/live"
TRACEBACK = ('Traceback (most recent call last):\n  File "/app/jobs.py", line 3, in charge\n'
             '    raise ValueError("bad input")\nValueError: bad input\n')


@pytest.fixture
def admin_client(client: Client) -> Client:
    User.objects.create_superuser("root", "root@example.com", "pw")
    client.login(username="root", password="pw")
    return client


def run_one(error: str | None = None) -> str:
    """Claim the next job of `default` and ack it (or, with `error`, fail it for good)."""
    queue = Queue("default")
    [lease] = queue.dequeue(count=1)
    if error is None:
        queue.ack(lease, 2)
    else:
        queue.nack(lease, error, fatal=True)
    return lease.job_id


@pytest.mark.browser
def test_an_operator_reads_a_flow_as_a_graph_and_clicks_through_to_a_job(page: Any) -> None:  # noqa: F811
    User.objects.create_superuser("admin", "admin@example.com", "admin")
    flow = chain(jobs.add.s(1, 1), group([jobs.add.s(i) for i in range(3)],
                                                   on_failure="ignore"), jobs.total.s()).enqueue()
    first = run_one()
    failed = run_one(TRACEBACK)
    login(page, "admin", "admin")
    page.goto(f"{LIVE}/flows/default/{flow.id}/")
    nodes = page.locator("svg.jq-flow g.jq-node")
    assert nodes.count() == 5
    states = {nodes.nth(i).get_attribute("data-job"): nodes.nth(i).get_attribute("data-state")
              for i in range(5)}
    assert states[first] == "succeeded" and states[failed] == "dead" and states[flow.id] == "waiting"
    assert sorted(states.values()).count("pending") == 2
    assert "waits for 2" in page.locator(f"svg.jq-flow g[data-job='{flow.id}']").text_content()
    assert page.locator("svg.jq-flow line.jq-edge").count() == 6  # 1→3 members, 3→callback
    assert "ValueError: bad input" in page.inner_text("#flow-jobs")
    assert "Traceback" not in page.inner_text("#flow-jobs")
    shot(page, "console-flow-graph.png", clip=_clip(page, "div.jq-graph"))
    page.click(f"svg.jq-flow g[data-job='{failed}']")
    page.wait_for_url(re.compile(f"/jobs/default/{failed}/$"))
    assert page.inner_text("#job-error-line") == "ValueError: bad input"
    assert not page.is_visible("#job-error")  # the whole traceback: folded, one click away
    page.click("#job-traceback summary")
    assert "Traceback (most recent call last)" in page.inner_text("#job-error")
    shot(page, "console-job-error.png", selector="#job-traceback", above=80)


@pytest.mark.browser
def test_a_chords_thousand_members_are_one_box_linking_to_their_list(page: Any) -> None:  # noqa: F811
    User.objects.create_superuser("admin", "admin@example.com", "admin")
    flow = chord([jobs.add.s(i, 1) for i in range(1000)], jobs.total.s()).enqueue()
    for _ in range(10):
        run_one()
    login(page, "admin", "admin")
    page.goto(f"{LIVE}/flows/default/{flow.id}/")
    group_box = page.locator("svg.jq-flow g.jq-group")
    assert group_box.get_attribute("data-members") == "1000"
    assert "990 pending, 10 succeeded" in group_box.locator("title").text_content()
    shot(page, "console-flow-chord.png", clip=_clip(page, "div.jq-graph"))
    group_box.click()
    page.wait_for_url(re.compile(r"\?page=1#flow-jobs$"))
    assert page.locator("#flow-jobs tr").count() == 51


def _clip(shown: Any, selector: str) -> dict[str, float]:
    box = shown.locator(selector).bounding_box()
    return {"x": box["x"], "y": box["y"], "width": min(box["width"], 900),
            "height": min(box["height"], 400)}


def test_a_chord_of_a_thousand_draws_as_two_boxes(admin_client: Client) -> None:
    flow = chord([jobs.add.s(i, 1) for i in range(1000)], jobs.total.s()).enqueue()
    for _ in range(3):
        run_one()
    shown = admin_client.get(f"{LIVE}/flows/default/{flow.id}/").content.decode()
    assert shown.count('class="jq-node') == 2
    assert 'data-members="1000"' in shown and "1,000 jobs: 997 pending, 3 succeeded" in shown
    assert f"/flows/default/{flow.id}/?page=1#flow-jobs" in shown
    assert "waits for 997" in shown
    later = admin_client.get(f"{LIVE}/flows/default/{flow.id}/?page=2").content.decode()
    assert "jq-flow" not in later  # (drawn on the first page)


def test_a_flow_too_large_to_draw_says_so(admin_client: Client, monkeypatch: Any) -> None:
    from jobqueue.console import flowgraph

    monkeypatch.setattr(flowgraph, "MAX_DRAWN", 10)
    flow = chord([jobs.add.s(i, 1) for i in range(20)], jobs.total.s()).enqueue()
    shown = admin_client.get(f"{LIVE}/flows/default/{flow.id}/").content.decode()
    assert 'id="flow-not-drawn"' in shown and "jq-flow" not in shown


def test_a_long_chain_is_one_layer_per_step() -> None:
    from jobqueue.console import flowgraph

    flow = chain(jobs.add.s(1, 1), *[jobs.add.s(i) for i in range(300)]).enqueue()
    graph = flowgraph.read(Queue("default"), flow.id)
    assert len(graph.nodes) == 301 and max(n.layer for n in graph.nodes) == 300
    assert len(graph.edges) == 300


@pytest.mark.parametrize(("text", "line"), [
    (TRACEBACK, "ValueError: bad input"),
    ("ValueError: plain", "ValueError: plain"),
    ('Traceback (most recent call last):\n  File "a.py", line 1, in f\nKeyError: \'x\'\n\n'
     'During handling of the above exception, another exception occurred:\n\n'
     'Traceback (most recent call last):\n  File "a.py", line 3, in f\n'
     'RuntimeError: two\nlines\n', "RuntimeError: two lines"),
    ("Traceback (most recent call last):\n  File \"a.py\", line 1, in f", "Traceback (most recent "
     "call last):\n  File \"a.py\", line 1, in f"),
    ("", ""),
])
def test_an_error_reads_as_its_last_line(text: str, line: str) -> None:
    assert last_line(text) == line


def test_an_attempt_keeps_its_errors_last_line_however_long_its_traceback(
        admin_client: Client) -> None:
    ref = jobs.always_fails.using(max_attempts=3).enqueue("x")
    queue = Queue("default")
    [lease] = queue.dequeue(count=1)
    queue.nack(lease, "Traceback (most recent call last):\n" + "  File x\n" * 300
               + "ValueError: attempt one", retry_in=0)
    shown = admin_client.get(f"{LIVE}/jobs/default/{ref.id}/").content.decode()
    attempts = shown[shown.index('id="job-attempts"'):]
    assert "ValueError: attempt one" in attempts and "Traceback" not in attempts
