"""A job to enqueue (`JobSpec`) and what enqueue sends for it (`Prepared`): `prepare` validates
every field of a spec with options.py's validators, the queue's `QueueOptions` filling what the
job leaves out, and encodes its payload as compact JSON (`dumps`, `encode_payload`) or seals it
(`sealed`, through sealing.py) into the arguments the enqueue script takes. What a queue's
options may be is options.py's. A leaf: imports only other leaves (`_compat`, `ids`,
`exceptions`, `keys`, `options`; `sealing` lazily).
"""

from __future__ import annotations

import functools
import json
import math
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from . import _compat, ids
from .exceptions import InvalidOption, InvalidPayload
from .keys import validate_lane
from .options import (
    MAX_DELAY,
    QueueOptions,
    seconds,
    validate_backoff,
    validate_lease,
    validate_max_attempts,
    validate_priority,
    validate_timeout,
)

MAX_UNIQUE_KEY = 200

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
