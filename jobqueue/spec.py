"""What a job and a queue may ask for: one validator per option, shared by enqueue and by settings.

`prepare` turns a `JobSpec` into the arguments the enqueue script takes; `queue_options` turns a
queue's settings (`JOBQUEUE["QUEUES"]`, `DEFAULTS`) into `QueueOptions` with the same validators,
so a setting that `manage.py check` accepts can never make every enqueue fail.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from . import _compat, ids
from .exceptions import InvalidOption, InvalidPayload, InvalidPriority
from .keys import validate_lane

MAX_UNIQUE_KEY = 200
MAX_ATTEMPTS = 1000
MAX_SECONDS = 86_400.0
"""Longest lease and retry backoff base: one day."""
MAX_DELAY = 366 * 86_400.0

_encoder = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
_c_encoder = _compat.c_json_encoder()  # made once: see _compat.py


def dumps(value: Any, what: str) -> str:
    """Compact JSON, or InvalidPayload naming what could not be encoded (never pickle)."""
    if value is None:  # (what most handlers return)
        return "null"
    try:
        if _c_encoder is not None:
            return "".join(_c_encoder(value, 0))
        return _encoder.encode(value)
    except (TypeError, ValueError) as exc:
        raise InvalidPayload(f"{what} is not JSON-serialisable: {exc}") from None
    except RecursionError:
        raise InvalidPayload(f"{what} is not JSON-serialisable: it refers to itself, or nests "
                             f"too deep") from None


def validate_priority(priority: object) -> int:
    if isinstance(priority, bool) or not isinstance(priority, int) or not -100 <= priority <= 100:
        raise InvalidPriority(f"priority must be an integer in -100…100, got {priority!r}")
    return priority


def validate_max_attempts(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_ATTEMPTS:
        raise InvalidOption(f"max_attempts must be an integer in 1…{MAX_ATTEMPTS}, got {value!r}")
    return value


def seconds(value: object, what: str, *, low: float, high: float) -> float:
    """A number of seconds (or a timedelta) within low…high, else InvalidOption saying so."""
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidOption(f"{what} must be a number of seconds, got {value!r}")
    if not low <= value <= high:
        raise InvalidOption(f"{what} must be within {low:g}…{high:g} seconds, got {value!r}")
    return float(value)


def validate_lease(value: object) -> float:
    return seconds(value, "lease", low=0.001, high=MAX_SECONDS)


def validate_timeout(value: object) -> float:
    """A run time limit: seconds in 0.001…86,400 (a number or a timedelta)."""
    return seconds(value, "timeout", low=0.001, high=MAX_SECONDS)


def validate_backoff(value: object) -> float:
    return seconds(value, "backoff", low=0, high=MAX_SECONDS)


def whole_number(value: object, what: str, low: int, high: int | None = None) -> int:
    """An int (not a bool) within low…high (no upper bound when high is None)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (
            high is not None and value > high):
        bounds = f"an integer in {low}…{high}" if high is not None else f"a whole number ≥ {low}"
        raise InvalidOption(f"{what} must be {bounds}, got {value!r}")
    return value


MAX_WEIGHT = 100
RATE_PERIODS = {"s": 1000, "m": 60_000, "h": 3_600_000}


def rate(value: object, what: str = "rate") -> tuple[int, int] | None:
    """The `rate` option (and `lane_rate`), "N/s", "N/m" or "N/h" (N 1…1,000,000), as (N,
    period in ms)."""
    if value is None:
        return None
    if isinstance(value, str) and value.count("/") == 1:
        count, unit = value.split("/")
        if count.isdecimal() and unit in RATE_PERIODS and 1 <= int(count) <= 1_000_000:
            return int(count), RATE_PERIODS[unit]
    raise InvalidOption(f'{what} must be "N/s", "N/m" or "N/h" with N in 1…1000000, got {value!r}')


MAX_LANE_CAP = 1_000_000
EVERY_LANE = "*"
"""In `lane_concurrency`: the cap of every named lane the dict does not name."""


def lane_cap(value: object, what: str = "lane_concurrency") -> int:
    """One lane's cap: at most this many of its jobs active at once (1…1,000,000)."""
    return whole_number(value, what, 1, MAX_LANE_CAP)


def global_cap(value: object, what: str = "global_concurrency") -> int:
    """A queue's global cap: at most this many of its jobs active at once (1…1,000,000)."""
    return whole_number(value, what, 1, MAX_LANE_CAP)


