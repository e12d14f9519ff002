"""Settings, parsed once into a frozen config, and the Valkey client they describe.

Nothing here runs at import time: the config is read on first use and again when a test
changes `JOBQUEUE` (Django's `setting_changed` signal clears the caches).
"""

from __future__ import annotations

import asyncio
import importlib.util
import math
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from functools import cache
from types import MappingProxyType
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from . import grants, sealing
from .cron import Entry
from .cron import parse as parse_schedule
from .exceptions import ConfigurationError, JobQueueError
from .keys import validate_queue
from .options import QueueOptions, did_you_mean, queue_options

EVENT_LOOPS = ("auto", "uvloop", "asyncio")


@dataclass(frozen=True)
class AutoShards:
    """`JOBQUEUE["AUTO_SHARDS"]`: when workers resize a `"shards": "auto"` queue (autoscale.py)."""

    every: float = 5.0
    """Seconds between two looks at a queue (one worker looks)."""
    grow_backlog: int = 5_000
    """Waiting jobs per live shard past which the queue grows…"""
    grow_rate: float = 5_000.0
    """…or finished jobs per second per live shard."""
    shrink_backlog: int = 100
    """Below this backlog per live shard and…"""
    shrink_rate: float = 500.0
    """…this finish rate per live shard, the queue shrinks."""
    grow_after: int = 3
    """Looks in a row past a grow threshold before the count doubles."""
    shrink_after: int = 12
    """Looks in a row below both shrink thresholds before the count halves."""


@dataclass(frozen=True)
class Config:
    """Everything jobqueue reads from `settings.JOBQUEUE`, read-only (its mappings too)."""

    url: str = field(default="embedded", repr=False)  # (its password: not in error reports)
    cache_alias: str | None = None
    defaults: QueueOptions = field(default_factory=QueueOptions)
    queues: Mapping[str, QueueOptions] = field(default_factory=lambda: MappingProxyType({}))
    retention: float = 86_400.0
    dead_retention: float = 7 * 86_400.0
    on_commit: bool = True
    max_payload: int = 1 << 20
    """Largest encoded payload (bytes) enqueue accepts: Valkey holds every waiting job in RAM."""
    schedule: Mapping[str, Entry] = field(default_factory=lambda: MappingProxyType({}))
    """Periodic jobs by name (schedule.py)."""
    metrics_token: str | None = field(default=None, repr=False)
    """When set, /metrics wants `Authorization: Bearer <token>`."""
    auto_shards: AutoShards = AutoShards()
    event_loop: str = "auto"
    """The worker's event loop for `async def` handlers: "uvloop", "asyncio", or "auto" (uvloop
    when it is installed)."""
    tracing: bool | str = True
    """OpenTelemetry spans (tracing.py): True traces when a tracer provider is configured, False
    never; a string is the dotted path of the tracer provider to use (or of a function that
    returns one) instead of the global one."""
    console: grants.Grants = field(default_factory=grants.Grants)
    """`CONSOLE`: who may view or act on which queue in the console (grants.py)."""
    encryption_keys: tuple[str, ...] = field(default=(), repr=False)
    """`ENCRYPTION_KEYS` as given (sealing.py decodes and checks them: a malformed list fails
    only what seals or opens, and `manage.py check`)."""

    def queue(self, name: str) -> QueueOptions:
        return self.queues.get(name, self.defaults)


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ConfigurationError(f"{where} must be a dict, got {value!r}")
    return value


def _queue_options(base: QueueOptions, raw: Any, where: str) -> QueueOptions:
    try:
        return queue_options(_mapping(raw, where), base)
    except JobQueueError as exc:
        raise ConfigurationError(f"{where}: {exc}") from None


def _number(raw: dict[str, Any], key: str, default: float, *, integer: bool = False,
            where: str = "JOBQUEUE") -> Any:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)) \
            or not math.isfinite(value) or value < 0:
        kind = "a whole number" if integer else "a number of seconds"
        raise ConfigurationError(f"{where}[{key!r}] must be {kind} ≥ 0, got {value!r}")
    return value


