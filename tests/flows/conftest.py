"""The flow tests' queues of four and of two shards, where the lanes and forwarded entries are."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from jobqueue import Queue, conf
from jobqueue.keys import RELAY_STREAMS, placement_hash

FOUR = "four"


@pytest.fixture
def four(valkey_url: str, settings: Any) -> Queue:
    """A queue of 4 shards next to the `valkey_url` fixture's queues."""
    settings.JOBQUEUE = {**settings.JOBQUEUE,
                         "QUEUES": {**settings.JOBQUEUE["QUEUES"], FOUR: {"shards": 4}}}
    conf.reset()
    return Queue(FOUR)


@pytest.fixture
def two(valkey_url: str, settings: Any) -> Queue:
    """A queue of 2 shards next to the `valkey_url` fixture's queues."""
    settings.JOBQUEUE = {**settings.JOBQUEUE,
                         "QUEUES": {**settings.JOBQUEUE["QUEUES"], "two": {"shards": 2}}}
    conf.reset()
    return Queue("two")


def lane_on(index: int) -> str:
    """A lane whose jobs go to shard `index` of a 4-shard queue."""
    return next(f"l{n}" for n in itertools.count() if placement_hash(f"l{n}") % 4 == index)


def forward_entries(queue: Queue) -> int:
    """The entries waiting in the 4 shards' `outcomes` streams (flows' outcomes to relay), and
    in their `forward` streams (an earlier version's)."""
    return sum(queue.client.xlen(queue.shard(i).key(stream)) for i in range(4)
               for stream in RELAY_STREAMS)
