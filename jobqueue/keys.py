"""The keyspace: `emq:{<q>}:<type>` for shard 0, `emq:{<q>#<k>}:<type>` for shard k.

Every key of one shard shares the hash tag, so one Lua script touches one cluster slot.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass

from .exceptions import InvalidName

QUEUE_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
LANE_NAME = re.compile(r"[A-Za-z0-9._:-]{1,128}")
REGISTRY_KEY = "{emq}:queues"
WORKERS_KEY = "{emq}:workers"
RECYCLES_KEY = "{emq}:recycles"
"""Worker recycles: by reason (`max_jobs`, `max_memory`) for the whole fleet, and by worker name
(`name:<worker>`) while that worker lives."""
RECYCLE_REASONS = ("max_jobs", "max_memory")
"""Why a worker recycles: `runworker --max-jobs`, `--max-memory`."""
RELAY_STREAMS = ("outcomes", "forward")
"""A shard's streams of flows' outcomes for other shards, to relay (flows/relay.py): its own
(an entry a pack of outcomes), then an earlier version's (an entry an outcome)."""


def _crc16(data: bytes) -> int:
    """CRC16-XMODEM (poly 0x1021, init 0), as the Valkey cluster spec uses."""
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else (crc << 1)
            crc &= 0xFFFF
    return crc


def hashtag(key: str) -> str:
    """The part of `key` that decides its slot: the first non-empty `{…}`, else the key."""
    start = key.find("{")
    if start != -1:
        end = key.find("}", start + 1)
        if end > start + 1:
            return key[start + 1 : end]
    return key


def slot(key: str) -> int:
    """Cluster slot of `key`: CRC16 of its hash tag mod 16384."""
    return _crc16(hashtag(key).encode()) % 16384


def validate_queue(name: object) -> str:
    """Return a valid queue name or raise InvalidName saying what is allowed."""
    if not isinstance(name, str) or not QUEUE_NAME.fullmatch(name):
        raise InvalidName(
            f"invalid queue name {name!r}: use 1-64 letters, digits, '.', '_' or '-'"
        )
    return name


def validate_lane(name: object) -> str:
    """Return a valid lane name or raise InvalidName saying what is allowed."""
    if not isinstance(name, str) or not LANE_NAME.fullmatch(name):
        raise InvalidName(
            f"invalid lane name {name!r}: use 1-128 letters, digits, '.', '_', '-' or ':'"
        )
    return name


def queue_list(raw: str | None) -> tuple[str, ...]:
    """Parse a `--queues a,b` option into validated names (empty: none given)."""
    if not raw:
        return ()
    return tuple(validate_queue(name.strip()) for name in raw.split(",") if name.strip())


def placement_hash(text: str) -> int:
    """Stable 32-bit hash of a lane name or unique key, for shard placement."""
    return zlib.crc32(text.encode())


@dataclass(frozen=True)
class ShardKeys:
    """Key names of one shard of a queue."""

    queue: str
    index: int

    @property
    def tag(self) -> str:
        return self.queue if self.index == 0 else f"{self.queue}#{self.index}"

    @property
    def base(self) -> str:
        """The braced prefix scripts derive job, lane and unique keys from."""
        return f"emq:{{{self.tag}}}"

    def key(self, kind: str) -> str:
        return f"{self.base}:{kind}"

    def job(self, job_id: str) -> str:
        return f"{self.base}:job:{job_id}"

    def hand(self, worker: str) -> str:
        """A worker's hand-off list: jobs an enqueue leased to it while it waited idle."""
        return f"{self.base}:hand:{worker}"

    def lane(self, lane: str) -> str:
        """The default lane ('') is `pending`; a named lane is `lane:<name>`."""
        return self.key("pending") if lane == "" else f"{self.base}:lane:{lane}"


def shard_of(key: str) -> ShardKeys:
    """The shard a key of a shard (`emq:{<q>}:…`, `emq:{<q>#<k>}:…`) belongs to."""
    name, mark, index = hashtag(key).rpartition("#")
    return ShardKeys(name, int(index)) if mark and index.isdigit() else ShardKeys(hashtag(key), 0)


@dataclass(frozen=True)
class CapKeys(ShardKeys):
    """Key names of a queue's global cap (`global_concurrency`: permits.lua): a slot of its own,
    `emq:{q#cap}`, apart from every shard's (shard 0's tag is the bare queue name, another's
    `q#<n>`; no queue name holds '#', so no queue's tag is another's), so the cap's cost does
    not grow with the shards. `index` is -1: no shard has it."""

    @property
    def tag(self) -> str:
        return f"{self.queue}#cap"


def cap_keys(queue: str) -> CapKeys:
    """The keys of `queue`'s global cap."""
    return CapKeys(queue, -1)
