"""Periodic jobs kept in the database: edited in the admin while real workers run, each tick
fired once, a change seen within a tick, a disabled one silent, the settings' entries firing
while the database is down."""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from jobqueue.conf import get_client
from jobqueue.models import Job, Schedule
from jobqueue.operations import schedule, stored_schedules
from tests.console.test_round_two import schedule_form
from tests.servers import ValkeyProcess
from tests.workers import start_worker, wait_for

pytestmark = pytest.mark.django_db(transaction=True)
NOOP = "tests.jobapp.jobs.noop"


def stop_worker(worker: subprocess.Popen[bytes]) -> None:
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(30) == 0


def test_the_loader_reads_enabled_rows_again_when_one_changes(settings: Any) -> None:
    client = get_client()
    loader = stored_schedules.Loader()
    settings_entries = schedule_entries({"clock": {"job": NOOP, "every": 1}})
    assert set(loader.entries(client, settings_entries)) == {"clock"}
    Schedule.objects.create(name="beat", job=NOOP, every=5)
    Schedule.objects.create(name="off", job=NOOP, every=5, enabled=False)
    Schedule.objects.create(name="clock", job=NOOP, every=9)  # (the settings' entry wins)
    found = loader.entries(client, settings_entries)
    assert set(found) == {"clock", "beat"} and found["clock"].every == 1
    Schedule.objects.filter(name="beat").update(every=7)  # (a change no signal saw: not reread)
    assert loader.entries(client, settings_entries)["beat"].every == 5
    Schedule.objects.get(name="beat").save()  # (a save through the model: the counter moves)
    assert loader.entries(client, settings_entries)["beat"].every == 7


def schedule_entries(raw: dict[str, Any]) -> Any:
    from jobqueue import cron

    return cron.parse(raw)


def ticks(name: str) -> list[int]:
    keys = Job.objects.filter(unique_key__startswith=f"schedule:{name}:").values_list("unique_key", flat=True)
    return sorted(int(key.rsplit(":", 1)[1]) for key in keys)


def valkey_ms() -> int:
    return int(schedule.server_now(get_client()).timestamp() * 1000)


def last_tick(name: str) -> int:
    return schedule.state(get_client()).get(name, {}).get("last", 0)


@pytest.mark.slow
def test_a_schedule_edited_in_the_admin_fires_once_per_tick_while_workers_run(
    valkey_server: ValkeyProcess, monkeypatch: pytest.MonkeyPatch, client: Client
) -> None:
    monkeypatch.setenv("JOBQUEUE_TEST_SCHEDULE", json.dumps({"clock": {"job": NOOP, "every": 1}}))
    User.objects.create_superuser("root", "root@example.com", "pw")
    client.login(username="root", password="pw")
    worker = start_worker(valkey_server.url, "--workers", "2")
    try:
        wait_for(lambda: last_tick("clock") > 0, timeout=30)  # (the workers are up)
        form = schedule_form(name="beat", every="1")
        assert client.post("/admin/jobqueue/schedule/add/", form).status_code == 302
        wait_for(lambda: len(ticks("beat")) >= 3, timeout=30)  # (its first sight fires none)
        row = Schedule.objects.get(name="beat")
        edited = valkey_ms()
        response = client.post(f"/admin/jobqueue/schedule/{row.pk}/change/", {**form, "every": "2"})
        assert response.status_code == 302
        wait_for(lambda: len([t for t in ticks("beat") if t > edited + 1000]) >= 3, timeout=30)
        disabled = valkey_ms()
        form.pop("enabled")  # (an unticked checkbox)
        response = client.post(f"/admin/jobqueue/schedule/{row.pk}/change/", {**form, "every": "2"})
        assert response.status_code == 302
        wait_for(lambda: last_tick("clock") > disabled + 4000, timeout=30)
        assert last_tick("beat") <= disabled + 1000  # seen within a tick: then silent
    finally:
        stop_worker(worker)
    every_tick = ticks("beat")
    assert len(every_tick) == len(set(every_tick))  # each tick once, over two worker processes
    before = [t for t in every_tick if t <= edited]
    after = [t for t in every_tick if t > edited + 1000]
    assert all(b - a == 1000 for a, b in itertools.pairwise(before))  # none skipped
    assert all(t % 2000 == 0 for t in after)  # the edit seen within one tick
    assert all(b - a == 2000 for a, b in itertools.pairwise(after))


@pytest.mark.slow
def test_a_database_that_is_down_does_not_stop_the_settings_schedules(
    valkey_server: ValkeyProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JOBQUEUE_TEST_SCHEDULE", json.dumps({"clock": {"job": NOOP, "every": 1}}))
    worker = start_worker(valkey_server.url, db_url="postgres://postgres@127.0.0.1:1/nowhere")
    try:
        wait_for(lambda: last_tick("clock") > 0, timeout=30)
        first = last_tick("clock")
        wait_for(lambda: last_tick("clock") >= first + 3000, timeout=30)
    finally:
        stop_worker(worker)
