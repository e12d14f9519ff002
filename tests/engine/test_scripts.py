"""Each transition script's header declares its ARGV one per line, and its Python twin
(`engine/scripts/calls.py`, `operator_calls.py`) takes exactly those, in that order: a script and
its twin cannot drift apart unseen. The KEYS side is tests/engine/test_engine.py's.

A header's ARGV lines, right after its KEYS lines: `ARGV[n] name  what it is` for the n-th
argument, `ARGV[n..] name  …` for a run of arguments of its own length from the n-th on (a
count, then per item), `ARGV[..] name  …` for one after such a run; `ARGV: none` for none. A
description may go on over indented lines.
"""

from __future__ import annotations

import inspect
import re

import pytest

from jobqueue.engine import scripts
from jobqueue.engine.scripts import calls, operator_calls  # noqa: F401  (registers the twins)

ARGV_LINE = re.compile(r"^ARGV\[(\d+|\d+\.\.|\.\.)\]\s+(\w+)", re.MULTILINE)
WHERE = {"client", "shard", "queue"}
"""A twin's parameters that say where it runs, not what it sends."""


def header(name: str) -> str:
    return (scripts.HERE / scripts.TRANSITIONS[name]).read_text().split("\n]]", 1)[0]


def declared(name: str) -> list[tuple[str, str]]:
    """(position, name) of each ARGV line of the script's header, checked for order."""
    lines = ARGV_LINE.findall(header(name))
    run = False
    for n, (at, _) in enumerate(lines, start=1):
        if at == "..":
            assert run, f"{name}.lua: ARGV[..] follows no run (ARGV[n..])"
        else:
            assert not run, f"{name}.lua: ARGV[{at}] after a run: write ARGV[..]"
            assert at.removesuffix("..") == str(n), f"{name}.lua: ARGV[{at}] is its {n}-th"
            run = at.endswith("..")
    return lines


def parameters(function: object) -> list[str]:
    """The names of a function's parameters that it sends, in order (keyword-only ones say how
    it is sent)."""
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in inspect.signature(function).parameters.values()  # type: ignore[arg-type]
            if p.kind in kinds and p.name not in WHERE]


def test_every_script_has_a_twin_and_every_twin_a_script() -> None:
    assert set(calls.TWINS) == set(scripts.TRANSITIONS)


@pytest.mark.parametrize("name", sorted(scripts.TRANSITIONS))
def test_each_header_declares_its_argv_one_per_line_after_its_keys(name: str) -> None:
    text = header(name)
    last_key = max(m.end() for m in re.finditer(r"^KEYS\[\d+\][^\n]*(?:\n {8,}[^\n]*)*", text, re.M))
    argv = re.search(r"^ARGV", text, re.M)
    assert argv is not None and text[last_key:argv.start()].strip() == "", (
        f"{name}.lua: its ARGV lines come right after its KEYS lines")
    if not declared(name):
        assert "ARGV: none" in text
    assert not re.search(r"ARGV\[\d+\][^\n]*,\s*ARGV\[", text), f"{name}.lua: one ARGV a line"


@pytest.mark.parametrize("name", sorted(scripts.TRANSITIONS))
def test_each_twin_takes_its_scripts_argv_by_name_in_order(name: str) -> None:
    sent = []
    for parameter in parameters(calls.TWINS[name]):
        if parameter == "head":  # (a head kept between calls: its builder's parameters)
            sent += parameters(calls.HEADS[name])
        else:
            sent.append(parameter)
    assert sent == [argv for _, argv in declared(name)]


@pytest.mark.parametrize("name", sorted(scripts.TRANSITIONS))
def test_each_script_reads_only_the_argv_its_header_declares(name: str) -> None:
    """A fixed position the code reads (`ARGV[3]`) is declared, or lies in a run."""
    body = (scripts.HERE / scripts.TRANSITIONS[name]).read_text().split("\n]]", 1)[1]
    code = re.sub(r"--\[\[.*?\]\]|--[^\n]*", "", body, flags=re.DOTALL)
    used = {int(n) for n in re.findall(r"ARGV\[(\d+)\]", code)}
    fixed = [int(at) for at, _ in declared(name) if at.isdigit()]
    runs = [int(at[:-2]) for at, _ in declared(name) if at.endswith("..") and at != ".."]
    beyond = {n for n in used if n not in fixed and not (runs and n >= runs[0])}
    assert not beyond, f"{name}.lua reads ARGV{sorted(beyond)} its header does not declare"