def parse(raw: Any) -> Config:
    """Validate a `JOBQUEUE` dict into a Config, naming the first wrong entry."""
    raw = dict(_mapping(raw, "JOBQUEUE"))
    defaults = _queue_options(QueueOptions(), raw.pop("DEFAULTS", {}), "JOBQUEUE['DEFAULTS']")
    queues = {}
    for name, opts in _mapping(raw.pop("QUEUES", {}), "JOBQUEUE['QUEUES']").items():
        try:
            validate_queue(name)
        except JobQueueError as exc:
            raise ConfigurationError(f"JOBQUEUE['QUEUES']: {exc}") from None
        queues[name] = _queue_options(defaults, opts, f"JOBQUEUE['QUEUES'][{name!r}]")
    known = {"URL", "CACHE_ALIAS", "RETENTION", "DEAD_RETENTION", "ON_COMMIT", "MAX_PAYLOAD",
             "SCHEDULE", "METRICS_TOKEN", "AUTO_SHARDS", "EVENT_LOOP", "TRACING", "CONSOLE",
             "ENCRYPTION_KEYS"}
    if set(raw) - known:
        unknown = set(raw) - known
        raise ConfigurationError(f"JOBQUEUE: unknown key(s) {sorted(map(str, unknown))}"
                                 f"{did_you_mean(unknown, known)}; allowed: {sorted(known)}")
    for key in ("URL", "CACHE_ALIAS", "METRICS_TOKEN"):
        if raw.get(key) is not None and not isinstance(raw[key], str):
            raise ConfigurationError(f"JOBQUEUE[{key!r}] must be a string, got {raw[key]!r}")
    if not isinstance(raw.get("ON_COMMIT", True), bool):
        raise ConfigurationError(f"JOBQUEUE['ON_COMMIT'] must be True or False, got {raw['ON_COMMIT']!r}")
    event_loop = raw.get("EVENT_LOOP", "auto")
    if event_loop not in EVENT_LOOPS:
        raise ConfigurationError(f"JOBQUEUE['EVENT_LOOP'] must be one of {EVENT_LOOPS}, got {event_loop!r}")
    if event_loop == "uvloop" and importlib.util.find_spec("uvloop") is None:
        raise ConfigurationError("JOBQUEUE['EVENT_LOOP'] is 'uvloop' but uvloop is not installed "
                                 "(pip install uvloop, or set it to 'auto' or 'asyncio')")
    return Config(
        url=raw.get("URL") or "embedded",
        cache_alias=raw.get("CACHE_ALIAS"),
        defaults=defaults,
        queues=MappingProxyType(queues),
        retention=float(_number(raw, "RETENTION", Config.retention)),
        dead_retention=float(_number(raw, "DEAD_RETENTION", Config.dead_retention)),
        on_commit=raw.get("ON_COMMIT", True),
        max_payload=_number(raw, "MAX_PAYLOAD", Config.max_payload, integer=True),
        schedule=MappingProxyType(parse_schedule(raw.get("SCHEDULE", {}))),
        metrics_token=raw.get("METRICS_TOKEN") or None,
        auto_shards=_auto_shards(raw.get("AUTO_SHARDS", {})),
        event_loop=event_loop,
        tracing=_tracing(raw.get("TRACING", True)),
        console=grants.parse(raw.get("CONSOLE", {})),
        encryption_keys=_keys(raw.get("ENCRYPTION_KEYS", ())),
    )


def _keys(value: Any) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)):
        raise ConfigurationError(f"JOBQUEUE['ENCRYPTION_KEYS'] must be a list of keys, got a "
                                 f"{type(value).__name__}")
    return tuple(value)


