"""The queue registry (`{emq}:queues`, read by `known_queues`): a producer lists its queue there,
and lists it again after Valkey lost its data (a flush, a restore onto a fresh server), without
a round trip of its own on a normal enqueue."""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest
from redis.cluster import RedisCluster

from jobqueue import Queue, conf
from jobqueue.engine import layouts
from jobqueue.engine.store import known_queues
from jobqueue.spec import JobSpec
from tests.servers import flush_all
from tests.workers import start_worker, wait_for


def test_a_producer_lists_its_queue_again_after_valkey_lost_its_data(valkey: Any) -> None:
    one, many = Queue("reports", client=valkey), Queue("exports", client=valkey, shards=2)
    one.enqueue("x")
    many.enqueue_many([JobSpec(i) for i in range(10)])
    assert {"reports", "exports"} <= set(known_queues(valkey))
    flush_all(valkey)
    assert not {"reports", "exports"} & set(known_queues(valkey))
    one.enqueue("y")  # the same process, the same client, the same Queue objects
    many.enqueue_many([JobSpec(i) for i in range(10)])
    assert {"reports", "exports"} <= set(known_queues(valkey))
    assert int(valkey.hget("{emq}:queues", "exports")) == 2


def test_a_handlers_enqueue_lists_its_queue_again_after_valkey_lost_its_data(settings: Any) -> None:
    from tests.jobapp import jobs

    reports = jobs.add.using(queue="reports")
    reports.enqueue(1, 2)
    assert "reports" in known_queues()
    flush_all(conf.get_client())
    reports.enqueue(3, 4)
    assert "reports" in known_queues()


def test_a_normal_enqueue_is_one_round_trip(valkey_server: Any) -> None:
    client = conf.client_for_url(valkey_server.url)
    queue = Queue("reports", client=client)
    queue.enqueue("warm")  # listed, its script loaded
    live = queue.layout()  # kept for a minute: this test counts the enqueue's own commands
    layouts._cache[client][("reports", queue.configured)] = (time.monotonic() + 60, live)
    with conf.client_for_url(valkey_server.url).monitor() as monitor:
        queue.enqueue("x")
        queue.enqueue_many([JobSpec(i) for i in range(3)])
        client.echo("counted")
        sent = []
        while (command := monitor.next_command())["command"] != "ECHO counted":
            name = command["command"].split()[0]
            # (the commands a script runs are listed too; a new connection says hello)
            if command["client_type"] != "lua" and name not in ("CLIENT", "HELLO", "PING"):
                sent.append(name)
    assert sent == ["EVALSHA", "EVALSHA"]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_worker_lists_its_queues_again_when_only_the_registrys_node_lost_its_data(
        valkey_cluster: Any, settings: Any) -> None:
    # On a cluster the registry lives on one node and a shard's 'listed' mark on another: when
    # only the registry's node loses its data, no enqueue lists the queue again (the mark says
    # it is listed). The workers serving it do, at their next maintenance turn.
    url = valkey_cluster.url
    client = RedisCluster.from_url(url.split("?")[0], decode_responses=True)
    client.flushall(target_nodes=RedisCluster.PRIMARIES)
    settings.JOBQUEUE = {"URL": url, "QUEUES": {"default": {}}}
    conf.reset()
    Queue("reports").enqueue("x", delay=3600)  # listed (a job that does not run meanwhile)
    assert client.hget("{emq}:queues", "reports") == "1"
    worker = start_worker(url, "--queues", "reports")
    try:
        wait_for(lambda: client.hlen("{emq}:workers") == 1)  # (serving: its turns have begun)
        node = client.get_node_from_key("{emq}:queues")
        client.get_redis_connection(node).flushall()
        assert client.hget("{emq}:queues", "reports") is None
        wait_for(lambda: client.hget("{emq}:queues", "reports") == "1")
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0
        client.close()
