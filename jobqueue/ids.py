"""Branded snowflake ids: `JOB` + 11 base62 digits of a 63-bit snowflake.

Layout (most significant first): 41 bits of ms since 2024-01-01T00:00:00Z, 10 bits of node,
12 bits of sequence. Fixed width and an ASCII-ordered alphabet make byte order = mint order.
"""

from __future__ import annotations

import os
import random
import re
import threading
import time

EPOCH_MS = 1_704_067_200_000
ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
WIDTH = 11
MAX_SNOWFLAKE = (1 << 63) - 1
NODE_BITS = 10
SEQ_BITS = 12
_INDEX = {ch: i for i, ch in enumerate(ALPHABET)}
_BRANDED = re.compile(r"[A-Z]{3}[0-9A-Za-z]{11}")
_MASK64 = (1 << 64) - 1


def encode(namespace: str, snowflake: int) -> str:
    """Brand a snowflake: three uppercase letters then 11 base62 digits."""
    if not (len(namespace) == 3 and namespace.isascii() and namespace.isupper() and namespace.isalpha()):
        raise ValueError(f"namespace must be three uppercase ASCII letters, got {namespace!r}")
    if not 0 <= snowflake <= MAX_SNOWFLAKE:
        raise ValueError(f"snowflake must be in 0…2**63-1, got {snowflake}")
    return namespace + _base62(snowflake)


_PAIRS = [a + b for a in ALPHABET for b in ALPHABET]
"""Every two-digit base62 string, in order: an id's digits come two at a time."""


_LOW = 3844 * 3844
"""The last four digits' range: ids minted in one millisecond share the seven digits above."""
_high: tuple[int, str] = (-1, "")
"""The last seven leading digits worked out, and their value (a tuple: swapped atomically)."""


def _base62(value: int) -> str:
    """11 base62 digits, most significant first (the caller has checked the range)."""
    global _high
    high, low = divmod(value, _LOW)
    known = _high
    if known[0] != high:
        rest, d3 = divmod(high, 3844)
        rest, d2 = divmod(rest, 3844)
        first, d1 = divmod(rest, 3844)
        known = _high = (high, ALPHABET[first] + _PAIRS[d1] + _PAIRS[d2] + _PAIRS[d3])
    d4, d5 = divmod(low, 3844)
    return known[1] + _PAIRS[d4] + _PAIRS[d5]


def decode(branded: str) -> tuple[str, int]:
    """Split a branded id into (namespace, snowflake); ValueError when malformed."""
    if not isinstance(branded, str) or not _BRANDED.fullmatch(branded):
        raise ValueError(
            f"malformed id {branded!r}: expected 3 uppercase letters and 11 base62 digits"
        )
    value = 0
    for ch in branded[3:]:
        value = value * 62 + _INDEX[ch]
    if value > MAX_SNOWFLAKE:
        raise ValueError(f"malformed id {branded!r}: value exceeds 63 bits")
    return branded[:3], value


def hash32(snowflake: int) -> int:
    """First half of MurmurHash3's fmix64, low 32 bits: spreads ids over shards."""
    k = snowflake & _MASK64
    k ^= k >> 33
    k = (k * 0xFF51AFD7ED558CCD) & _MASK64
    k ^= k >> 33
    return k & 0xFFFFFFFF


def parts(snowflake: int) -> tuple[int, int, int]:
    """(unix ms, node, sequence) of a snowflake."""
    return (
        (snowflake >> (NODE_BITS + SEQ_BITS)) + EPOCH_MS,
        (snowflake >> SEQ_BITS) & ((1 << NODE_BITS) - 1),
        snowflake & ((1 << SEQ_BITS) - 1),
    )


_PAIR_VALUES = {pair: value for value, pair in enumerate(_PAIRS)}
_minted_high: tuple[str, int] = ("", 0)
"""The last seven leading digits read by `minted_ms`, and their part of the snowflake (ids read
in a row share them: they change every ~3.5 ms of minting)."""


def minted_ms(branded: str) -> int | None:
    """The unix ms an id was minted at, or None when the text is not an id."""
    global _minted_high
    if not isinstance(branded, str) or not _BRANDED.fullmatch(branded):
        return None
    high, known = branded[3:10], _minted_high
    if known[0] != high:
        try:
            known = _minted_high = (high, decode(branded[:10] + "0000")[1])
        except ValueError:  # (more than 63 bits)
            return None
    value = known[1] + _PAIR_VALUES[branded[10:12]] * 3844 + _PAIR_VALUES[branded[12:]]
    return None if value > MAX_SNOWFLAKE else (value >> (NODE_BITS + SEQ_BITS)) + EPOCH_MS


class Minter:
    """Thread-safe, monotonic snowflake source for one node.

    When the clock stalls or steps back, or 4096 ids are minted in one ms, it borrows the next
    millisecond instead of sleeping, so ids stay strictly increasing within the process.
    """

    def __init__(self, node: int) -> None:
        if not 0 <= node < (1 << NODE_BITS):
            raise ValueError(f"node must be in 0…1023, got {node}")
        self.node = node
        self._lock = threading.Lock()
        self._last_ms = -1
        self._seq = 0

    def next(self) -> int:
        with self._lock:
            now = int(time.time() * 1000) - EPOCH_MS
            if now > self._last_ms:
                self._last_ms, self._seq = now, 0
            else:
                self._seq += 1
                if self._seq >> SEQ_BITS:
                    self._last_ms, self._seq = self._last_ms + 1, 0
            return (self._last_ms << (NODE_BITS + SEQ_BITS)) | (self.node << SEQ_BITS) | self._seq


_minter: Minter | None = None
_minter_lock = threading.Lock()


def _forget_minter() -> None:
    global _minter
    _minter = None


# A forked child must not share its parent's node and sequence: it mints with a node of its own.
os.register_at_fork(after_in_child=_forget_minter)


def _default_node() -> int:
    """JOBQUEUE_NODE when set, else a random node (enqueue re-mints on the rare collision)."""
    raw = os.environ.get("JOBQUEUE_NODE")
    return int(raw) if raw else random.SystemRandom().randrange(1 << NODE_BITS)


def _process_minter() -> Minter:
    global _minter
    minter = _minter
    if minter is not None:
        return minter
    with _minter_lock:
        if _minter is None:
            _minter = Minter(_default_node())
        return _minter


def new_id(namespace: str = "JOB") -> str:
    """Mint a fresh branded id."""
    if namespace == "JOB":  # the hot path: a namespace known to be valid
        return "JOB" + _base62(_process_minter().next())
    return encode(namespace, _process_minter().next())


def validate_job_id(value: object) -> str:
    """Return `value` if it is a branded job id, else raise InvalidJobId."""
    from .exceptions import InvalidJobId

    try:
        namespace, _ = decode(value)  # type: ignore[arg-type]
    except ValueError as exc:
        raise InvalidJobId(str(exc)) from None
    if namespace != "JOB":
        raise InvalidJobId(f"malformed job id {value!r}: job ids start with 'JOB'")
    return value  # type: ignore[return-value]