def _tracing(value: Any) -> bool | str:
    if isinstance(value, bool):
        return value
    if not isinstance(value, str) or "." not in value:
        raise ConfigurationError(f"JOBQUEUE['TRACING'] must be True, False or the dotted path of a "
                                 f"tracer provider, got {value!r}")
    if importlib.util.find_spec("opentelemetry") is None:
        raise ConfigurationError("JOBQUEUE['TRACING'] names a tracer provider but OpenTelemetry is "
                                 "not installed (pip install 'jobqueue[otel]')")
    return value


def _auto_shards(raw: Any) -> AutoShards:
    where = "JOBQUEUE['AUTO_SHARDS']"
    names = [f.name for f in fields(AutoShards)]
    unknown = set(_mapping(raw, where)) - set(names)
    if unknown:
        raise ConfigurationError(f"{where}: unknown key(s) {sorted(map(str, unknown))}"
                                 f"{did_you_mean(unknown, names)}; allowed: {names}")
    for name in ("grow_backlog", "shrink_backlog", "grow_after", "shrink_after"):
        _number(raw, name, 0, integer=True, where=where)
    for name in ("every", "grow_rate", "shrink_rate"):
        _number(raw, name, 0, where=where)
    limits = AutoShards(**raw)
    if limits.every <= 0 or limits.grow_after < 1 or limits.shrink_after < 1:
        raise ConfigurationError(f"{where}: every must be > 0 and grow_after, shrink_after ≥ 1")
    if limits.shrink_backlog >= limits.grow_backlog or limits.shrink_rate >= limits.grow_rate:
        raise ConfigurationError(f"{where}: the shrink thresholds must lie below the grow ones, "
                                 f"or the count would flap")
    return limits


@cache
def get_config() -> Config:
    """The process's config (defaults when Django settings are not configured)."""
    from django.conf import settings

    if not settings.configured:
        return Config()
    return parse(getattr(settings, "JOBQUEUE", {}))


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    """What makes the worker's event loop: uvloop's (a libuv loop: its socket reads and callbacks
    cost less Python than asyncio's), unless `EVENT_LOOP` says "asyncio" or uvloop is missing."""
    if get_config().event_loop != "asyncio":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.new_event_loop
    return asyncio.new_event_loop


def normalise_url(url: str) -> tuple[str, bool]:
    """Map valkey(s):// onto redis(s):// and pull out `?cluster=true`, which redis-py rejects."""
    parts = urlsplit(url)
    scheme = {"valkey": "redis", "valkeys": "rediss"}.get(parts.scheme, parts.scheme)
    if scheme not in ("redis", "rediss", "unix"):
        raise ConfigurationError(f"Valkey URL scheme {parts.scheme!r} not supported")
    query = parse_qsl(parts.query)
    cluster = any(k == "cluster" and v.lower() in ("1", "true", "yes") for k, v in query)
    rest = urlencode([(k, v) for k, v in query if k != "cluster"])
    return urlunsplit((scheme, parts.netloc, parts.path, rest, parts.fragment)), cluster


def seed_nodes(url: str) -> tuple[str, list[tuple[str, int]]]:
    """A cluster URL may name several nodes (`redis://h1:7000,h2:7001/0?cluster=true`), so a
    process can start while one of them is down: the URL with the first node only, and the
    others as (host, port)."""
    parts = urlsplit(url)
    userinfo, at, hosts = parts.netloc.rpartition("@")
    first, *others = hosts.split(",")
    nodes = []
    for node in others:
        host, _, port = node.rpartition(":")
        if not host or not port.isdecimal():
            raise ConfigurationError(f"Valkey URL: {node!r} is not host:port")
        nodes.append((host.strip("[]"), int(port)))
    return urlunsplit(parts._replace(netloc=userinfo + at + first)), nodes


CLIENT_OPTIONS: dict[str, Any] = {"decode_responses": True, "encoding_errors": "surrogateescape"}
"""Replies are text; bytes that are not UTF-8 (a corrupt row) arrive as lone surrogates instead
of raising, and `records.text` shows them and names the field."""