def lane_concurrency(value: object) -> tuple[tuple[str, int], ...]:
    """The `lane_concurrency` option: an int (every named lane's cap) or a dict of lane name
    ('' is the default lane, "*" every named lane it does not name) to a cap, kept as sorted
    pairs (an int n is (("*", n),))."""
    if isinstance(value, int) and not isinstance(value, bool):
        return ((EVERY_LANE, lane_cap(value)),)
    if not isinstance(value, dict) or not value or len(value) > 1000:
        raise InvalidOption(f"lane_concurrency must be an integer or a dict of at most 1000 "
                            f"lanes (\"*\": every other lane) to caps, got {value!r}")
    return tuple(sorted((lane if lane in ("", EVERY_LANE) else validate_lane(lane),
                         lane_cap(cap, f"lane_concurrency[{lane!r}]"))
                        for lane, cap in value.items()))


def lane_weights(value: object) -> tuple[tuple[str, int], ...]:
    """The `lane_weights` option: a dict of lane name ('' is the default lane) to a weight
    1…100, kept as sorted pairs."""
    if not isinstance(value, dict) or len(value) > 1000:
        raise InvalidOption(f"lane_weights must be a dict of at most 1000 lanes to weights, "
                            f"got {value!r}")
    return tuple(sorted((lane if lane == "" else validate_lane(lane),
                         whole_number(weight, f"lane_weights[{lane!r}]", 1, MAX_WEIGHT))
                        for lane, weight in value.items()))


QUEUE_OPTION_NAMES = ("shards", "max_shards", "max_attempts", "lease", "concurrency", "backoff",
                      "priority", "durable", "lane_weights", "rate", "wait_replicas",
                      "lane_concurrency", "lane_rate", "timeout", "global_concurrency",
                      "encrypt", "hidden_args")


@dataclass(frozen=True)
class QueueOptions:
    """Per-queue defaults; a job's own options win over these. Made by `queue_options`, which
    validates each field; frozen and hashable (a claim's policy is cached by them)."""

    shards: int = 1
    """Shards until the queue's first resize (`"auto"` in settings: 1, then `auto_shards`)."""
    auto_shards: bool = False
    """`"shards": "auto"`: workers resize the queue as its load changes (autoscale.py)."""
    max_shards: int = 16
    """The most shards an automatic queue grows to."""
    max_attempts: int = 3
    lease: float = 30.0
    concurrency: int | None = None
    backoff: float = 1.0
    priority: int = 0
    durable: bool = False
    """Write each job to the database (in the caller's transaction) before Valkey: outbox.py."""
    rate: str | None = None
    """"N/s", "N/m" or "N/h": at most N of the queue's jobs start per period (see `rate`)."""
    wait_replicas: int = 0
    """Enqueue returns once this many replicas of the shard's primary hold the jobs (`WAIT`);
    0: as soon as the primary does (asynchronous replication)."""
    lane_weights: tuple[tuple[str, int], ...] = ()
    """(lane, w): the lane gets w turns per round of the ring; unnamed lanes weigh 1. Settings
    give a dict; it is kept as sorted pairs so the options stay hashable."""
    lane_concurrency: tuple[tuple[str, int], ...] = ()
    """(lane, n): at most n jobs of the lane active at once, across every worker ("*": every
    named lane not listed). Settings give an int or a dict (`lane_concurrency`); a cap set
    live (`Queue.set_lane_concurrency`) wins over these."""
    lane_rate: str | None = None
    """"N/s", "N/m" or "N/h": at most N jobs of each named lane start per period."""
    timeout: float | None = None
    """Seconds one run of a job may take (the job's own `timeout` wins): past it the run is
    stopped and fails with `JobTimeout`. Written on each job as it is enqueued."""
    global_concurrency: int | None = None
    """At most n of the queue's jobs active at once, across every worker and shard (permits of
    one cap: engine/permits.py); a cap set live (`Queue.set_global_concurrency`) wins."""
    encrypt: bool = False
    """Seal its jobs' args, kwargs, results, checkpoints, progress and errors (sealing.py)."""
    hidden_args: tuple[str | int, ...] = ()
    """Argument keys the console shows as `•••` to a user without `jobqueue.view_hidden_args`:
    a name hides that key wherever it stands in the job's kwargs (or a dict among its args), a
    whole number hides that position of its args (`hidden_args`)."""

    @property
    def claim_only(self) -> bool:
        """Whether only the claim script can enforce this queue's limits (a `concurrency` cap,
        a rate, lane caps or lane rates): then its idle workers take no hand-offs."""
        return bool(self.concurrency or self.rate or self.lane_concurrency or self.lane_rate
                    or self.global_concurrency)


