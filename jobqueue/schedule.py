"""Periodic jobs: `JOBQUEUE["SCHEDULE"]` entries that any running worker fires, each tick once.

An entry has `job` (a dotted path to an `@job` handler), `cron` (five fields: minute hour
day-of-month month day-of-week, in UTC or the entry's `timezone`) or `every` (seconds, ticks
aligned on the epoch), and optional `args`, `kwargs`, `queue`, `lane`, `priority`.

Firing, in every worker's maintenance (never in `--burst` runs): an entry's latest tick not yet
fired is enqueued with the unique key `schedule:<name>:<tick ms>` (two workers racing for the
same tick get the same job), then recorded as the entry's last tick in the `emq:schedules` hash.
Only the latest tick counts, so ticks missed while no worker ran fire once, not once each. An
entry seen for the first time starts from its latest tick without firing it: deploying a
nightly job at noon does not run it at once.
"""

from __future__ import annotations

import calendar
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from .exceptions import ConfigurationError, JobQueueError

log = logging.getLogger("jobqueue.schedule")
STATE_KEY = "emq:schedules"
"""HASH: <name> -> JSON {"last": tick ms, "job": id of the last job fired}; paused:<name> -> 1."""
ENTRY_KEYS = ("job", "cron", "every", "timezone", "args", "kwargs", "queue", "lane", "priority")
_FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day of month", 1, 31), ("month", 1, 12),
           ("day of week", 0, 7))
_NAMES = {3: {m.lower(): i for i, m in enumerate(calendar.month_abbr) if m},
          4: {d.lower(): (i + 1) % 7 for i, d in enumerate(calendar.day_abbr)}}


@dataclass(frozen=True)
class Cron:
    """A five-field crontab expression; day of month and day of week match either, as cron's."""

    text: str
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday
    any_day: bool
    any_weekday: bool

    @classmethod
    def parse(cls, text: str) -> Cron:
        parts = text.split() if isinstance(text, str) else []
        if len(parts) != 5:
            raise ConfigurationError(f"cron {text!r} must have five fields: minute hour "
                                     "day-of-month month day-of-week")
        sets = [_field(part, i) for i, part in enumerate(parts)]
        weekdays = frozenset(d % 7 for d in sets[4])
        return cls(text, sets[0], sets[1], sets[2], sets[3], weekdays, parts[2] == "*",
                   parts[4] == "*")

    def _day_matches(self, day: datetime) -> bool:
        if day.month not in self.months:
            return False
        in_month, in_week = day.day in self.days, (day.weekday() + 1) % 7 in self.weekdays
        if self.any_day or self.any_weekday:
            return in_month and in_week
        return in_month or in_week

    def latest(self, now: datetime) -> datetime | None:
        """The last matching minute at or before `now` (a local, naive time), within ~5 years."""
        day = now.replace(hour=0, minute=0, second=0, microsecond=0)
        for back in range(366 * 5):
            if self._day_matches(day):
                limit = (now.hour, now.minute) if back == 0 else (23, 59)
                times = [(h, m) for h in self.hours for m in self.minutes if (h, m) <= limit]
                if times:
                    hour, minute = max(times)
                    return day.replace(hour=hour, minute=minute)
            day -= timedelta(days=1)
        return None

    def next(self, now: datetime) -> datetime | None:
        """The first matching minute after `now` (a local, naive time), within ~5 years."""
        day = now.replace(hour=0, minute=0, second=0, microsecond=0)
        for ahead in range(366 * 5):
            if self._day_matches(day):
                after = (now.hour, now.minute) if ahead == 0 else (-1, -1)
                times = [(h, m) for h in self.hours for m in self.minutes if (h, m) > after]
                if times:
                    hour, minute = min(times)
                    return day.replace(hour=hour, minute=minute)
            day += timedelta(days=1)
        return None


