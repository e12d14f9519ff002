"""Periodic jobs: crontab and interval ticks, each tick enqueued once whatever the number of
workers, a missed tick fired once, `manage.py check` naming a bad entry."""

from __future__ import annotations

import itertools
import json
import signal
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.core.checks import run_checks

from jobqueue import Queue, conf, cron
from jobqueue.conf import get_client
from jobqueue.exceptions import ConfigurationError
from jobqueue.models import Job
from jobqueue.operations import schedule
from tests.servers import ValkeyProcess
from tests.workers import run_burst, start_worker, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def entry(**spec: Any) -> cron.Entry:
    return cron.parse({"e": {"job": "tests.jobapp.jobs.noop", **spec}})["e"]


@pytest.mark.parametrize(("cron", "now", "latest", "following"), [
    ("30 2 * * *", "2026-11-30 14:00", "2026-11-30 02:30", "2026-12-01 02:30"),
    ("*/15 9-17 * * mon-fri", "2026-11-28 12:00", "2026-11-27 17:45", "2026-11-30 09:00"),
    ("0 0 1 * *", "2026-03-15 00:00", "2026-03-01 00:00", "2026-04-01 00:00"),
    ("0 12 13 * 5", "2026-11-30 00:00", "2026-11-27 12:00", "2026-12-04 12:00"),  # 13th or Friday
    ("59 23 29 2 *", "2027-01-01 00:00", "2024-02-29 23:59", "2028-02-29 23:59"),
    ("0,30 8 * jan,jul 0", "2026-07-06 09:00", "2026-07-05 08:30", "2026-07-12 08:00"),
])
def test_cron_ticks(cron: str, now: str, latest: str, following: str) -> None:
    e = entry(cron=cron)
    assert e.latest_tick(utc(now)) == utc(latest)
    assert e.next_tick(utc(now)) == utc(following)


def test_a_cron_entry_ticks_in_its_own_timezone() -> None:
    e = entry(cron="0 9 * * *", timezone="Europe/Paris")
    assert e.latest_tick(utc("2026-11-30 12:00")) == utc("2026-11-30 08:00")  # UTC+1 in winter
    assert e.latest_tick(utc("2026-07-01 12:00")) == utc("2026-07-01 07:00")  # UTC+2 in summer


def test_interval_ticks_are_aligned() -> None:
    e = entry(every=60)
    assert e.latest_tick(utc("2026-11-30 14:00:59")) == utc("2026-11-30 14:00")
    assert e.next_tick(utc("2026-11-30 14:00:59")) == utc("2026-11-30 14:01")


@pytest.mark.parametrize(("spec", "message"), [
    ({"cron": "61 * * * *"}, "minute '61': values must be within 0…59"),
    ({"cron": "* * *"}, "must have five fields"),
    ({"cron": "*/0 * * * *"}, "the step must be a positive number"),
    ({"cron": "* * * * funday"}, "is not a number or a name"),
    ({"every": 0}, "'every' must be seconds"),
    ({"cron": "* * * * *", "every": 5}, "exactly one of 'cron' and 'every'"),
    ({"every": 5, "timezone": "Mars/Olympus"}, "unknown timezone"),
    ({"every": 5, "colour": "red"}, "unknown key(s) ['colour']"),
    ({"every": 5, "queue": "bad name"}, "invalid queue name"),
])
def test_a_bad_entry_is_refused_naming_it(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=r"SCHEDULE'\]\['e'\]") as error:
        cron.parse({"e": {"job": "tests.jobapp.jobs.noop", **spec}})
    assert message in str(error.value)


def test_manage_py_check_names_a_bad_expression_and_an_unknown_job(settings: Any) -> None:
    settings.JOBQUEUE = {**settings.JOBQUEUE, "SCHEDULE": {"e": {"job": "a.b", "cron": "x"}}}
    [error] = [e for e in run_checks(tags=["jobqueue"]) if e.id.startswith("jobqueue.")]
    assert error.id == "jobqueue.E002" and "five fields" in error.msg and "periodic jobs" in error.hint
    settings.JOBQUEUE = {**settings.JOBQUEUE, "SCHEDULE": {"e": {"job": "nope.jobs.gone", "every": 5}}}
    [error] = [e for e in run_checks(tags=["jobqueue"]) if e.id.startswith("jobqueue.")]
    assert error.id == "jobqueue.E003" and "'nope.jobs.gone'" in error.msg and error.hint
    settings.JOBQUEUE = {**settings.JOBQUEUE,
                         "SCHEDULE": {"e": {"job": "tests.jobapp.jobs.noop", "every": 5}}}
    assert not [e for e in run_checks(tags=["jobqueue"]) if e.id.startswith("jobqueue.")]