@functools.cache
def claim_policy(options: QueueOptions, shards: int) -> tuple[Any, ...]:
    """The claim script's arguments for a queue's limits (claim.lua, ARGV[7] on): the rate limit
    (each shard's share of N, the period), the lane rate (N, the period: a lane lives on one
    shard), lane caps and lane weights (how many, then lane and value for each). Cached: a
    Queue is made per enqueue, and a worker claims many times a second."""
    weighted = [(lane, w) for lane, w in options.lane_weights if w > 1]
    limit, lane_limit = rate(options.rate), rate(options.lane_rate, "lane_rate")
    return (*((limit[0] / shards, limit[1]) if limit else (0, 0)), *(lane_limit or (0, 0)),
            len(options.lane_concurrency), *(x for pair in options.lane_concurrency for x in pair),
            len(weighted), *(x for pair in weighted for x in pair))


MAX_HIDDEN_ARGS = 100


def hidden_args(value: object) -> tuple[str | int, ...]:
    """The `hidden_args` option: a list of argument names (non-empty strings) and positions
    (whole numbers ≥ 0), kept as a tuple (names and positions as given, duplicates dropped)."""
    if isinstance(value, (list, tuple)) and len(value) <= MAX_HIDDEN_ARGS and all(
            (isinstance(item, str) and item and len(item) <= 200)
            or (isinstance(item, int) and not isinstance(item, bool) and item >= 0)
            for item in value):
        return tuple(dict.fromkeys(value))
    raise InvalidOption(f"hidden_args must be a list of at most {MAX_HIDDEN_ARGS} argument names "
                        f"(non-empty strings) and positions (whole numbers ≥ 0), got {value!r}")


def did_you_mean(unknown: Iterable[object], known: Iterable[str]) -> str:
    """" (did you mean 'X'?)" for the first unknown name close to a known one, else ""."""
    import difflib

    for name in sorted(map(str, unknown)):
        close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
        if not close:
            close = [k for k in known if k.lower() == name.lower()]
        if close:
            return f" (did you mean {close[0]!r}?)"
    return ""


def queue_options(raw: Mapping[str, Any], base: QueueOptions = QueueOptions()) -> QueueOptions:
    """`base` with a queue's settings (`QUEUE_OPTION_NAMES`) laid over it, each checked by the
    validator a job's own option goes through and kept in the form enqueue and claim use
    (seconds as floats, lane weights as sorted pairs): InvalidOption names the first wrong one."""
    unknown = set(raw) - set(QUEUE_OPTION_NAMES)
    if unknown:
        raise InvalidOption(f"unknown option(s) {sorted(map(str, unknown))}"
                            f"{did_you_mean(unknown, QUEUE_OPTION_NAMES)}; "
                            f"allowed: {list(QUEUE_OPTION_NAMES)}")
    values = dict(raw)
    if values.get("shards") == "auto":
        values.update(shards=1, auto_shards=True)
    elif "shards" in values:
        values["auto_shards"] = False
    if "lane_weights" in values:
        values["lane_weights"] = lane_weights(values["lane_weights"])
    if "hidden_args" in values:
        values["hidden_args"] = hidden_args(values["hidden_args"])
    if "lane_concurrency" in values:  # (None: no caps, overriding DEFAULTS' own)
        raw_caps = values["lane_concurrency"]
        values["lane_concurrency"] = () if raw_caps is None else lane_concurrency(raw_caps)
    options = replace(base, **values)
    for flag in ("durable", "encrypt"):
        if not isinstance(getattr(options, flag), bool):
            raise InvalidOption(f"{flag} must be True or False, got {getattr(options, flag)!r}")
    rate(options.rate)
    rate(options.lane_rate, "lane_rate")
    concurrency, global_concurrency = options.concurrency, options.global_concurrency
    return replace(
        options,
        shards=whole_number(options.shards, 'shards (or "auto")', 1, 1024),
        max_shards=whole_number(options.max_shards, "max_shards", 1, 1024),
        wait_replicas=whole_number(options.wait_replicas, "wait_replicas", 0, 10),
        max_attempts=validate_max_attempts(options.max_attempts),
        lease=validate_lease(options.lease),
        concurrency=None if concurrency is None else whole_number(concurrency, "concurrency", 1,
                                                                  10_000),
        global_concurrency=None if global_concurrency is None else global_cap(global_concurrency),
        backoff=validate_backoff(options.backoff),
        priority=validate_priority(options.priority),
        timeout=None if options.timeout is None else validate_timeout(options.timeout),
    )