def _field(part: str, index: int) -> frozenset[int]:
    name, low, high = _FIELDS[index]
    values: set[int] = set()
    for item in part.split(","):
        body, _, step_text = item.partition("/")
        step = int(step_text) if step_text.isdigit() and int(step_text) > 0 else None
        if step_text and step is None:
            raise ConfigurationError(f"cron {name} {part!r}: the step must be a positive number")
        if body == "*":
            start, end = low, high
        else:
            first, _, last = body.partition("-")
            start = _value(first, index)
            end = _value(last, index) if last else (high if step else start)
        if not low <= start <= end <= high:
            raise ConfigurationError(f"cron {name} {part!r}: values must be within {low}…{high}")
        values.update(range(start, end + 1, step or 1))
    return frozenset(values)


def _value(text: str, index: int) -> int:
    if text.isdigit():
        return int(text)
    if text.lower() in _NAMES.get(index, {}):
        return _NAMES[index][text.lower()]
    raise ConfigurationError(f"cron {_FIELDS[index][0]}: {text!r} is not a number"
                             + (" or a name" if index in _NAMES else ""))


@dataclass(frozen=True)
class Entry:
    """One periodic job."""

    name: str
    job: str
    cron: Cron | None = None
    every: float | None = None
    timezone: str = "UTC"
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    queue: str | None = None
    lane: str | None = None
    priority: int | None = None

    @property
    def expression(self) -> str:
        return self.cron.text if self.cron else f"every {self.every:g} s"

    def latest_tick(self, now: datetime) -> datetime | None:
        """The entry's last tick at or before `now` (aware, UTC)."""
        if self.every is not None:
            step = self.every
            return datetime.fromtimestamp(now.timestamp() // step * step, UTC)
        assert self.cron is not None
        zone = ZoneInfo(self.timezone)
        local = self.cron.latest(now.astimezone(zone).replace(tzinfo=None))
        return None if local is None else local.replace(tzinfo=zone).astimezone(UTC)

    def next_tick(self, now: datetime) -> datetime | None:
        if self.every is not None:
            step = self.every
            return datetime.fromtimestamp((now.timestamp() // step + 1) * step, UTC)
        assert self.cron is not None
        zone = ZoneInfo(self.timezone)
        local = self.cron.next(now.astimezone(zone).replace(tzinfo=None))
        return None if local is None else local.replace(tzinfo=zone).astimezone(UTC)


def parse(raw: Any) -> dict[str, Entry]:
    """Validate `JOBQUEUE["SCHEDULE"]`, naming the entry and what is wrong with it."""
    from .keys import validate_lane, validate_queue
    from .spec import validate_priority

    if not isinstance(raw, dict):
        raise ConfigurationError(f"JOBQUEUE['SCHEDULE'] must be a dict of names to entries, got {raw!r}")
    entries = {}
    for name, spec in raw.items():
        where = f"JOBQUEUE['SCHEDULE'][{name!r}]"
        try:
            if (not isinstance(name, str) or not name or len(name) > 100
                    or not name.isprintable() or name.startswith("paused:")):
                raise ConfigurationError("the name must be 1…100 printable characters, not "
                                         "starting with 'paused:'")
            if not isinstance(spec, dict):
                raise ConfigurationError(f"must be a dict, got {spec!r}")
            unknown = sorted(set(map(str, spec)) - set(ENTRY_KEYS))
            if unknown:
                raise ConfigurationError(f"unknown key(s) {unknown}; allowed: {list(ENTRY_KEYS)}")
            job = spec.get("job")
            if not isinstance(job, str) or "." not in job:
                raise ConfigurationError(f"'job' must be the dotted path of a @job, got {job!r}")
            if ("cron" in spec) == ("every" in spec):
                raise ConfigurationError("give exactly one of 'cron' and 'every'")
            every = spec.get("every")
            if every is not None and (isinstance(every, bool) or not isinstance(every, (int, float))
                                      or not 1 <= every <= 366 * 86_400):
                raise ConfigurationError(f"'every' must be seconds within 1…31622400, got {every!r}")
            zone = spec.get("timezone", "UTC")
            try:
                ZoneInfo(zone)
            except (ZoneInfoNotFoundError, ValueError, TypeError):
                raise ConfigurationError(f"unknown timezone {zone!r}") from None
            args, kwargs = spec.get("args", []), spec.get("kwargs", {})
            if not isinstance(args, (list, tuple)) or not isinstance(kwargs, dict):
                raise ConfigurationError("'args' must be a list and 'kwargs' a dict")
            json.dumps([args, kwargs])
            entries[name] = Entry(
                name, job, Cron.parse(spec["cron"]) if "cron" in spec else None,
                None if every is None else float(every), zone, tuple(args), dict(kwargs),
                None if spec.get("queue") is None else validate_queue(spec["queue"]),
                None if spec.get("lane") is None else validate_lane(spec["lane"]),
                None if spec.get("priority") is None else validate_priority(spec["priority"]),
            )
        except (TypeError, ValueError, JobQueueError) as exc:  # args not JSON, a bad queue name…
            raise ConfigurationError(f"{where}: {exc}") from None
    return entries


# -- firing ----------------------------------------------------------------------------------


def state(client: Any) -> dict[str, Any]:
    """Per entry: {"last": tick ms, "job": last job id, "paused": bool}."""
    raw = client.hgetall(STATE_KEY)
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key.startswith("paused:"):
            out.setdefault(key[7:], {})["paused"] = value == "1"
            continue
        try:
            out.setdefault(key, {}).update(json.loads(value))
        except (ValueError, TypeError, AttributeError):
            log.warning("schedule %s: unreadable state %r; starting it again", key, value)
    return out


def enqueue_entry(entry: Entry, unique_key: str | None = None) -> str:
    """Enqueue one run of `entry` now; its job id."""
    from .api import enqueue

    options: dict[str, Any] = {"immediate": True}
    for name in ("queue", "lane", "priority"):
        if getattr(entry, name) is not None:
            options[name] = getattr(entry, name)
    return enqueue(entry.job, args=list(entry.args), kwargs=dict(entry.kwargs),
                   unique_key=unique_key, **options).id


def fire_due(entries: Mapping[str, Entry], client: Any, now: datetime | None = None) -> int:
    """Enqueue each entry's latest tick if it has not been fired; how many were."""
    now = now or datetime.now(UTC)
    known = state(client)
    fired = 0
    for name, entry in entries.items():
        seen = known.get(name, {})
        if seen.get("paused"):
            continue
        tick = entry.latest_tick(now)
        if tick is None:
            continue
        tick_ms = int(tick.timestamp() * 1000)
        last = seen.get("last")
        if not isinstance(last, int):  # first sight: start from here, without firing
            client.hsetnx(STATE_KEY, name, json.dumps({"last": tick_ms}))
            continue
        if tick_ms <= last:
            continue
        try:
            job_id = enqueue_entry(entry, unique_key=f"schedule:{name}:{tick_ms}")
        except Exception:  # a bad entry must not stop the worker or the other entries
            log.exception("schedule %s: could not enqueue its tick %s", name, tick.isoformat())
            continue
        _record(client, name, tick_ms, job_id)
        fired += 1
        log.info("schedule %s fired tick %s: job %s", name, tick.isoformat(), job_id)
    return fired


def _record(client: Any, name: str, tick_ms: int, job_id: str) -> None:
    """Set the entry's last tick. Two workers may race here (read, then write); a tick that one
    of them moved back is enqueued again under the same unique key, which returns the same job
    while its row lives (`RETENTION`, a day by default), so it still runs once."""
    last = state(client).get(name, {}).get("last")
    if not isinstance(last, int) or last < tick_ms:
        client.hset(STATE_KEY, name, json.dumps({"last": tick_ms, "job": job_id}))


def run_now(entry: Entry, client: Any) -> str:
    """An operator's "Run now": one job at once, outside the ticks; its id."""
    job_id = enqueue_entry(entry)
    seen = state(client).get(entry.name, {})
    client.hset(STATE_KEY, entry.name, json.dumps({**{k: v for k, v in seen.items() if k != "paused"},
                                                   "job": job_id}))
    return job_id


def set_paused(client: Any, name: str, paused: bool) -> None:
    if paused:
        client.hset(STATE_KEY, f"paused:{name}", "1")
    else:
        client.hdel(STATE_KEY, f"paused:{name}")