@pytest.mark.parametrize("where", ["standalone", "cluster"])
def test_each_tick_fires_once_a_missed_one_once_and_a_paused_entry_never(
        where: str, request: pytest.FixtureRequest, settings: Any) -> None:
    if where == "cluster":
        cluster = request.getfixturevalue("valkey_cluster")
        settings.JOBQUEUE = {"URL": cluster.url, "QUEUES": {"default": {"shards": 3}}}
        conf.reset()
        get_client().flushall(target_nodes="primaries")
    entries = {"beat": entry(every=60, kwargs={})}
    client = get_client()
    now = utc("2026-11-30 14:00:30")
    assert schedule.fire_due(entries, client, now) == 0  # first sight: starts here, no fire
    assert schedule.fire_due(entries, client, now + timedelta(seconds=20)) == 0  # same tick
    assert schedule.fire_due(entries, client, now + timedelta(seconds=40)) == 1  # 14:01
    assert schedule.fire_due(entries, client, now + timedelta(seconds=50)) == 0
    assert schedule.fire_due(entries, client, now + timedelta(hours=5)) == 1  # 300 missed: once
    schedule.set_paused(client, "beat", True)
    assert schedule.fire_due(entries, client, now + timedelta(hours=6)) == 0
    schedule.set_paused(client, "beat", False)
    assert schedule.fire_due(entries, client, now + timedelta(hours=7)) == 1
    assert Queue("default").counts()["pending"] == 3
    state = schedule.state(client)["beat"]
    assert state["last"] == int(utc("2026-11-30 21:00").timestamp() * 1000)
    assert Queue("default").get(state["job"]) is not None


@pytest.mark.slow
def test_two_workers_fire_every_tick_of_an_every_second_schedule_once(
        valkey_server: ValkeyProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    beat = {"beat": {"job": "tests.jobapp.jobs.noop", "every": 1}}
    monkeypatch.setenv("JOBQUEUE_TEST_SCHEDULE", json.dumps(beat))
    assert run_burst(valkey_server.url) == 0  # a --burst run fires nothing
    assert Job.objects.count() == 0 and "beat" not in schedule.state(get_client())
    workers = [start_worker(valkey_server.url) for _ in range(2)]
    try:
        wait_for(lambda: Job.objects.filter(unique_key__startswith="schedule:beat:").count() >= 4,
                 timeout=30)
    finally:
        for w in workers:
            w.send_signal(signal.SIGTERM)
        assert [w.wait(20) for w in workers] == [0, 0]
    ticks = sorted(int(key.rsplit(":", 1)[1]) for key in
                   Job.objects.filter(unique_key__startswith="schedule:beat:")
                   .values_list("unique_key", flat=True))
    assert len(ticks) == len(set(ticks)) >= 4  # each tick once, whatever the number of workers
    assert all(b - a == 1000 for a, b in itertools.pairwise(ticks))  # none skipped


def test_a_worker_whose_clock_runs_a_day_fast_silences_no_tick() -> None:
    """`fire_due`'s `now` is a worker's clock reading (the maintenance turn passes none: Valkey's
    clock rules). A worker a day fast fires no tick of tomorrow and records nothing ahead of
    Valkey's clock, so the others go on firing every tick; and a tick recorded a day ahead
    (before this bound) counts for none. (libfaketime cannot move a real worker's clock here:
    under it, Python's monotonic waits hang or fail, so a runworker would not run.)"""
    client = get_client()
    beat = {"beat": entry(every=1, kwargs={})}
    valkey = datetime.now(UTC)  # (the test's server runs on this machine: the same clock)
    assert schedule.fire_due(beat, client, valkey - timedelta(seconds=5)) == 0  # first sight
    assert schedule.fire_due(beat, client, valkey + timedelta(days=1)) == 1  # the fast worker
    last = schedule.state(client)["beat"]["last"]
    assert last <= (datetime.now(UTC) + timedelta(seconds=1)).timestamp() * 1000  # not tomorrow's
    wait_for(lambda: schedule.fire_due(beat, client) == 1, timeout=5)  # the next tick fires
    ahead = int((datetime.now(UTC) + timedelta(days=1)).timestamp() * 1000)
    client.hset(schedule.STATE_KEY, "beat", json.dumps({"last": ahead}))  # an older worker's
    assert schedule.fire_due(beat, client) == 1
    assert schedule.state(client)["beat"]["last"] < ahead
