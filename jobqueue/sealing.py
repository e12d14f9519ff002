"""Encryption at rest: a job's data sealed (AES-GCM) before it is stored, opened where it is used.

Owns the keyring (`JOBQUEUE["ENCRYPTION_KEYS"]`: the first key seals, every one opens) and the
sealed form of a value. Everything else only calls in here at its edge: enqueue seals a job's
args and kwargs (`spec.prepare`), the worker opens them and seals what the run gives back
(result, error text, checkpoint, progress: worker/executor.py, api/handler.py), and `result()`,
`get_job()` and the console open what they show. Valkey's scripts, the mirror and the outbox
only ever carry sealed values as opaque text, so they are unchanged.

A sealed value is the text `jq1.<key id>.<job id>.<base64(nonce + ciphertext + tag)>`:
`jq1` the format's version, the key id the first 4 bytes of a hash of the key (hex; it names
the key without revealing it), a random 96-bit nonce, and the job id and the field's name
bound as associated data, so a value copied to another job, or to another field, does not open.
A job whose payload carries `"sealed"` is a sealed job: its args and kwargs live there; what a
flow hands it (its members' results, spliced in front of its args by the engine) are opened
under the id of the member that sealed them.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from . import _compat
from .exceptions import ConfigurationError, JobQueueError

if TYPE_CHECKING:
    from .records import JobInfo

_c_encoder = _compat.c_json_encoder()
_scan = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def _json(value: Any) -> str:
    """Compact JSON (the C encoder's, as spec.dumps; the value was checked there already)."""
    if _c_encoder is not None:
        return "".join(_c_encoder(value, 0))
    return json.dumps(value, separators=(",", ":"))


PREFIX = "jq1."
SEALED = "sealed"
"""The payload key that holds a sealed job's args and kwargs."""
KEY_BYTES = 32
NONCE_BYTES = 12


class SealError(JobQueueError):
    """A sealed value that cannot be opened: its key is no longer listed, or it was tampered
    with. The message names the key id, never the value."""


def key_id(key: bytes) -> str:
    """A key's short public name: the first 4 bytes of a hash of it, as hex."""
    return hashlib.sha256(b"jobqueue key id:" + key).hexdigest()[:8]


def parse_keys(raw: Any) -> list[bytes]:
    """`ENCRYPTION_KEYS` as bytes; ConfigurationError naming the setting and the wrong entry
    (by position: a key is never quoted)."""
    if not isinstance(raw, (list, tuple)):
        raise ConfigurationError(
            f"JOBQUEUE['ENCRYPTION_KEYS'] must be a list of keys, got a {type(raw).__name__}"
        )
    keys = []
    for n, value in enumerate(raw):
        try:
            if not isinstance(value, str):
                raise ValueError
            key = base64.urlsafe_b64decode(value.strip() + "=" * (-len(value.strip()) % 4))
        except (ValueError, binascii.Error):
            key = b""
        if len(key) != KEY_BYTES:
            raise ConfigurationError(
                f"JOBQUEUE['ENCRYPTION_KEYS'][{n}] is not the URL-safe base64 of {KEY_BYTES} "
                f'bytes (make one with: python -c "import base64, os; '
                f'print(base64.urlsafe_b64encode(os.urandom(32)).decode())")'
            )
        keys.append(key)
    if len({key_id(key) for key in keys}) != len(keys):
        raise ConfigurationError("JOBQUEUE['ENCRYPTION_KEYS'] lists the same key twice")
    return keys


class Keyring:
    """The configured keys: the first seals, every one opens (by key id)."""

    def __init__(self, keys: list[bytes]) -> None:
        self.ids = [key_id(key) for key in keys]
        self._ciphers: dict[str, Any] = {}
        if keys:  # (no key, no need of the package: a project that seals nothing)
            try:
                from cryptography.hazmat.primitives.ciphers.aead import AESGCM
            except ImportError:  # pragma: no cover - the package is an optional extra
                raise ConfigurationError(
                    "JOBQUEUE['ENCRYPTION_KEYS'] is set but the 'cryptography' package is not "
                    "installed (pip install 'jobqueue[encryption]')"
                ) from None
            self._ciphers = {kid: AESGCM(key) for kid, key in zip(self.ids, keys, strict=True)}
        self.current = self.ids[0] if keys else None

    def seal(self, plain: str, job_id: str, field: str) -> str:
        if self.current is None:
            raise ConfigurationError(
                "this job is to be sealed (its queue or handler says encrypt=True) but "
                "JOBQUEUE['ENCRYPTION_KEYS'] lists no key: nothing was stored"
            )
        nonce = os.urandom(NONCE_BYTES)
        sealed = self._ciphers[self.current].encrypt(nonce, plain.encode(), _aad(job_id, field))
        body = binascii.b2a_base64(nonce + sealed, newline=False).decode()
        return f"{PREFIX}{self.current}.{job_id}.{body}"

    def open(self, token: str, job_id: str | None, field: str) -> str:
        """The plain text of `token`, sealed for `job_id` (None: the job it names); SealError
        naming the key id when it cannot be opened."""
        kid, named, body = split(token)
        cipher = self._ciphers.get(kid)
        if cipher is None:
            raise SealError(
                f"a sealed {field} needs key {kid}, which JOBQUEUE['ENCRYPTION_KEYS'] "
                f"no longer lists (listed: {', '.join(self.ids) or 'none'})"
            )
        try:
            raw = binascii.a2b_base64(body, strict_mode=True)
            plain = cipher.decrypt(
                raw[:NONCE_BYTES], raw[NONCE_BYTES:], _aad(named if job_id is None else job_id, field)
            )
        except Exception:  # noqa: BLE001 - InvalidTag, a short body, bad base64: all one answer
            raise SealError(
                f"a sealed {field} (key {kid}) does not open: it was tampered with, or belongs to another job"
            ) from None
        return plain.decode()


def _aad(job_id: str, field: str) -> bytes:
    return f"jobqueue:{job_id}:{field}".encode()


def split(token: str) -> tuple[str, str, str]:
    """(key id, job id, body) of a sealed value."""
    rest = token[len(PREFIX) :]
    kid, _, rest = rest.partition(".")
    named, _, body = rest.rpartition(".")
    return kid, named, body


def is_sealed(value: Any) -> bool:
    return isinstance(value, str) and value.startswith(PREFIX)


def sealed_key(value: Any) -> str | None:
    """The key id a sealed value needs (None: not sealed)."""
    return split(value)[0] if is_sealed(value) else None


_ring: Keyring | None = None


def keyring() -> Keyring:
    """The keyring of the current settings, made once (again after `forget`: conf.reset, as the
    settings change); ConfigurationError when they are malformed. Read from the settings
    themselves, not through conf.py's config: conf.py imports this module (and spec.py
    seals through here)."""
    global _ring
    ring = _ring
    if ring is None:
        from django.conf import settings

        raw = getattr(settings, "JOBQUEUE", None) or {} if settings.configured else {}
        keys = raw.get("ENCRYPTION_KEYS", ()) if isinstance(raw, dict) else ()
        ring = _ring = Keyring(parse_keys(keys))
    return ring


def forget() -> None:
    """Drop the keyring made from the settings (they changed)."""
    global _ring
    _ring = None


# -- values ---------------------------------------------------------------------------------


def seal_json(encoded: str, job_id: str, field: str) -> str:
    """A value given as JSON text, sealed, as JSON text (a JSON string: a sealed value holds no
    character JSON escapes)."""
    return f'"{keyring().seal(encoded, job_id, field)}"'


def open_value(value: Any, job_id: str | None, field: str) -> Any:
    """`value` (as decoded from its JSON) opened when it is sealed, else as it is."""
    if not is_sealed(value):
        return value
    return json.loads(keyring().open(value, job_id, field))


def open_text(value: str, job_id: str, field: str = "error") -> str:
    """Text (an error) opened when it is sealed, else as it is."""
    return keyring().open(value, job_id, field) if is_sealed(value) else value


def seal_payload(payload: dict[str, Any], secret: str, job_id: str) -> str:
    """A payload (handler, args, kwargs, …) as JSON text, with its args and kwargs (`secret`,
    their JSON) sealed under "sealed" in their place."""
    plain = {k: v for k, v in payload.items() if k not in ("args", "kwargs")}
    plain[SEALED] = keyring().seal(secret, job_id, "args")
    return _json(plain)


def open_payload(payload: dict[str, Any], job_id: str) -> tuple[list[Any], dict[str, Any]]:
    """A sealed job's args and kwargs: what a flow spliced in front (opened under their own
    jobs' ids), then its own."""
    secret = _scan(keyring().open(payload[SEALED], job_id, "args"), 0)[0]
    given = [open_slot(value) for value in payload.get("args", ())]
    return [*given, *secret.get("args", ())], secret.get("kwargs", {})


def open_slot(value: Any) -> Any:
    """A value a flow handed a job: a member's sealed result, a chord's list of them, or the
    error object of a member that failed (its sealed error shown as sealed when the engine cut
    it to fit the slot)."""
    if is_sealed(value):
        return open_value(value, None, "result")
    if isinstance(value, list):
        return [open_slot(item) for item in value]
    if isinstance(value, dict) and set(value) == {"error", "state", "job"}:
        # (the engine keeps its last 1000 characters: a long sealed error loses its head, and
        # no longer opens; unlike a plain one, what is left of it holds no space)
        error, job_id = value["error"], value["job"]
        cut = isinstance(error, str) and bool(error) and not is_sealed(error) and " " not in error
        try:
            return {**value, "error": cut_short(job_id) if cut else open_text(error, job_id)}
        except SealError:
            return {**value, "error": cut_short(job_id)}
    return value


def cut_short(job_id: str) -> str:
    """What stands for a sealed error the engine cut to fit (a flow's slot, an attempt's
    history entry): it no longer opens."""
    return f"(a sealed error, cut short to fit: job {job_id}'s last error holds it whole)"


def opened_payload(payload: Any, job_id: str) -> Any:
    """A stored payload with its args and kwargs opened (for `get_job`, the console)."""
    if not isinstance(payload, dict) or SEALED not in payload:
        return payload
    args, kwargs = open_payload(payload, job_id)
    plain = {k: v for k, v in payload.items() if k not in (SEALED, "args")}
    return {**plain, "args": args, "kwargs": kwargs}


def payload_key(payload: Any) -> str | None:
    """The key id a payload's sealed args need (None: not sealed)."""
    if isinstance(payload, dict):
        return sealed_key(payload.get(SEALED))
    return None


def is_sealed_payload(payload: Any) -> bool:
    return isinstance(payload, dict) and SEALED in payload


def reseal(token: str, job_id: str | None, field: str) -> str | None:
    """`token` sealed again under the first key; None when it is under it already."""
    ring = keyring()
    if split(token)[0] == ring.current:
        return None
    named = split(token)[1] if job_id is None else job_id
    return ring.seal(ring.open(token, job_id, field), named, field)


def opened_info(info: JobInfo) -> JobInfo:
    """A sealed job's snapshot with its fields opened; a field that does not open (its key no
    longer listed, a value tampered with, an attempt's error cut short to fit the history)
    stays sealed and is named in `corrupt`."""
    bad: list[str] = []

    def opened(field: str, value: Any, how: Callable[[Any, str, str], Any]) -> Any:
        try:
            return how(value, info.id, field)
        except (JobQueueError, ValueError):
            bad.append(field)
            return value

    history = tuple(
        {**item, "error": _history_error(item.get("error"), info.id)} if isinstance(item, dict) else item
        for item in info.history
    )
    return replace(
        info,
        payload=opened("payload", info.payload, lambda v, i, _: opened_payload(v, i)),
        result=opened("result", info.result, open_value),
        checkpoint=opened("checkpoint", info.checkpoint, open_value),
        progress=opened("progress", info.progress, open_value),
        last_error=opened("error", info.last_error, _open_any_text),
        history=history,
        corrupt=(*info.corrupt, *dict.fromkeys(bad)),
    )


def _history_error(value: Any, job_id: str) -> Any:
    """An attempt's error (its first 500 characters: a sealed one opens only when short)."""
    try:
        return _open_any_text(value, job_id, "error")
    except SealError:
        return cut_short(job_id)


def _open_any_text(value: Any, job_id: str, field: str) -> Any:
    return open_text(value, job_id) if isinstance(value, str) else value


def rebound(payload: str, old_id: str, job_id: str) -> str:
    """A payload whose job got a new id (its minted one was taken): its sealed args, if any,
    sealed for the new id."""
    if f'"{SEALED}":"{PREFIX}' not in payload:
        return payload
    data = json.loads(payload)
    data[SEALED] = keyring().seal(keyring().open(data[SEALED], old_id, "args"), job_id, "args")
    return json.dumps(data, separators=(",", ":"))