class JobSpec(NamedTuple):
    """One job to enqueue, before validation. `payload` is any JSON value. (A named tuple, not
    a dataclass: a bulk enqueue builds one per job.)"""

    payload: Any
    job_id: str | None = None
    lane: str | None = None
    priority: int | None = None
    delay: float | timedelta | None = None
    run_after: datetime | None = None
    max_attempts: int | None = None
    backoff: float | None = None
    lease: float | None = None
    unique_key: str | None = None
    debounce: float | timedelta | None = None
    """Seconds: while the unique key's job has not started, an enqueue replaces its payload and
    expiry and moves its start to now + debounce (the same id comes back); the first one starts
    then too."""
    expires: float | timedelta | datetime | None = None
    """Seconds from now (or an aware datetime): a job not started by then ends `expired`."""
    timeout: float | timedelta | None = None
    """Seconds one run may take (None: the queue's, else no limit)."""
    encrypt: bool | None = None
    """Seal the job's data (sealing.py) though its queue does not (None, False: as the queue)."""


class Prepared(NamedTuple):
    """A validated JobSpec, as the enqueue script takes it (`engine.scripts.calls.encoded`; a
    tuple: built per job)."""

    job_id: str
    minted: bool
    payload: str
    priority: int
    lane: str
    max_attempts: int
    backoff_ms: int
    lease_ms: int
    delay_ms: int
    unique_key: str
    debounce_ms: int = 0
    expires_ms: int = 0
    """Until the job expires, from the enqueue (0: never); the script adds its own clock."""
    spent: int = 0
    """Tokens its earlier runs may have used (a durable row restored after Valkey lost its data,
    a job an operator retries from its mirror row): its `attempts` start there, so that no token
    repeats; 0 for a new job."""
    timeout_ms: int = 0
    """The run time limit (0: none), written with the lease (`calls.lease_field`)."""

    def minted_again(self, job_id: str) -> Prepared:
        """This job under a new id (its minted one was taken): its sealed args, if any, sealed
        for that id (sealing.py binds them to the job's id)."""
        from . import sealing

        return self._replace(job_id=job_id,
                             payload=sealing.rebound(self.payload, self.job_id, job_id))


def _delay(spec: JobSpec) -> float:
    """Seconds until the job may run, from `delay`, `run_after` or `debounce` (one of them)."""
    if spec.delay is not None and spec.run_after is not None:
        raise InvalidOption("give delay or run_after, not both")
    if spec.debounce is not None:
        if spec.delay is not None or spec.run_after is not None:
            raise InvalidOption("give debounce or delay/run_after, not both: a debounced job "
                                "starts `debounce` seconds after its last enqueue")
        if spec.unique_key is None:
            raise InvalidOption("debounce needs a unique_key: the key names the job that later "
                                "enqueues replace")
        return seconds(spec.debounce, "debounce", low=0.001, high=MAX_DELAY)
    if spec.delay is not None:
        return seconds(spec.delay, "delay", low=0, high=MAX_DELAY)
    if spec.run_after is not None:
        if not isinstance(spec.run_after, datetime) or spec.run_after.tzinfo is None:
            raise InvalidOption(f"run_after must be a timezone-aware datetime, got {spec.run_after!r}")
        return max(0.0, (spec.run_after - datetime.now(UTC)).total_seconds())
    return 0.0


def _options(options: QueueOptions, priority: Any, lane: Any, max_attempts: Any, backoff: Any,
             lease: Any, timeout: Any = None) -> tuple[int, str, int, int, int, int]:
    """The validated options a job shares with most jobs of its batch: (priority, lane,
    max_attempts, backoff ms, lease ms, timeout ms). lease 0 = the worker's default; timeout
    0 = no limit."""
    if timeout is None:
        timeout = options.timeout
    return (
        validate_priority(options.priority if priority is None else priority),
        "" if lane is None else validate_lane(lane),
        validate_max_attempts(options.max_attempts if max_attempts is None else max_attempts),
        round(validate_backoff(options.backoff if backoff is None else backoff) * 1000),
        0 if lease is None else round(validate_lease(lease) * 1000),
        0 if timeout is None else max(1, round(validate_timeout(timeout) * 1000)),
    )


