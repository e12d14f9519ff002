"""Claims whose reply was lost: their jobs go back to waiting, uncharged.

A claim is never sent again (`calls.claim` sends it by `run_once`): a second one would lease
other jobs, and leave the first one's leased to nobody until their lease lapsed, the reaper then
counting a run that never happened. Instead each claim carries an id, which claim.lua writes on
every row it leases; a claim whose reply is lost (a timeout, a broken connection) is remembered
here, and release.lua hands its jobs back by that id (worker and claim id) before the queue's
next claim, when the worker sees Valkey again, or as it stops. One `LostClaims` per `Leases`
(leases.py).
"""

from __future__ import annotations

import itertools
import os
import secrets
from collections.abc import Iterable
from typing import Any

from ..conf import get_config
from ..exceptions import VALKEY_DOWN
from ..keys import ShardKeys
from ..records import Lease
from .scripts import calls
from .scripts.answers import Claimed

_count = itertools.count(1)
_tag = [secrets.token_hex(3)]
"""A claim's id is this process's tag and a count: unique among the claims of one worker name,
and of the API's claims without one (`Queue.dequeue`), whichever process makes them."""
os.register_at_fork(after_in_child=lambda: _tag.__setitem__(0, secrets.token_hex(3)))


def new_claim_id() -> str:
    """A claim's id (also an idle offer's: handoff.py)."""
    return f"{_tag[0]}{next(_count)}"


class LostClaims:
    """The claims of one queue whose reply was lost: (shard, worker, claim id)."""

    def __init__(self) -> None:
        self.lost: list[tuple[int, str, str]] = []

    def send(self, client: Any, shard: ShardKeys, worker: str, count: int, head: list[Any],
             successes: Iterable[tuple[Lease, str]]) -> Claimed:
        """One claim on `shard` (`calls.claim`: up to `count` jobs, `head` its arguments up to
        its id, then the successes it records), once the jobs of the queue's lost claims are
        back: its answer, or the error that lost it (then it is remembered)."""
        if self.lost:
            self.recover(client, shard.queue)
        claim_id = new_claim_id()
        try:
            return calls.claim(client, shard, count, head, claim_id, successes)
        except VALKEY_DOWN:
            self.lost.append((shard.index, worker, claim_id))
            raise

    def recover(self, client: Any, queue: str) -> None:
        """Hand back the jobs of each lost claim (release.lua, by worker and claim id), until
        Valkey does not answer (the rest are kept for the next call). Found by its id until
        their lease lapses; then the reaper counts the lapse as a run."""
        while self.lost:
            index, worker, claim_id = self.lost[0]
            calls.release_lost(client, ShardKeys(queue, index),
                               round(get_config().retention * 1000), worker, claim_id)
            self.lost.pop(0)
