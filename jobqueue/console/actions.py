"""What an operator may do, shared by the console's pages, the admin's bulk action and
`manage.py jobqueue`: each action is one call into `Queue` (or the schedule) and answers with the
line the operator reads; a cancel then relays at once the "member done" it forwarded to a flow's
jobs on other shards or queues (`cancel`), as `flows.cancel` does. Who may do it is the
caller's business (`PERMISSIONS` names the Django
permission each needs); `log_action` records it in the admin's history.
"""

from __future__ import annotations

from typing import Any

from ..conf import get_client
from ..cron import Entry
from ..engine import layouts
from ..engine.scripts import operator_calls
from ..engine.store import Queue
from ..exceptions import InvalidOption, InvalidPriority, InvalidTransition, JobNotFound
from ..flows import relay
from ..history import outbox
from ..operations import schedule
from ..options import EVERY_LANE
from ..states import State

PERMISSIONS = {"retry": "jobqueue.retry_job", "reprioritize": "jobqueue.reprioritize_job",
               "cancel": "jobqueue.cancel_job", "pause": "jobqueue.pause_queue",
               "resize": "jobqueue.resize_queue", "run_schedule": "jobqueue.run_schedule",
               "set_lane_concurrency": "jobqueue.set_lane_concurrency",
               "set_global_concurrency": "jobqueue.set_global_concurrency",
               "delete": "jobqueue.delete_history", "enqueue": "jobqueue.enqueue_job"}
"""The Django permission each action needs (each console action's view, in posts.py, and the
admin's bulk retry ask it)."""
WAITING_OR_RUNNING = frozenset({State.PENDING, State.SCHEDULED, State.ACTIVE})
JOB_STATES = {"retry": frozenset({State.DEAD, State.CANCELLED, State.EXPIRED}),
              "reprioritize": WAITING_OR_RUNNING,
              "cancel": WAITING_OR_RUNNING | {State.WAITING}}
"""The states in which each action on one job is offered."""


MAX_DIGITS = 9
"""The most digits a number typed into a form may have: more is beyond every range a form
takes (and Python refuses to read a number of 4,300 digits or more)."""


def typed_number(raw: str) -> int | str:
    """What an operator typed in a number field: the whole number when it is ASCII digits (at
    most MAX_DIGITS), else the text as the error that refuses it quotes it (`cut_short`)."""
    text = raw.strip()
    if text.isascii() and text.isdecimal() and len(text) <= MAX_DIGITS:
        return int(text)
    return cut_short(text)


def cut_short(text: str, limit: int = 40) -> str:
    """Text an operator typed, cut short for a message that quotes it."""
    return text if len(text) <= limit else text[:limit] + "…"


def retry_job(queue: Queue, job_id: str, call_id: str = "") -> State:
    """Retry a dead, cancelled or expired job: in place while Valkey has its row, else created
    again from its mirror row under the same id, with every option the row keeps (its attempts
    go on from the row's, its budget whole again). A durable job's row reopens in the same step
    (see models.reopened). `call_id`: as `Queue.retry` takes it."""
    try:
        return State(queue.retry(job_id, call_id))
    except JobNotFound:  # (Valkey no longer holds it: its mirror row may)
        pass
    from ..models import Job

    row = Job.objects.filter(pk=job_id, queue=queue.name).first()
    if row is None:
        raise JobNotFound(f"no job {job_id} in queue {queue.name!r}, live or mirrored")
    if row.state not in JOB_STATES["retry"]:
        raise InvalidTransition(f"cannot retry job {job_id}: it is {row.state}")
    outbox.recreate(queue, row)
    index = queue.locate(job_id)
    if call_id and index is not None:  # (the same call again, a resumed bulk retry's: no second run)
        operator_calls.keep_answer(queue.client, queue.shard(index), call_id, f"ok:{State.PENDING}")
    return State.PENDING


def retry_message(job_id: str, state: str) -> str:
    return f"Retried job {job_id}: it is {state} again."


def reprioritize_job(queue: Queue, job_id: str, raw: str) -> str:
    """Give a waiting or running job the priority an operator typed."""
    try:
        priority = int(raw)
    except ValueError:
        raise InvalidPriority(f"priority must be an integer in -100…100, got {cut_short(raw)!r}") from None
    queue.reprioritize(job_id, priority)
    return f"Job {job_id} now has priority {priority}."


