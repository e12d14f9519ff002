"""The no-op job of every peer in bench/peers.py: each run INCRs one counter in Valkey, so the
harness sees completions the same way for all of them. BENCH_URL names the shared Valkey."""

from __future__ import annotations

import os
from functools import cache

import redis

URL = os.environ.get("BENCH_URL", "redis://127.0.0.1:6399/0")


@cache
def counter() -> redis.Redis:
    return redis.Redis.from_url(URL)


def tick() -> None:
    counter().incr("bench:done")


def celery_app():  # type: ignore[no-untyped-def]
    from celery import Celery

    app = Celery("peer", broker=URL)
    app.conf.update(task_ignore_result=True, worker_prefetch_multiplier=16,
                    broker_connection_retry_on_startup=True)
    app.task(name="tick")(tick)
    return app


def dramatiq_actor():  # type: ignore[no-untyped-def]
    import dramatiq
    from dramatiq.brokers.redis import RedisBroker

    dramatiq.set_broker(RedisBroker(url=URL))
    return dramatiq.actor(tick, actor_name="tick")


def huey_app():  # type: ignore[no-untyped-def]
    from huey import RedisHuey

    huey = RedisHuey("peer", url=URL)
    return huey, huey.task()(tick)


if os.environ.get("PEER") == "celery":
    app = celery_app()
elif os.environ.get("PEER") == "dramatiq":
    actor = dramatiq_actor()
elif os.environ.get("PEER") == "huey":
    huey, huey_tick = huey_app()


def flow_member(i: int) -> float:
    """A chord's member (bench/flows.py): its result is when it finished (the epoch)."""
    import time

    return time.time()


def flow_callback(finished: list[float]) -> dict[str, float]:
    """A chord's callback (bench/flows.py): how long after the last member it started."""
    import time

    started = time.time()
    return {"started": started, "gap_ms": (started - max(finished)) * 1000}


def celery_flow_app(url: str = URL):  # type: ignore[no-untyped-def]
    """Celery with Valkey as broker and result backend (a chord needs one)."""
    from celery import Celery

    app = Celery("peer_flows", broker=url, backend=url)
    app.conf.update(worker_prefetch_multiplier=16, broker_connection_retry_on_startup=True)
    app.task(name="flow_member")(flow_member)
    app.task(name="flow_callback")(flow_callback)
    return app


if os.environ.get("PEER") == "celery-flows":
    app = celery_flow_app()
