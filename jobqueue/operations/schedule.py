"""Periodic jobs: `JOBQUEUE["SCHEDULE"]` entries (parsed by cron.py) that any running worker
fires, each tick once.

Firing, in every worker's maintenance (never in `--burst` runs): an entry's latest tick not yet
fired is enqueued with the unique key `schedule:<name>:<tick ms>` (two workers racing for the
same tick get the same job), then recorded as the entry's last tick in the `emq:schedules` hash.
Only the latest tick counts, so ticks missed while no worker ran fire once, not once each. An
entry seen for the first time starts from its latest tick without firing it: deploying a
nightly job at noon does not run it at once.

Ticks are read on Valkey's clock (`server_now`), never a worker's: a worker whose clock runs a
day fast would fire tomorrow's tick now and record it, and every worker would then skip a day
of ticks. Valkey bounds what any one worker can move (`operator_calls.record_tick`): a recorded
tick is never in its future beyond SLACK_MS, and a recorded tick that is (written before this bound) is taken
for none, so the right tick fires and replaces it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from ..api.registry import enqueue
from ..cron import Entry
from ..engine.scripts import operator_calls

log = logging.getLogger("jobqueue.schedule")
STATE_KEY = "emq:schedules"
"""HASH: <name> -> JSON {"last": tick ms, "job": id of the last job fired}; paused:<name> -> 1."""
SLACK_MS = 1000
"""How far in Valkey's future a tick may be fired and recorded (a caller's clock reading a little
ahead); a tick further ahead is refused, and one found recorded there is taken for none."""

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
    options: dict[str, Any] = {"immediate": True}
    for name in ("queue", "lane", "priority"):
        if getattr(entry, name) is not None:
            options[name] = getattr(entry, name)
    return enqueue(entry.job, args=list(entry.args), kwargs=dict(entry.kwargs),
                   unique_key=unique_key, **options).id


def server_now(client: Any) -> datetime:
    """Valkey's time (that of the node holding the schedules' state)."""
    ms = operator_calls.server_now_ms(client, STATE_KEY)
    return datetime.fromtimestamp(ms / 1000, UTC)


def fire_due(entries: Mapping[str, Entry], client: Any, now: datetime | None = None) -> int:
    """Enqueue each entry's latest tick (as of `now`, but never later than Valkey's time plus
    SLACK_MS; else as of Valkey's time) if it has not been fired; how many were."""
    valkey = server_now(client)
    now = valkey if now is None else min(now, valkey + timedelta(milliseconds=SLACK_MS))
    bound = int(valkey.timestamp() * 1000) + SLACK_MS  # (a last tick beyond: taken for none)
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
        if tick_ms <= last <= bound:
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
    """Set the entry's last tick, in one step on Valkey (`operator_calls.record_tick`): never
    back, and never into Valkey's future. A tick two workers both fire is enqueued under the
    same unique key, which returns the same job while its row lives (`RETENTION`, a day by
    default): it runs once."""
    operator_calls.record_tick(client, STATE_KEY, name, tick_ms,
                               json.dumps({"last": tick_ms, "job": job_id}), SLACK_MS)


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
