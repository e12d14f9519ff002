"""The loader of the transition scripts (jobqueue/engine/scripts/__init__.py): every helper a
script or a helper uses is declared on a `-- uses:` line and every one declared is used, each
script carries what it uses and nothing more, each definition after the ones it uses, and no
script takes as a KEY what it derives from its base key."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from jobqueue.engine import scripts

HEADER = "--[[ t: a script\nKEYS[1] base prefix\nARGV: none\nReturns: 1\n]]\n"


def write(folder: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder


HELPERS = {
    "_a.lua": "--[[ _a: f and g ]]\n\n-- f\nlocal function f() return 1 end\n\n"
              "-- g calls f\n-- uses: f\nlocal function g() return f() + 1 end\n\n"
              "local K = {'f'}  -- (a string: no use)\n",
    "_b.lua": "--[[ _b: h ]]\n\n-- uses: g\nlocal function h() return g() * 2 end\n",
}


def test_a_script_carries_what_it_uses_through_each_other_each_after_what_it_uses(
        tmp_path: Path) -> None:
    defined = scripts.helpers(write(tmp_path, HELPERS))
    assert defined["g"].uses == ("f",) and defined["h"].file == "_b.lua"
    text = scripts.carried(HEADER + "-- uses: h\nreturn h() -- not f()\n", "t.lua", defined)
    assert re.findall(r"^local (?:function )?(\w+)", text, re.M) == ["f", "g", "h"]  # not K


@pytest.mark.parametrize(("files", "message"), [
    ({"_a.lua": "local function f() return 1 end\nlocal function g() return f() end\n"},
     "_a.lua: g uses f without declaring it"),
    ({"_a.lua": "local function f() return 1 end\n-- uses: f\nlocal function g() return 2 end\n"},
     "_a.lua: g declares f on its `-- uses:` line but does not use it"),
    ({"_a.lua": "-- uses: nothing_here\nlocal function g() return 2 end\n"},
     "_a.lua: g declares 'nothing_here', which no helper file defines"),
    ({"_a.lua": "local function f() return 1 end\n", "_b.lua": "local f = 2\n"},
     "_b.lua: f is defined in _a.lua too"),
])
def test_a_helper_file_that_misdeclares_its_uses_is_refused(
        tmp_path: Path, files: dict[str, str], message: str) -> None:
    with pytest.raises(RuntimeError, match=re.escape(message)):
        scripts.helpers(write(tmp_path, files))


@pytest.mark.parametrize(("code", "message"), [
    ("return g()\n", "t.lua: the script uses g without declaring it"),
    ("-- uses: g, f\nreturn g()\n", "t.lua: the script declares f on its `-- uses:` line but "
                                    "does not use it"),
    ("-- uses: g\nreturn g() + f()\n", "t.lua: the script uses f without declaring it"),
])
def test_a_script_that_misdeclares_its_uses_is_refused(tmp_path: Path, code: str,
                                                       message: str) -> None:
    defined = scripts.helpers(write(tmp_path, HELPERS))
    with pytest.raises(RuntimeError, match=re.escape(message)):
        scripts.carried(HEADER + code, "t.lua", defined)


def test_every_helper_file_says_what_it_owns_and_every_helper_is_used() -> None:
    used: set[str] = set()
    for name in scripts.TRANSITIONS:
        used |= set(re.findall(r"^local (?:function )?(\w+)", scripts.source(name).text, re.M))
    assert set(scripts.helpers()) <= used
    for path in scripts.HERE.glob("_*.lua"):
        assert path.read_text().startswith(f"--[[ {path.stem}: "), path.name


@pytest.mark.parametrize("name", sorted(scripts.TRANSITIONS))
def test_every_script_loads_and_compiles(name: str, valkey: Any) -> None:
    source = scripts.source(name)
    loaded = valkey.script_load(source.text)
    assert loaded == source.sha


@pytest.mark.parametrize("name", sorted(scripts.TRANSITIONS))
def test_no_script_takes_as_a_key_what_it_derives_from_its_base(name: str) -> None:
    src = scripts.source(name)
    code = scripts._UNCODE.sub(" ", src.text)
    derived = {part.strip(":") for part in re.findall(r"\bbase \.\. '(:\w+)'", code)}
    assert not derived & set(src.key_names), f"{name}.lua: passed and derived from base"
