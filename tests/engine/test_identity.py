"""Branded ids, hash32 and cluster slots against the contract vectors in tests/vectors/."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from jobqueue import ids, keys
from jobqueue.exceptions import InvalidJobId

VECTORS = json.loads(
    (Path(__file__).resolve().parents[1] / "vectors" / "identity.json").read_text()
)


@pytest.mark.parametrize("case", VECTORS["branded"], ids=lambda c: c["id"])
def test_branded_vectors_encode_decode_and_hash(case: dict) -> None:
    snowflake = int(case["snowflake"])
    assert ids.encode(case["namespace"], snowflake) == case["id"]
    assert ids.decode(case["id"]) == (case["namespace"], snowflake)
    assert ids.hash32(snowflake) == case["hash32"]
    assert ids.parts(snowflake) == (case["unix_ms"], case["node"], case["seq"])


@pytest.mark.parametrize("bad", VECTORS["invalid_branded"])
def test_malformed_ids_are_rejected_with_value_error(bad: str) -> None:
    with pytest.raises(ValueError):
        ids.decode(bad)


def test_an_ids_mint_time_is_read_the_same_whatever_was_read_before() -> None:
    """`minted_ms` keeps the last leading digits it worked out: ids sharing them, ids that do
    not, text that is no id and ids past 63 bits all answer as decoding the whole id does."""
    def decoded(text: str) -> int | None:
        try:
            return ids.parts(ids.decode(text)[1])[0]
        except ValueError:
            return None

    rng = random.Random(27)
    start = 123_456_789 << 22
    texts = [ids.encode("JOB", v) for v in range(start, start + 3_000_000, 997)]
    texts += [ids.encode("JOB", rng.randrange(ids.MAX_SNOWFLAKE + 1)) for _ in range(2000)]
    texts += ["JOB" + "".join(rng.choices(ids.ALPHABET, k=11)) for _ in range(2000)]
    texts += ["JOBzzzzzzzzzzz", "JOB7zzzzzzzzzz", texts[0] + "\n", *VECTORS["invalid_branded"]]
    for text in texts + rng.sample(texts, len(texts)):  # (in order, then shuffled)
        assert ids.minted_ms(text) == decoded(text), text


@pytest.mark.parametrize("case", VECTORS["slots"], ids=lambda c: c["key"])
def test_slot_vectors(case: dict) -> None:
    assert keys.slot(case["key"]) == case["slot"]


@pytest.mark.parametrize("case", VECTORS["hashtags"], ids=lambda c: c["key"])
def test_hashtag_vectors(case: dict) -> None:
    assert keys.hashtag(case["key"]) == case["hashtag"]


def test_epoch_matches_the_vectors() -> None:
    assert VECTORS["epoch_ms"] == ids.EPOCH_MS


def test_minting_is_unique_and_monotonic_across_threads() -> None:
    minter = ids.Minter(node=5)
    per_thread: list[list[int]] = [[] for _ in range(8)]

    def mint(out: list[int]) -> None:
        out.extend(minter.next() for _ in range(5000))

    threads = [threading.Thread(target=mint, args=(out,)) for out in per_thread]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [s for out in per_thread for s in out]
    assert len(set(every)) == len(every) == 40_000
    for out in per_thread:  # each thread sees strictly increasing ids, so does byte order
        branded = [ids.encode("JOB", s) for s in out]
        assert out == sorted(out) and branded == sorted(branded)


def test_new_id_is_a_job_id_and_non_job_ids_are_refused() -> None:
    assert ids.validate_job_id(ids.new_id()).startswith("JOB")
    with pytest.raises(InvalidJobId, match="start with 'JOB'"):
        ids.validate_job_id("USR0KHTOWnGLuC")
    with pytest.raises(InvalidJobId):
        ids.validate_job_id(None)


def _digits(value: int) -> str:
    """Base62 the slow way: the reference the minter's shortcut must match."""
    out = ""
    for _ in range(ids.WIDTH):
        value, digit = divmod(value, 62)
        out = ids.ALPHABET[digit] + out
    return out


def test_encoding_matches_plain_base62_whatever_came_before() -> None:
    # The encoder keeps the seven leading digits of the last id: values that share them, values
    # that do not, and going back to earlier ones must all come out right.
    rng = random.Random(7)
    values = [0, ids.MAX_SNOWFLAKE, ids._LOW - 1, ids._LOW, ids._LOW + 1]
    for _ in range(2000):
        base = rng.randrange(ids.MAX_SNOWFLAKE)
        values += [base, min(base + rng.randrange(5000), ids.MAX_SNOWFLAKE), rng.choice(values)]
    for value in values:
        assert ids.encode("JOB", value) == "JOB" + _digits(value)
        assert ids.decode(ids.encode("JOB", value))[1] == value


FORK = """
import os
from jobqueue import ids
parent = ids._process_minter()
ids.new_id()
child = os.fork()  # as a preloading server (gunicorn --preload) forks its workers
if child == 0:  # the child starts afresh: a node and a sequence of its own
    os._exit(0 if ids._minter is None and ids._process_minter() is not parent else 1)
assert os.waitpid(child, 0)[1] == 0 and ids._process_minter() is parent
"""


def test_a_forked_child_mints_with_a_minter_of_its_own() -> None:
    # In a fresh interpreter: forking this multi-threaded test process could deadlock.
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", FORK], cwd=root, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