def cancel(queue: Queue, job_id: str, call_id: str = "") -> str:
    """`Queue.cancel`, then the relay of what it forwarded to the jobs waiting for this one on
    other shards or queues (relay.py): the job's own queue may have no worker whose maintenance
    turn would relay it (the reason an operator cancels its jobs), while theirs run."""
    state = queue.cancel(job_id, call_id)
    index = queue.locate(job_id)
    if index is not None:
        relay.relay_shard(queue, index)
    return state


def cancel_job(queue: Queue, job_id: str) -> str:
    if cancel(queue, job_id) == State.ACTIVE:
        return f"Job {job_id} is running: it will be recorded as cancelled when it stops."
    return f"Cancelled job {job_id}."


def pause_queue(queue: Queue, paused: bool) -> str:
    """Pause (or resume) a queue: workers stop (or start again) claiming its jobs."""
    if paused:
        queue.pause()
    else:
        queue.resume()
    return f"Queue {queue.name} {'paused' if paused else 'resumed'}."


def set_lane_concurrency(queue: Queue, lane: str, raw: str) -> str:
    """Set a lane's cap live from what an operator typed (blank: back to the settings' cap)."""
    cap = typed_number(raw) if raw.strip() else None
    if isinstance(cap, str):
        raise InvalidOption(f"a lane's cap must be a whole number ≥ 1 (or blank), got {cap!r}")
    queue.set_lane_concurrency(lane, cap)
    shown = "every named lane" if lane == EVERY_LANE else f"lane {lane or '(default)'}"
    if cap is None:
        return f"Queue {queue.name}: {shown} has its settings' cap again."
    return f"Queue {queue.name}: {shown} now runs at most {cap} job(s) at once."


def set_global_concurrency(queue: Queue, raw: str, how: str = "") -> str:
    """Set a queue's global cap live from what an operator typed; `how`: "lift" (no cap,
    whatever the settings say) or "settings" (the settings' cap again) instead."""
    if how == "lift":
        queue.set_global_concurrency(None)
        return f"Queue {queue.name}: no global cap now."
    if how == "settings":
        queue.reset_global_concurrency()
        given = queue.options.global_concurrency
        return (f"Queue {queue.name}: the settings' global cap again "
                f"({f'at most {given} job(s) at once' if given else 'none'}).")
    typed = typed_number(raw)
    if isinstance(typed, str) or typed < 1:
        raise InvalidOption(f"the global cap must be a whole number ≥ 1, got {typed!r}")
    queue.set_global_concurrency(typed)
    return f"Queue {queue.name} now runs at most {typed} job(s) at once, over every worker."


def resize_queue(queue: Queue, count: int, by: str) -> tuple[layouts.Layout, layouts.Layout]:
    """Set a queue's live shard count and refresh its `Shard` rows: (layout before, after)."""
    from ..history.mirror import record_shards

    before = queue.layout(fresh=True)
    after = queue.resize(count, by=by)
    record_shards(queue)
    return before, after


def run_schedule(entry: Entry) -> str:
    """An operator's "Run now" of a periodic job: one job at once, outside its ticks."""
    job_id = schedule.run_now(entry, get_client())
    return f"Ran periodic job {entry.name} now: job {job_id}."


def pause_schedule(name: str, paused: bool) -> str:
    schedule.set_paused(get_client(), name, paused)
    return f"Periodic job {name} {'paused' if paused else 'resumed'}."


def log_action(user: Any, obj: Any, message: str) -> None:
    """Record an operator's action in the admin's history: a CHANGE LogEntry on `obj`, a `Job`
    or `Shard` row (saved or not), or a periodic job given by its name."""
    from django.contrib.admin.models import CHANGE, LogEntry

    user_id = int(user.pk or 0)
    if isinstance(obj, str):
        LogEntry.objects.create(user_id=user_id, object_id=obj, object_repr=f"schedule {obj}"[:200],
                                action_flag=CHANGE, change_message=message)
        return
    LogEntry.objects.log_actions(user_id=user_id, queryset=[obj], action_flag=CHANGE,
                                 change_message=message, single_object=True)
