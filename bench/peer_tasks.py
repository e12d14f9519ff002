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
