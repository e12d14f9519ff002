"""`manage.py jobqueue resize` run twice in a row: the second is refused only while the first
still has something to work off (the check the workers run, made by the command itself)."""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from jobqueue import Queue
from jobqueue.keys import placement_hash

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _four_shards(settings: Any) -> None:
    settings.JOBQUEUE = {**settings.JOBQUEUE, "QUEUES": {"default": {}, "q": {"shards": 4}}}


def resize(*argv: str) -> str:
    out = StringIO()
    call_command("jobqueue", "resize", *argv, stdout=out, stderr=StringIO())
    return out.getvalue()


def test_a_second_resize_goes_through_when_the_first_has_nothing_to_work_off() -> None:
    assert "4 → 8 shards" in resize("q", "8")
    assert "8 → 2 shards" in resize("q", "2")  # no lane, no unique key, no job: settled at once
    layout = Queue("q").layout(fresh=True)
    assert (layout.live, layout.prior, layout.span) == (2, 8, 8)


def test_a_second_resize_is_refused_while_a_moved_lane_still_holds_jobs() -> None:
    lane = next(n for n in (f"player-{i}" for i in range(1000))
                if placement_hash(n) % 4 != placement_hash(n) % 8)
    Queue("q").enqueue("x", lane=lane)
    resize("q", "8")
    with pytest.raises(CommandError, match="still settling"):
        resize("q", "2")
    assert Queue("q").layout(fresh=True).live == 8


def test_the_consoles_confirm_step_offers_a_second_resize_that_has_nothing_to_wait_for(
        client: Any, django_user_model: Any) -> None:
    django_user_model.objects.create_superuser("root", "root@example.com", "pw")
    client.login(username="root", password="pw")
    resize("q", "8")
    url = "/admin/jobqueue/job/live/queues/q/resize/"
    confirm = client.post(url, {"count": "2"}).content.decode()
    assert "from 8 to <b>2</b> live shards?" in confirm
    assert client.post(url, {"count": "2", "confirm": "yes"}).status_code == 302
    assert Queue("q").layout(fresh=True).live == 2
