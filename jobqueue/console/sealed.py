"""How the console shows a sealed job's data (sealing.py): as sealed, naming its key, unless the
user holds `jobqueue.view_sealed` and this process has the keys to open it.

Owns that one decision and the label; the pages call it on what they show (a job's page opens,
lists never do: a list shows at most a line of each value), and so does the Job admin's change
form, a history row's page (`shown_row`).
"""

from __future__ import annotations

from copy import copy
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from .. import sealing
from ..conf import get_config
from ..exceptions import JobQueueError
from ..records import JobInfo

if TYPE_CHECKING:
    from ..models import Job

PERMISSION = "jobqueue.view_sealed"


def label(value: Any) -> Any:
    """A sealed value as the console shows it; anything else as it is."""
    kid = sealing.sealed_key(value)
    return value if kid is None else f"🔒 sealed (key {kid})"


def masked(info: JobInfo) -> JobInfo:
    """`info` with every sealed field shown as sealed."""
    payload = info.payload
    if sealing.is_sealed_payload(payload):
        payload = {**payload, sealing.SEALED: label(payload[sealing.SEALED])}
    if not (
        payload is not info.payload
        or sealing.is_sealed(info.progress)
        or sealing.is_sealed(info.last_error)
        or sealing.is_sealed(info.result)
    ):
        return info
    history = tuple(
        {**item, "error": label(item.get("error"))} if isinstance(item, dict) else item
        for item in info.history
    )
    return replace(
        info,
        payload=payload,
        result=label(info.result),
        checkpoint=label(info.checkpoint),
        progress=label(info.progress),
        last_error=label(info.last_error),
        history=history,
    )


def shown(info: JobInfo, user: Any) -> JobInfo:
    """A job as its page shows it: opened for a user who may read sealed data (what does not
    open stays sealed), else sealed."""
    if info.sealed and get_config().encryption_keys and user.has_perm(PERMISSION):
        try:
            return masked(sealing.opened_info(info))
        except JobQueueError:  # (a malformed key list: `check` says so)
            pass
    return masked(info)


def shown_row(row: Job, user: Any) -> Job:
    """A history row as its page in the Job admin shows it: a copy (never saved) whose sealed
    fields are as `shown` leaves them; the row itself is left as it is."""
    info = row.info()
    if not info.sealed:
        return row
    info = shown(info, user)
    shown_as = copy(row)
    shown_as.payload, shown_as.result = info.payload, info.result
    shown_as.progress, shown_as.last_error = info.progress, info.last_error
    if isinstance(row.history, list):
        errors = iter(item.get("error") for item in info.history)
        shown_as.history = [
            {**item, "error": next(errors)} if isinstance(item, dict) else item for item in row.history
        ]
    return shown_as


def sealed_queues() -> list[str]:
    """The configured queues that seal their jobs."""
    return sorted(name for name, options in get_config().queues.items() if options.encrypt)
