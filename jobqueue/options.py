"""What a job and a queue may ask for: one validator per option, shared by enqueue and by settings.

Owns the bounds of each option and its validator (`validate_priority`, `seconds`, `rate`,
`lane_concurrency`, `hidden_args`, ...), `QueueOptions` with `queue_options`, which turns a
queue's settings (`JOBQUEUE["QUEUES"]`, `DEFAULTS`) into them through the very validators a
job's own options go through (so a setting that `manage.py check` accepts can never make every
enqueue fail), and `claim_policy`, the claim script's arguments for a queue's limits. A job's
spec and its encoding are spec.py's. A leaf: imports only other leaves (`exceptions`, `keys`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from .exceptions import InvalidOption, InvalidPriority
from .keys import validate_lane

MAX_ATTEMPTS = 1000
MAX_SECONDS = 86_400.0
"""Longest lease and retry backoff base: one day."""
MAX_DELAY = 366 * 86_400.0
"""Longest delay, debounce, expiry or retry_in: a year and a day."""


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
