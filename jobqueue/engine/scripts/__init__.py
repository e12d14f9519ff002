"""Loads the transition scripts: one Lua file per transition, the helpers it uses prepended.
`caller` sends them.

Each file's header declares its KEYS (`KEYS[n] name TYPE …`); `ScriptSource.keys_for` builds
exactly that list for a shard, and the caller passes only that list, so a wrapper can never pass
a key its script does not declare.

The helpers live in the files named `_<concern>.lua` (_keys, _fields, _lanes, _counters, _flows,
_finish, _ack, _operator), each a list of top-level definitions (`local function f`, `local F`)
with the comment lines right above each. Uses are declared: a script on the line(s) right after
its header's `]]`, a definition on the last comment line(s) right above it, as
`-- uses: a, b` (none: no such line). The loader refuses a helper used and not declared, or
declared and not used, naming the file and the helper, and prepends to each script what it
uses, directly or through each other, each after what it uses.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import cache, cached_property
from pathlib import Path

from ...keys import ShardKeys

HERE = Path(__file__).parent
TRANSITIONS = {
    "enqueue": "enqueue.lua",
    "claim": "claim.lua",
    "ack": "ack.lua",
    "nack": "nack.lua",
    "nack_many": "nack_many.lua",
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
    "set_lane_concurrency": "set_lane_concurrency.lua",
    "flow": "flow.lua",
    "deliver": "deliver.lua",
    "watch": "watch.lua",
    "progress": "progress.lua",
    "batch": "batch.lua",
    "permits": "permits.lua",
    "reseal": "reseal.lua",
}
_KEY_LINE = re.compile(r"^KEYS\[(\d+)\]\s+(\w+)", re.MULTILINE)
_DEFINITION = re.compile(r"^((?:--[^\n]*\n)*)local (?:function )?(\w+)", re.MULTILINE)
"""A top-level definition of a helper file, with the comment lines right above it."""
_USES = re.compile(r"^-- uses:(.*)$")
_UNCODE = re.compile(r"--\[\[.*?\]\]|--[^\n]*|'(?:\\.|[^'\\\n])*'|"
                     r'"(?:\\.|[^"\\\n])*"', re.DOTALL)
"""Comments and string literals: no name in them is a use."""
_NAME = re.compile(r"[A-Za-z_]\w*")


@dataclass(frozen=True)
class ScriptSource:
    """A transition's Lua text and the key names its header declares, in order."""

    name: str
    text: str
    key_names: tuple[str, ...]

    def keys_for(self, shard: ShardKeys) -> list[str]:
        return [shard.base if k == "base" else shard.key(k) for k in self.key_names]

    @cached_property
    def sha(self) -> str:
        """What EVALSHA names it by: the SHA-1 of its text, as the server computes it."""
        return hashlib.sha1(self.text.encode()).hexdigest()


@dataclass(frozen=True)
class Helper:
    """One top-level definition of a helper file: its text (comment lines included) and the
    helpers it declares it uses."""

    name: str
    file: str
    text: str
    uses: tuple[str, ...]


@cache
def source(name: str) -> ScriptSource:
    """Read and check one transition script (cached per process)."""
    body = (HERE / TRANSITIONS[name]).read_text()
    declared = _KEY_LINE.findall(body)
    if [int(n) for n, _ in declared] != list(range(1, len(declared) + 1)):
        raise RuntimeError(f"{name}.lua: KEYS in its header must be numbered 1…n")
    return ScriptSource(name, carried(body, TRANSITIONS[name], helpers()) + "\n" + body,
                        tuple(k for _, k in declared))


def _declared(lines: list[str]) -> list[str]:
    """The names on `-- uses:` lines."""
    names = []
    for line in lines:
        found = _USES.match(line)
        names += [n.strip() for n in found[1].split(",") if n.strip()] if found else []
    return names


def _checked(where: str, what: str, code: str, uses: list[str], known: set[str]) -> tuple[str, ...]:
    """`uses` as `code` bears it out: every helper it names declared, every one declared named."""
    used = set(_NAME.findall(_UNCODE.sub(" ", code))) & known - {what}
    for name in uses:
        if name not in known:
            raise RuntimeError(f"{where}: {what} declares {name!r}, which no helper file defines")
    if undeclared := sorted(used - set(uses)):
        raise RuntimeError(f"{where}: {what} uses {', '.join(undeclared)} without declaring it "
                           "on a `-- uses:` line")
    if unused := sorted(set(uses) - used):
        raise RuntimeError(f"{where}: {what} declares {', '.join(unused)} on its `-- uses:` "
                           "line but does not use it")
    return tuple(uses)


@cache
def helpers(folder: Path = HERE) -> dict[str, Helper]:
    """Every definition of the helper files (`_*.lua`) in `folder`, its uses checked (cached
    per process)."""
    found: dict[str, tuple[str, str, list[str]]] = {}
    for path in sorted(folder.glob("_*.lua")):
        text = path.read_text()
        if text.startswith("--[["):  # (the file's header: what it owns)
            text = text[text.index("]]") + 2:]
        matches = list(_DEFINITION.finditer(text))
        for m, end in zip(matches, [*(m.start() for m in matches[1:]), len(text)], strict=True):
            if m[2] in found:
                raise RuntimeError(f"{path.name}: {m[2]} is defined in {found[m[2]][0]} too")
            comments = m[1].splitlines()
            tail = len(comments)
            while tail and _USES.match(comments[tail - 1]):
                tail -= 1
            found[m[2]] = (path.name, text[m.start():end], _declared(comments[tail:]))
    known = set(found)
    return {name: Helper(name, file, piece,
                         _checked(file, name, piece, uses, known))
            for name, (file, piece, uses) in found.items()}


def carried(body: str, where: str, defined: dict[str, Helper]) -> str:
    """The definitions a script uses, directly or through each other, each after the ones it
    uses: every definition a script carries is work at each call (a closure or a table made,
    then collected), ~0.4 µs each on the server."""
    header_end = body.index("]]\n") + 3 if body.startswith("--[[") else 0
    lines = body[header_end:].splitlines()
    count = next((i for i, line in enumerate(lines) if not _USES.match(line)), len(lines))
    uses = _checked(where, "the script", body[header_end:], _declared(lines[:count]), set(defined))
    order: list[str] = []
    visiting: set[str] = set()

    def visit(name: str) -> None:
        if name in order:
            return
        if name in visiting:
            raise RuntimeError(f"{defined[name].file}: {name} uses itself through {sorted(visiting)}")
        visiting.add(name)
        for used in defined[name].uses:
            visit(used)
        visiting.discard(name)
        order.append(name)

    for name in uses:
        visit(name)
    return "".join(defined[name].text for name in order)
