"""`ENCRYPTION_KEYS` and `encrypt` checked: a malformed key list, or a sealed queue with no key,
fails `manage.py check` naming the setting (and never quoting a key)."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.checks import Error, run_checks

from jobqueue import Queue
from jobqueue.exceptions import ConfigurationError, InvalidOption
from tests.jobapp import jobs

from .conftest import NEW, QUEUES


def _errors() -> str:
    """What `manage.py check` says is wrong with jobqueue's settings (its errors, one a line)."""
    return "\n".join(e.msg for e in run_checks(tags=["jobqueue"]) if isinstance(e, Error))


@pytest.mark.parametrize("keys", [["not a key"], [NEW[:20]], [NEW, NEW], [NEW, 42], NEW],
                         ids=["not-base64", "short", "twice", "not-a-string", "not-a-list"])
def test_a_malformed_key_list_fails_check_naming_the_setting(settings: Any, keys: Any) -> None:
    settings.JOBQUEUE = {**settings.JOBQUEUE, "ENCRYPTION_KEYS": keys}
    errors = _errors()
    assert "ENCRYPTION_KEYS" in errors and NEW not in errors


def test_a_sealed_queue_without_keys_fails_check(settings: Any) -> None:
    settings.JOBQUEUE = {**settings.JOBQUEUE, "QUEUES": QUEUES}
    assert (
        "queue(s) vault, vaultd seal their jobs (encrypt) but JOBQUEUE['ENCRYPTION_KEYS'] "
        "lists no key" in _errors()
    )
    settings.JOBQUEUE = {**settings.JOBQUEUE, "ENCRYPTION_KEYS": [NEW]}
    assert _errors() == ""


def test_encrypt_must_be_a_bool_and_excludes_debounce(settings: Any) -> None:
    settings.JOBQUEUE = {**settings.JOBQUEUE, "QUEUES": {"default": {"encrypt": "yes"}}}
    assert "encrypt must be True or False" in _errors()
    settings.JOBQUEUE = {**settings.JOBQUEUE, "QUEUES": QUEUES, "ENCRYPTION_KEYS": [NEW]}
    with pytest.raises(InvalidOption, match="debounce"):
        jobs.add.using(queue="vault", unique_key="k", debounce=5).enqueue(1, 2)
    with pytest.raises(InvalidOption, match="encrypt must be True or False"):
        jobs.add.using(encrypt="yes").enqueue(1, 2)
    assert Queue("vault").counts()["pending"] == 0 and Queue("default").counts()["pending"] == 0


def test_an_enqueue_with_a_malformed_key_list_raises_and_stores_nothing(settings: Any) -> None:
    settings.JOBQUEUE = {**settings.JOBQUEUE, "QUEUES": QUEUES, "ENCRYPTION_KEYS": ["short"]}
    with pytest.raises(ConfigurationError, match=r"ENCRYPTION_KEYS'\]\[0\]"):
        jobs.add.using(queue="vault").enqueue(1, 2)
    jobs.add.enqueue(1, 2)  # (a plain queue still takes jobs)
    assert Queue("vault").counts()["pending"] == 0 and Queue("default").counts()["pending"] == 1
