"""The encryption tests' keys, queues and helpers: what Valkey and the database hold, dumped."""

from __future__ import annotations

import base64
import json
import os
from typing import Any

import pytest

from jobqueue import Queue, sealing
from jobqueue.models import Job

OLD, NEW = (base64.urlsafe_b64encode(os.urandom(32)).decode() for _ in range(2))
QUEUES = {"default": {}, "vault": {"encrypt": True}, "vaultd": {"encrypt": True, "durable": True}}
SECRET = "Ada-Lovelace-4111111111111111"
"""A distinctive argument: no byte of it may be stored."""


def kid(key: str) -> str:
    return sealing.key_id(base64.urlsafe_b64decode(key))


def sealed_settings(settings: Any, url: str, keys: list[str]) -> dict[str, str]:
    """Point jobqueue at `url` with the sealed queues and `keys`; the env a worker needs for
    the same."""
    settings.JOBQUEUE = {"URL": url, "QUEUES": QUEUES, "ENCRYPTION_KEYS": keys}
    return worker_env(keys)


def worker_env(keys: list[str]) -> dict[str, str]:
    return {"JOBQUEUE_TEST_QUEUES": json.dumps(QUEUES), "JOBQUEUE_TEST_KEYS": json.dumps(keys)}


def valkey_dump(client: Any) -> str:
    """Every key of every type and every value, as one text (SCAN: every node of a cluster)."""
    out = []
    for key in client.scan_iter(count=1000):
        kind = client.type(key)
        value: Any = {
            "string": lambda k: client.get(k),
            "hash": lambda k: client.hgetall(k),
            "list": lambda k: client.lrange(k, 0, -1),
            "set": lambda k: client.smembers(k),
            "zset": lambda k: client.zrange(k, 0, -1, withscores=True),
            "stream": lambda k: client.xrange(k),
        }.get(kind, lambda k: "")(key)
        out.append(f"{key} {kind} {value!r}")
    return "\n".join(out)


def database_dump() -> str:
    return "\n".join(repr(row) for row in Job.objects.values())


@pytest.fixture(params=["standalone", "cluster"])
def where(request: pytest.FixtureRequest) -> str:
    """A Valkey URL, standalone or a cluster (flushed)."""
    url = request.getfixturevalue("valkey_server").url
    if request.param == "cluster":
        url = request.getfixturevalue("valkey_cluster").url
        from redis.cluster import RedisCluster

        client = RedisCluster.from_url(url.split("?")[0])
        client.flushall(target_nodes=RedisCluster.PRIMARIES)
        client.close()
    return url


def client() -> Any:
    return Queue("default").client