def _expires_ms(value: object) -> int:
    """Milliseconds from now until the job expires (0: it never does), from seconds, a
    timedelta or an aware datetime that is still ahead."""
    if value is None:
        return 0
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise InvalidOption(f"expires must be a number of seconds or a timezone-aware "
                                f"datetime, got the naive {value!r}")
        left = (value - datetime.now(UTC)).total_seconds()
        if left <= 0:
            raise InvalidOption(f"expires is in the past ({value.isoformat()}): the job could "
                                f"never run")
        value = left
    return max(1, math.ceil(seconds(value, "expires", low=0.001, high=MAX_DELAY) * 1000))


# typed: True and 1 are different keys, so a bool priority is still refused.
_cached_options = functools.lru_cache(maxsize=1024, typed=True)(_options)


def _unique_key(value: object) -> str:
    if value is None:
        return ""
    if not isinstance(value, str) or not 0 < len(value) <= MAX_UNIQUE_KEY or not value.isprintable():
        raise InvalidOption(f"unique_key must be 1…{MAX_UNIQUE_KEY} printable characters, got {value!r}")
    return value


def prepare(spec: JobSpec, options: QueueOptions, max_payload: int = 1 << 20) -> Prepared:
    """Validate every field of a spec, with errors that say what is allowed."""
    if spec.debounce is not None and options.durable:
        # A debounced enqueue replaces a waiting job's payload in Valkey, where the durable
        # row (written first, with the first payload) would not follow it.
        raise InvalidOption("debounce cannot be used on a durable queue: its database row "
                            "would keep the first enqueue's arguments (use a plain queue)")
    delay = _delay(spec)
    shared = (options, spec.priority, spec.lane, spec.max_attempts, spec.backoff, spec.lease,
              spec.timeout)
    try:
        priority, lane, max_attempts, backoff_ms, lease_ms, timeout_ms = _cached_options(*shared)
    except TypeError:  # an unhashable option: validate it uncached, which says what is wrong
        priority, lane, max_attempts, backoff_ms, lease_ms, timeout_ms = _options(*shared)
    unique = _unique_key(spec.unique_key)
    job_id = ids.validate_job_id(spec.job_id) if spec.job_id is not None else ids.new_id()
    delay_ms, expires_ms = math.ceil(delay * 1000), _expires_ms(spec.expires)
    if expires_ms and expires_ms <= delay_ms:
        raise InvalidOption(f"expires ({expires_ms / 1000:g} s from now) comes before the job's "
                            f"start ({delay_ms / 1000:g} s from now): it could never run")
    if options.encrypt or spec.encrypt:
        payload = sealed(spec, job_id, max_payload)
    else:
        payload = encode_payload(spec.payload, max_payload)
    return Prepared(job_id, spec.job_id is None, payload,
                    priority, lane, max_attempts, backoff_ms, lease_ms, delay_ms, unique,
                    delay_ms if spec.debounce is not None else 0, expires_ms,
                    timeout_ms=timeout_ms)


def sealed(spec: JobSpec, job_id: str, max_payload: int) -> str:
    """A sealed job's payload (sealing.py), checked as `encode_payload` checks a plain one; not
    debounced (the job it would replace has another id, which its args would not open under)."""
    from . import sealing

    payload = spec.payload
    if spec.debounce is not None or not isinstance(payload, dict):
        raise InvalidOption("a sealed job (encrypt=True) cannot be debounced, and its payload "
                            "must be a dict (handler, args, kwargs): nothing was stored")
    if sealing.SEALED in payload:  # (sealed already: a durable row sent again)
        return encode_payload(payload, max_payload)
    secret = encode_payload({k: payload[k] for k in ("args", "kwargs") if k in payload},
                            max_payload)
    return sealing.seal_payload(payload, secret, job_id)


def encode_payload(payload: Any, max_payload: int) -> str:
    """A payload as compact JSON, refused when it is longer than `max_payload` characters."""
    encoded = dumps(payload, "payload")
    if len(encoded) > max_payload:
        raise InvalidPayload(f"payload is {len(encoded):,} characters of JSON; the limit is "
                             f"{max_payload:,} (JOBQUEUE['MAX_PAYLOAD']): pass a reference instead")
    return encoded