_clients: dict[str, Any] = {}
_clients_lock = threading.Lock()


def client_for_url(url: str) -> Any:
    """A shared client (standalone or cluster) for `url`, text-decoding, with a bounded retry."""
    client = _clients.get(url)  # (made once: every enqueue asks, and needs no lock to read)
    if client is not None:
        return client
    with _clients_lock:
        if url not in _clients:
            import redis
            from redis.cluster import ClusterNode, RedisCluster
            from redis.exceptions import RedisClusterException

            plain, cluster = normalise_url(url)
            plain, seeds = seed_nodes(plain)
            if seeds and not cluster:
                raise ConfigurationError("a Valkey URL names several nodes only with ?cluster=true")
            # A black-holed host fails in 5 s instead of hanging (a URL's own option wins).
            opts: dict[str, Any] = {**CLIENT_OPTIONS, "health_check_interval": 30,
                                    "socket_connect_timeout": 5}
            if cluster:
                others = [ClusterNode(host, port) for host, port in seeds]
                try:
                    _clients[url] = RedisCluster.from_url(plain, startup_nodes=others, **opts)
                except RedisClusterException as exc:  # no seed node answered: Valkey is down
                    raise redis.ConnectionError(str(exc)) from None
            else:
                _clients[url] = redis.Redis.from_url(plain, socket_keepalive=True,
                                                     retry=_one_retry(), **opts)
        return _clients[url]


def rediscover(client: Any) -> None:
    """Read a cluster's slot map again (a failover moved a shard); nothing for one server. A
    caller that talks to nodes directly (a pipeline, a blocking read) calls it after a
    connection error, as redis-py's own commands do."""
    from redis.cluster import RedisCluster

    if isinstance(client, RedisCluster):
        client.nodes_manager.initialize()


def _one_retry() -> Any:
    """A standalone client's retry: once, at once, on a new connection, after a connection
    error. A pooled connection the server closed while it sat idle (a restart, a kill) fails its
    next command otherwise, and redis-py gives a client made from a URL or a pool no retry. Not
    after a timeout: the server is slow or gone, and a second try would only double the wait
    (a black-holed host's 5 s). A command whose connection broke after it went out may run
    twice; every script is fenced or keyed by id for that (docs/howto/connect.md)."""
    from redis.backoff import NoBackoff
    from redis.exceptions import ConnectionError as ValkeyConnectionError
    from redis.retry import Retry

    return Retry(NoBackoff(), 1, supported_errors=(ValkeyConnectionError,))


def get_client() -> Any:
    """The Valkey client jobqueue uses, from JOBQUEUE['URL'] or a django-redis cache alias."""
    config = get_config()
    if config.cache_alias:
        return _client_from_cache(config.cache_alias)
    if config.url == "embedded":
        from . import embedded

        return client_for_url(embedded.ensure_running())
    return client_for_url(config.url)


def _client_from_cache(alias: str) -> Any:
    """Reuse the connection settings of a django-redis cache, but decode replies as text."""
    import redis
    from django_redis import get_redis_connection

    key = f"cache:{alias}"
    with _clients_lock:
        if key not in _clients:
            base = get_redis_connection(alias)
            kwargs = {"retry": _one_retry(), **base.connection_pool.connection_kwargs,
                      **CLIENT_OPTIONS}  # (the cache's own retry, when it sets one)
            pool = redis.ConnectionPool(connection_class=base.connection_pool.connection_class,
                                        **kwargs)
            _clients[key] = redis.Redis(connection_pool=pool)
        return _clients[key]


def reset() -> None:
    """Forget the parsed config and clients (settings changed, or a test switched servers)."""
    get_config.cache_clear()
    sealing.forget()
    with _clients_lock:
        for client in _clients.values():
            client.close()
        _clients.clear()
