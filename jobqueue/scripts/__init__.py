"""Loads the transition scripts: one Lua file per transition, the helpers it uses from
`_common.lua` prepended.

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
_DEFINITION = re.compile(r"^(?:--[^\n]*\n)*local (?:function )?(\w+)", re.MULTILINE)
"""A top-level definition of `_common.lua`, with the comment lines right above it."""
_COMMENT = re.compile(r"--\[\[.*?\]\]|--[^\n]*", re.DOTALL)
_NAME = re.compile(r"[A-Za-z_]\w*")


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
    return ScriptSource(name, _helpers_for(body) + "\n" + body, tuple(k for _, k in declared))


def _helpers_for(body: str) -> str:
    """The top-level definitions of `_common.lua` that `body` uses, directly or through each
    other, in their order there: every definition a script carries is work at each call (a
    closure or a table made, then collected), ~0.4 µs each on the server."""
    common = (HERE / "_common.lua").read_text()
    starts = [m.start() for m in _DEFINITION.finditer(common)]
    pieces = [common[a:b] for a, b in zip(starts, [*starts[1:], len(common)], strict=True)]
    defined = {_DEFINITION.match(piece)[1]: piece for piece in pieces}  # type: ignore[index]
    wanted: set[str] = set()
    todo = [body]
    while todo:
        for used in set(_NAME.findall(_COMMENT.sub("", todo.pop()))) & defined.keys() - wanted:
            wanted.add(used)
            todo.append(defined[used])
    return "".join(piece for name, piece in defined.items() if name in wanted)


@cache
def keys_for(name: str, shard: ShardKeys) -> tuple[str, ...]:
    """The KEYS a transition takes on a shard (cached: the hot path builds none per call)."""
    return tuple(source(name).keys_for(shard))


_registered: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


def script(client: Any, name: str) -> Any:
    """The redis-py Script for `name` on `client`: called by SHA, loaded again on NOSCRIPT."""
    per_client = _registered.get(client)  # (setdefault would make a weak reference per call)
    if per_client is None:
        per_client = _registered.setdefault(client, {})
    if name not in per_client:
        per_client[name] = client.register_script(source(name).text)
    return per_client[name]
