"""Loads the transition scripts: one Lua file per transition, `_common.lua` prepended.

Each file's header declares its KEYS (`KEYS[n] name TYPE …`); `keys_for` builds exactly that list
for a shard, so a wrapper can never pass a key its script does not declare.
"""

from __future__ import annotations

import re
import weakref
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from ..keys import ShardKeys

HERE = Path(__file__).parent
TRANSITIONS = {
    "enqueue": "enqueue.lua",
    "claim": "claim.lua",
    "ack": "ack.lua",
    "nack": "nack.lua",
    "extend": "extend.lua",
    "checkpoint": "checkpoint.lua",
    "release": "release.lua",
    "reap": "reap.lua",
    "promote": "promote.lua",
    "retry": "retry.lua",
    "reprioritize": "reprioritize.lua",
    "cancel": "cancel.lua",
    "counts": "counts.lua",
    "heads": "heads.lua",
}
_KEY_LINE = re.compile(r"^KEYS\[(\d+)\]\s+(\w+)", re.MULTILINE)


@dataclass(frozen=True)
class ScriptSource:
    """A transition's Lua text and the key names its header declares, in order."""

    name: str
    text: str
    key_names: tuple[str, ...]

    def keys_for(self, shard: ShardKeys) -> list[str]:
        return [shard.base if k == "base" else shard.key(k) for k in self.key_names]


@cache
def source(name: str) -> ScriptSource:
    """Read and check one transition script (cached per process)."""
    body = (HERE / TRANSITIONS[name]).read_text()
    declared = _KEY_LINE.findall(body)
    if [int(n) for n, _ in declared] != list(range(1, len(declared) + 1)):
        raise RuntimeError(f"{name}.lua: KEYS in its header must be numbered 1…n")
    text = (HERE / "_common.lua").read_text() + "\n" + body
    return ScriptSource(name, text, tuple(k for _, k in declared))


@cache
def keys_for(name: str, shard: ShardKeys) -> tuple[str, ...]:
    """The KEYS a transition takes on a shard (cached: the hot path builds none per call)."""
    return tuple(source(name).keys_for(shard))


_registered: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


def script(client: Any, name: str) -> Any:
    """The redis-py Script for `name` on `client`: called by SHA, loaded again on NOSCRIPT."""
    per_client = _registered.setdefault(client, {})
    if name not in per_client:
        per_client[name] = client.register_script(source(name).text)
    return per_client[name]
