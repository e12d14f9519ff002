"""Periodic job entries, parsed: `JOBQUEUE["SCHEDULE"]` into `Entry`s, a crontab into `Cron`.

Parsing only (schedule.py fires the entries). An entry has `job` (a dotted path to an `@job`
handler), `cron` (five fields: minute hour day-of-month month day-of-week, in UTC or the entry's
`timezone`) or `every` (seconds, ticks aligned on the epoch), and optional `args`, `kwargs`,
`queue`, `lane`, `priority`.
"""

from __future__ import annotations

import calendar
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from .exceptions import ConfigurationError, JobQueueError
from .keys import validate_lane, validate_queue
from .options import validate_priority

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
        step = int(step_text) if step_text.isdecimal() and int(step_text) > 0 else None
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
    if text.isdecimal():
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
