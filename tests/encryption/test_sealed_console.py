"""The console shows a sealed job's data as sealed, naming its key, unless the user holds
`jobqueue.view_sealed` (and the keys are configured there); its search never matches it."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from jobqueue import Queue, chord
from jobqueue.history.mirror import Mirror
from tests.inprocess import burst
from tests.jobapp import jobs
from tests.servers import ValkeyProcess

from .conftest import NEW, SECRET, kid, sealed_settings

pytestmark = pytest.mark.django_db(transaction=True)
LIVE = "/admin/jobqueue/job/live"
ROW = "/admin/jobqueue/job/{}/change/"
"""The Job admin's change form: a history row's page."""


def _staff(client: Client, *perms: str) -> Client:
    user = User.objects.create_user("op", "op@example.com", "pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=perms))
    client.login(username="op", password="pw")
    return client


@pytest.fixture
def sealed_jobs(settings: Any, valkey_server: ValkeyProcess) -> tuple[str, str]:
    sealed_settings(settings, valkey_server.url, [NEW])
    done = jobs.confide.using(queue="vault", lane="tenant-7").enqueue(SECRET)
    dead = jobs.confide.using(queue="vault", lane="tenant-7").enqueue(SECRET, fail=True)
    burst("vault")
    return done.id, dead.id


def test_a_sealed_job_shows_as_sealed_without_the_permission(
    client: Client, sealed_jobs: tuple[str, str]
) -> None:
    _staff(client, "view_job")
    for job_id in sealed_jobs:
        page = client.get(f"{LIVE}/jobs/vault/{job_id}/").content.decode()
        assert f"🔒 sealed (key {kid(NEW)})" in page and SECRET not in page
    listing = client.get(f"{LIVE}/queues/vault/?state=dead").content.decode()
    assert SECRET not in listing and sealed_jobs[1] in listing


def test_the_permission_opens_a_sealed_job_on_its_page(client: Client, sealed_jobs: tuple[str, str]) -> None:
    _staff(client, "view_job", "view_sealed")
    done, dead = (client.get(f"{LIVE}/jobs/vault/{job_id}/").content.decode() for job_id in sealed_jobs)
    assert SECRET in done and SECRET.upper() in done and "🔒" not in done
    assert f"cannot use {SECRET}" in dead


def test_the_permission_shows_sealed_without_the_keys(
    client: Client, settings: Any, sealed_jobs: tuple[str, str]
) -> None:
    settings.JOBQUEUE = {**settings.JOBQUEUE, "ENCRYPTION_KEYS": []}
    _staff(client, "view_job", "view_sealed")
    page = client.get(f"{LIVE}/jobs/vault/{sealed_jobs[0]}/").content.decode()
    assert f"🔒 sealed (key {kid(NEW)})" in page and SECRET not in page


def test_search_says_sealed_queues_are_not_matched(client: Client, sealed_jobs: tuple[str, str]) -> None:
    _staff(client, "view_job", "view_sealed")
    found = client.get(f"{LIVE}/find/?id=tenant-7").content.decode()
    assert 'id="sealed-note"' in found and "vault" in found and SECRET not in found
    assert "No job has" in client.get(f"{LIVE}/find/?id={SECRET}").content.decode()


def _mirrored(sealed_jobs: tuple[str, str]) -> None:
    assert Mirror([Queue("vault")], consumer="t").step() >= 2


def test_the_job_admins_row_page_shows_a_sealed_row_as_sealed_without_the_permission(
    client: Client, sealed_jobs: tuple[str, str]
) -> None:
    _mirrored(sealed_jobs)
    _staff(client, "view_job")
    for job_id in sealed_jobs:
        page = client.get(ROW.format(job_id)).content.decode()
        assert job_id in page and f"🔒 sealed (key {kid(NEW)})" in page
        assert "jq1." not in page and SECRET not in page


def test_the_job_admins_row_page_opens_a_sealed_row_for_the_permission(
    client: Client, settings: Any, sealed_jobs: tuple[str, str]
) -> None:
    _mirrored(sealed_jobs)
    _staff(client, "view_job", "view_sealed")
    done, dead = (client.get(ROW.format(job_id)).content.decode() for job_id in sealed_jobs)
    assert SECRET in done and SECRET.upper() in done and "🔒" not in done and "jq1." not in done
    assert f"cannot use {SECRET}" in dead and "jq1." not in dead
    settings.JOBQUEUE = {**settings.JOBQUEUE, "ENCRYPTION_KEYS": []}  # (no keys: nothing opens)
    page = client.get(ROW.format(sealed_jobs[0])).content.decode()
    assert f"🔒 sealed (key {kid(NEW)})" in page and SECRET not in page and "jq1." not in page


@pytest.mark.parametrize("perms", [("view_job",), ("view_job", "view_sealed")])
def test_a_flow_page_across_a_sealed_queue_shows_its_errors_and_progress_sealed(
    client: Client, settings: Any, valkey_server: ValkeyProcess, perms: tuple[str, ...]
) -> None:
    """The flow page and its graph are lists: they show a sealed job's error and progress as
    sealed, never opened, whoever looks (its job page opens them for the permission)."""
    sealed_settings(settings, valkey_server.url, [NEW])
    member = jobs.confide.using(queue="vault")
    header = [member.s(SECRET), member.s(SECRET, fail=True)]
    flow = chord(header, jobs.total.using(queue="default").s(), on_failure="ignore").enqueue()
    burst("vault", "default")
    assert flow.result(5)[0]["echo"] == SECRET.upper()
    _staff(client, *perms)
    page = client.get(f"{LIVE}/flows/default/{flow.id}/").content.decode()
    assert 'class="jq-flow"' in page and SECRET not in page and "jq1." not in page
    table = page[page.index('id="flow-jobs"') :]
    graph = page[page.index('class="jq-flow"') : page.index('id="flow-jobs"')]
    label = f"🔒 sealed (key {kid(NEW)})"
    assert table.count(label) >= 3  # (each member's progress, the failed one's error)
    assert label in graph  # (the failed member's error, on its box)


def test_a_history_search_lists_a_sealed_rows_error_and_arguments_sealed(
    client: Client, sealed_jobs: tuple[str, str]
) -> None:
    """Search results are a list: a sealed row's error shows as sealed, never as its token."""
    _mirrored(sealed_jobs)
    _staff(client, "view_job")
    for where in ("history", "live"):
        page = client.get(f"{LIVE}/search/", {"queue": "vault", "state": "dead", "where": where})
        text = page.content.decode()
        assert page.status_code == 200 and sealed_jobs[1] in text, where
        assert "jq1." not in text and SECRET not in text, where
        assert f"🔒 sealed (key {kid(NEW)})" in text, where
