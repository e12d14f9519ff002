"""Settings: URL forms, the django-redis alias, and the system check that explains mistakes."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.checks import run_checks

from jobqueue import Queue, conf
from jobqueue.exceptions import ConfigurationError
from tests.servers import ValkeyProcess


@pytest.mark.parametrize(("url", "expected"), [
    ("redis://h:1/0", ("redis://h:1/0", False)),
    ("valkey://:pw@h:1/2", ("redis://:pw@h:1/2", False)),
    ("valkeys://h:1/0", ("rediss://h:1/0", False)),
    ("redis://h:1/0?cluster=true", ("redis://h:1/0", True)),
    ("valkey://h:1?cluster=1&socket_timeout=5", ("redis://h:1?socket_timeout=5", True)),
])
def test_url_forms(url: str, expected: tuple[str, bool]) -> None:
    assert conf.normalise_url(url) == expected


def test_a_cluster_url_may_name_several_seed_nodes() -> None:
    assert conf.seed_nodes("redis://u:pw@h1:1,h2:2,[::1]:3/0?socket_timeout=5") == (
        "redis://u:pw@h1:1/0?socket_timeout=5", [("h2", 2), ("::1", 3)])
    assert conf.seed_nodes("redis://h1:1/0") == ("redis://h1:1/0", [])
    with pytest.raises(ConfigurationError, match="not host:port"):
        conf.seed_nodes("redis://h1:1,h2/0")
    with pytest.raises(ConfigurationError, match="only with \\?cluster=true"):
        conf.client_for_url("redis://127.0.0.1:1,127.0.0.1:2/0")


def test_unknown_url_scheme_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="scheme"):
        conf.normalise_url("http://h:1/0")


def test_a_django_redis_cache_connection_can_be_reused(settings: Any, valkey_server: ValkeyProcess) -> None:
    settings.CACHES = {"jq": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": valkey_server.url}}
    settings.JOBQUEUE = {"CACHE_ALIAS": "jq"}
    ref = Queue("default").enqueue({"x": 1})
    assert Queue("default").get(ref.id).payload == {"x": 1}  # type: ignore[union-attr]
    # a retry on a new connection, as a client made from a URL has (the cache set none)
    assert conf.get_client().connection_pool.connection_kwargs["retry"].get_retries() == 1


def test_a_django_redis_cache_keeps_its_own_retry(settings: Any, valkey_server: ValkeyProcess,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from django_redis.pool import ConnectionFactory
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    monkeypatch.setattr(ConnectionFactory, "_pools", {})  # (django-redis keeps one pool per URL)
    settings.CACHES = {"jq3": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": valkey_server.url,
                               "OPTIONS": {"CONNECTION_POOL_KWARGS": {"retry": Retry(NoBackoff(), 3)}}}}
    settings.JOBQUEUE = {"CACHE_ALIAS": "jq3"}
    assert conf.get_client().connection_pool.connection_kwargs["retry"].get_retries() == 3


@pytest.mark.parametrize(("jobqueue", "fragment"), [
    ({"QUEUES": {"emails": {"shards": 0}}}, 'shards (or "auto") must be an integer in 1…1024'),
    ({"QUEUES": {"emails": {"shards": "Auto"}}}, 'shards (or "auto") must be an integer'),
    ({"QUEUES": {"emails": {"shards": "auto", "max_shards": 0}}}, "max_shards must be an integer"),
    ({"AUTO_SHARDS": {"grow_backlg": 5}}, "did you mean 'grow_backlog'?"),
    ({"QUEUES": {"emails": {"wait_replicas": 11}}}, "wait_replicas must be an integer in 0…10"),
    ({"AUTO_SHARDS": {"every": -1}}, "JOBQUEUE['AUTO_SHARDS']['every'] must be a number"),
    ({"AUTO_SHARDS": {"grow_backlog": 10, "shrink_backlog": 10}}, "shrink thresholds must lie below"),
    ({"AUTO_SHARDS": {"grow_after": 0}}, "grow_after, shrink_after ≥ 1"),
    ({"QUEUES": {"emails": {"max_attempts": 5000}}}, "max_attempts must be an integer in 1…1000"),
    ({"DEFAULTS": {"backoff": 100_000}}, "backoff must be within 0…86400 seconds"),
    ({"QUEUES": {"emails": {"lease": 0}}}, "lease must be within"),
    ({"QUEUES": {"emails": {"colour": "red"}}}, "unknown option"),
    ({"QUEUES": {"bad name": {}}}, "invalid queue name"),
    ({"RETRIES": 3}, "unknown key"),
    ({"QUEUES": {"emails": {"lane_weights": {"vip": 0}}}}, "lane_weights['vip'] must be an integer in 1…100"),
    ({"QUEUES": {"emails": {"lane_weights": {"bad lane": 2}}}}, "invalid lane name"),
    ({"QUEUES": {"emails": {"lane_weights": ["vip", 3]}}}, "lane_weights must be a dict"),
    ({"QUEUES": {"emails": {"rate": "ten/s"}}}, 'rate must be "N/s", "N/m" or "N/h"'),
    ({"QUEUES": {"emails": {"rate": "5/d"}}}, 'rate must be "N/s", "N/m" or "N/h"'),
    ({"EVENT_LOOP": "trio"}, "EVENT_LOOP'] must be one of ('auto', 'uvloop', 'asyncio')"),
    ({"QUEUES": {"emails": {"lane_concurrency": 0}}},
     "['emails']: lane_concurrency must be an integer in 1…1000000, got 0"),
    ({"QUEUES": {"emails": {"lane_concurrency": -2}}}, "lane_concurrency must be an integer"),
    ({"QUEUES": {"emails": {"lane_concurrency": {"vip": 0}}}},
     "lane_concurrency['vip'] must be an integer in 1…1000000"),
    ({"QUEUES": {"emails": {"lane_concurrency": {"*": 2.5}}}}, "lane_concurrency['*'] must be"),
    ({"QUEUES": {"emails": {"lane_concurrency": {"bad lane": 2}}}}, "invalid lane name"),
    ({"QUEUES": {"emails": {"lane_concurrency": "2"}}}, "lane_concurrency must be an integer or a dict"),
    ({"QUEUES": {"emails": {"lane_rate": "5/d"}}}, 'lane_rate must be "N/s", "N/m" or "N/h"'),
    ({"DEFAULTS": {"lane_rate": 5}}, "JOBQUEUE['DEFAULTS']: lane_rate must be"),
])
def test_manage_py_check_explains_a_bad_jobqueue_setting(
    settings: Any, jobqueue: dict, fragment: str
) -> None:
    settings.JOBQUEUE = jobqueue
    errors = [e for e in run_checks(tags=["jobqueue"]) if e.id == "jobqueue.E001"]
    assert len(errors) == 1 and fragment in errors[0].msg and errors[0].hint


@pytest.mark.parametrize(("args", "code", "message"), [
    (["--queues", "a b"], 1, "invalid queue name"),
    (["--queues", "{x}"], 1, "invalid queue name"),
    (["--concurrency", "0"], 2, "must be at least 1"),
    (["--lease", "-3"], 2, "0…86400"),
    (["--lease", "soon"], 2, "expected seconds"),
    (["--prefetch", "-1"], 2, "must be at least 0"),
])
def test_runworker_refuses_bad_options_clearly(args: list[str], code: int, message: str) -> None:
    import subprocess
    import sys

    from tests.workers import ROOT

    done = subprocess.run([sys.executable, "manage.py", "runworker", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60,
                          env={**__import__("os").environ, "DJANGO_SETTINGS_MODULE": "tests.settings"})
    assert done.returncode == code and message in done.stderr


@pytest.mark.parametrize("options", [
    {"max_attempts": 1000, "backoff": 86_400, "lease": 86_400, "priority": -100},
    {"max_attempts": 1, "backoff": 0, "lease": 0.001, "priority": 100,
     "lane_weights": {"vip": 100, "": 1}, "rate": "1000000/h"},
    {"max_attempts": 3, "priority": 0, "lane_concurrency": {"vip": 1_000_000, "": 1, "*": 2},
     "lane_rate": "1/h"},
    {"max_attempts": 3, "priority": 0, "lane_concurrency": 1, "lane_rate": "1000000/s"},
])
def test_every_queue_setting_that_check_accepts_can_enqueue(settings: Any, options: dict) -> None:
    settings.JOBQUEUE = {**settings.JOBQUEUE, "QUEUES": {"edge": options}}
    assert not run_checks(tags=["jobqueue"])
    ref = Queue("edge").enqueue({"x": 1})
    info = Queue("edge").get(ref.id)
    assert info and info.max_attempts == options["max_attempts"] and info.priority == options["priority"]


def test_queue_settings_in_timedeltas_become_the_seconds_enqueue_claim_and_nack_use(
        settings: Any) -> None:
    from datetime import timedelta

    settings.JOBQUEUE = {**settings.JOBQUEUE, "QUEUES": {"edge": {
        "lease": timedelta(seconds=20), "backoff": timedelta(0)}}}
    assert not run_checks(tags=["jobqueue"])
    options = conf.get_config().queue("edge")
    assert (options.lease, options.backoff) == (20.0, 0.0) and isinstance(options.lease, float)
    with pytest.raises(TypeError):  # the config is parsed once and read-only
        conf.get_config().queues["edge"] = options  # type: ignore[index]
    queue = Queue("edge")
    queue.enqueue({"x": 1}, backoff=timedelta(seconds=2))
    [lease] = queue.dequeue(count=1)
    assert lease.lease == 20.0
    assert queue.nack(lease, "boom") == "scheduled"  # its own 2 s backoff, not the queue's 0


def test_an_unknown_key_gets_a_did_you_mean(settings: Any) -> None:
    settings.JOBQUEUE = {"RETENTON": 60, "QUEUES": {"default": {}}}
    [error] = [e for e in run_checks(tags=["jobqueue"]) if e.id == "jobqueue.E001"]
    assert "did you mean 'RETENTION'?" in error.msg
    settings.JOBQUEUE = {"QUEUES": {"default": {"max_attempt": 3}}}
    [error] = [e for e in run_checks(tags=["jobqueue"]) if e.id == "jobqueue.E001"]
    assert "did you mean 'max_attempts'?" in error.msg


def test_a_tasks_backend_that_cannot_be_imported_is_named(settings: Any) -> None:
    settings.TASKS = {"default": {"BACKEND": "jobqueue.tasks.ValkeyBackends"}}
    [error] = [e for e in run_checks(tags=["jobqueue"]) if e.id == "jobqueue.E004"]
    assert "ValkeyBackends" in error.msg and "jobqueue.tasks.ValkeyBackend'" in (error.hint or "")


def test_deploy_checks_say_when_valkey_is_unreachable_or_too_old(settings: Any) -> None:
    from jobqueue import conf
    from jobqueue.operations.checks import check_valkey

    assert check_valkey() == []  # the test Valkey: recent, answering
    settings.JOBQUEUE = {**settings.JOBQUEUE, "URL": "redis://127.0.0.1:1/0"}
    conf.reset()
    [error] = check_valkey()
    assert error.id == "jobqueue.E005" and "does not answer" in error.msg and error.hint
    assert "jobqueue.E005" in {e.id for e in run_checks(tags=["jobqueue"], include_deployment_checks=True)}


@pytest.mark.parametrize("raw", ["²/s", "٣x/s", "1²/m"])
def test_a_rate_with_digits_int_refuses_is_a_clear_error(raw: str) -> None:
    from jobqueue.exceptions import InvalidOption
    from jobqueue.options import rate

    with pytest.raises(InvalidOption, match="N/s"):
        rate(raw)


def test_lane_caps_and_cron_fields_typed_with_superscripts_are_clear_errors() -> None:
    from jobqueue.console import actions
    from jobqueue.cron import Cron
    from jobqueue.exceptions import InvalidOption

    with pytest.raises(InvalidOption, match="whole number"):
        actions.set_lane_concurrency(Queue("default"), "tenant", "²")
    with pytest.raises(ConfigurationError, match="not a number"):
        Cron.parse("² * * * *")
