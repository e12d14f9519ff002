"""Branded ids, hash32 and cluster slots against the contract vectors in tests/vectors/."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from jobqueue import ids, keys
from jobqueue.exceptions import InvalidJobId

VECTORS = json.loads(
    (Path(__file__).resolve().parent / "vectors" / "identity.json").read_text()
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
