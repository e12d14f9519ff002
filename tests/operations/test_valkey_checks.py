"""`manage.py check --deploy` asks Valkey whether it keeps what it holds: a maxmemory-policy that
evicts keys, and AOF off while a queue is not durable, are warnings (real servers each way)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.core.checks import run_checks

from tests.servers import ValkeyProcess
from tests.workers import manage

PLAIN_AND_DURABLE = {"default": {}, "orders": {"durable": True}}


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[ValkeyProcess]:
    policy, aof = request.param
    process = ValkeyProcess("--maxmemory", "64mb", "--maxmemory-policy", policy,
                            appendonly=aof).start()
    yield process
    process.cleanup()


def warnings_for(settings: Any, server: ValkeyProcess, queues: dict[str, Any]) -> dict[str, str]:
    settings.JOBQUEUE = {"URL": server.url, "QUEUES": queues}
    return {m.id: m.msg for m in run_checks(include_deployment_checks=True, tags=["jobqueue"])
            if m.id in ("jobqueue.W010", "jobqueue.W011")}


@pytest.mark.parametrize("server", [("allkeys-lru", False)], indirect=True)
def test_an_evicting_server_without_aof_gets_both_warnings(settings: Any, server: ValkeyProcess) -> None:
    found = warnings_for(settings, server, PLAIN_AND_DURABLE)
    assert set(found) == {"jobqueue.W010", "jobqueue.W011"}
    assert "allkeys-lru" in found["jobqueue.W010"]
    assert "default" in found["jobqueue.W011"] and "orders" not in found["jobqueue.W011"]


@pytest.mark.parametrize("server", [("volatile-lru", True)], indirect=True)
def test_any_policy_but_noeviction_is_a_warning(settings: Any, server: ValkeyProcess) -> None:
    assert set(warnings_for(settings, server, PLAIN_AND_DURABLE)) == {"jobqueue.W010"}


@pytest.mark.parametrize("server", [("noeviction", True)], indirect=True)
def test_noeviction_with_aof_is_fit_for_a_queue(settings: Any, server: ValkeyProcess) -> None:
    assert warnings_for(settings, server, PLAIN_AND_DURABLE) == {}


@pytest.mark.parametrize("server", [("noeviction", False)], indirect=True)
def test_aof_off_is_fine_when_every_queue_is_durable(settings: Any, server: ValkeyProcess) -> None:
    assert warnings_for(settings, server, {"orders": {"durable": True}}) == {}
    assert set(warnings_for(settings, server, PLAIN_AND_DURABLE)) == {"jobqueue.W011"}


@pytest.mark.parametrize("server", [("allkeys-random", False)], indirect=True)
def test_manage_py_check_deploy_prints_the_warnings_with_their_hints(server: ValkeyProcess) -> None:
    done = manage("check", "--deploy", "--tag", "jobqueue", url=server.url)
    assert done.returncode == 0, done.stderr
    out = done.stdout + done.stderr
    assert "jobqueue.W010" in out and "noeviction" in out and "jobqueue.W011" in out
    assert "appendonly yes" in out
