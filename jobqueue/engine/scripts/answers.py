"""What the transition scripts answer, as Python values: one small type per vocabulary, and
`refused`, the one place a script's refusal ('missing', 'state:<s>', 'corrupt:<field>', a
flow's 'exists' or 'missing') becomes its exception (jobqueue/exceptions.py).

The twins (`calls`, `operator_calls`) turn each reply into these; nothing else reads a reply.
Each type equals the raw value it stands for where callers compared raw values before (an
`IntEnum` is its int, a `StrEnum` its text), so a per-job answer costs a tuple lookup, not a
call. The scripts raise no error reply on purpose: an error reply (a Lua error: a bug, a bad
argument) is raised as redis-py's `ResponseError`, unchanged.
"""

from __future__ import annotations

from enum import IntEnum, StrEnum
from typing import Any, NamedTuple

from ...exceptions import InvalidFlow, InvalidTransition, JobNotFound, JobQueueError
from ...records import Lease, text


class Acked(IntEnum):
    """An ack's answer for one job (ack.lua, and the successes a claim carries)."""

    STALE = 0
    SUCCEEDED = 1
    SUCCEEDED_FORWARDED = 2
    """Recorded, and its outcome forwarded to dependents on other shards (relay.py)."""
    CANCELLED = 3
    """Recorded as cancelled: an operator flagged the run."""
    CANCELLED_FORWARDED = 4

    @property
    def state(self) -> str:
        """The state recorded: 'succeeded', 'cancelled', or 'stale' (nothing recorded)."""
        return ("stale", "succeeded", "succeeded", "cancelled", "cancelled")[self]

    @property
    def forwarded(self) -> bool:
        return self in (Acked.SUCCEEDED_FORWARDED, Acked.CANCELLED_FORWARDED)


ACKED: tuple[Acked, ...] = tuple(Acked)
"""Acked by its number: the twins' per-job lookup (an index, not a call)."""


class Extended(IntEnum):
    """An extend's answer for one lease (extend.lua)."""

    STALE = 0
    RENEWED = 1
    CANCEL_REQUESTED = 2
    """Renewed, and an operator asked to cancel the attempt."""
    FINISHED = 3
    """Not renewed: this very attempt has finished (its ack got there first)."""


EXTENDED: tuple[Extended, ...] = tuple(Extended)


class Placed(StrEnum):
    """What an enqueue did with one job (enqueue.lua); the reply's text is compared as is."""

    NEW = "new"
    EXISTS = "exists"
    DEBOUNCED = "debounced"
    COLLISION = "collision"
    """A minted id already taken: mint again."""
    MOVED = "moved"
    """The shard is draining: read the layout again."""
    ABSENT = "absent"
    """Mode 'prior': neither the lane nor the key is on that shard: place it on its live one."""


SEND_AGAIN = (Placed.COLLISION, Placed.MOVED, Placed.ABSENT)


class Enqueued(NamedTuple):
    """An enqueue call's reply: whether the shard's meta says 'listed', then per job (id,
    status) flat: `job(n)` reads the n-th."""

    listed: bool
    flat: list[str]

    def job(self, n: int) -> tuple[str, str]:
        return self.flat[2 * n], self.flat[2 * n + 1]


class Claimed(NamedTuple):
    """A claim's reply: the successes' answers, the ms until the rate limit admits another job
    (0: not limited; -1: the global cap changed live, nothing was leased), the leases."""

    acked: list[Acked]
    wait_ms: int
    leases: list[Lease]


class Permitted(NamedTuple):
    """A permits call's answer: the permits the holder holds now and the cap's live setting
    ('' = none set live: what a claim passes as the shards' mark)."""

    held: int
    live: str
    over: bool
    """The holders hold more than the cap (it was lowered live)."""


class Nacked(NamedTuple):
    """A nack's answer: the job's new state (None: the lease was stale), and whether the
    outcome was forwarded to dependents on other shards (relay at once)."""

    state: str | None
    forwarded: bool


class Promoted(NamedTuple):
    moved: int
    next_in: float | None
    """Seconds until the shard's next scheduled job or lane token (None: none)."""


class Flowed(NamedTuple):
    """A flow call's reply (its refusals raise: `refused`)."""

    listed: bool
    moved: bool
    """The shard is draining: nothing written; place the jobs again."""
    written: int
    forwarded: bool
    """A link met a member that had finished: its outcome waits in base:outcomes (relay)."""


class Delivered(NamedTuple):
    """A delivery's answer (deliver.lua)."""

    forwarded: bool
    """The deliveries forwarded in turn (relay from this shard)."""
    waits_again: bool
    """A job a member's failure had cancelled waits again."""
    absent: list[list[int] | None]
    """Per pack: the places (from 0) of its outcomes whose job is not on the shard (expired,
    deleted, or a node that lost data), the others applied (an empty list: every outcome
    applied, or nothing left to apply: a replay, an older outcome); None: not a list of
    outcomes, nothing applied."""


class Watched(NamedTuple):
    """A watch's reply: the job's state (None: no live row); for a finished job its result
    (JSON) and last error, else the caller is counted as a waiter."""

    state: str | None
    finished: bool
    result: str = ""
    error: str = ""


class Head(NamedTuple):
    """The first job of a priority band of a lane with ready work."""

    lane: str
    job_id: str
    ready_ms: int
    """When it became ready (ms; its id's mint time when the row says neither)."""


def refused(script: str, answer: str, job_id: str, queue: str) -> JobQueueError:
    """The exception for a script's refusal `answer` of a call about `job_id` in `queue`."""
    kind, _, detail = answer.partition(":")
    if script == "flow":
        if kind == "exists":
            return InvalidFlow(f"job id {detail} is taken already")
        if kind == "missing":
            return InvalidFlow(f"no live job {detail} in queue {queue!r} to depend on")
    elif kind == "missing":
        return JobNotFound(f"no live job {job_id} in queue {queue!r}")
    elif kind == "state":
        return InvalidTransition(f"cannot {script} job {job_id}: it is {detail}")
    elif kind == "corrupt":
        return InvalidTransition(f"cannot {script} job {job_id}: its field {detail} is corrupt")
    return JobQueueError(f"{script}: unexpected answer {answer!r} about job {job_id}")


def operator_answer(script: str, reply: Any, job_id: str, queue: str) -> str:
    """An operator script's answer: the state after 'ok:', else its refusal raised."""
    answer = text(str(reply))[0]
    if answer.startswith("ok:"):
        return answer[3:]
    raise refused(script, answer, job_id, queue)
