"""The package's shape, read from its code: each room (a folder of `jobqueue/`) imports only the
rooms to its left, and the few rules the rooms keep (jobqueue/__init__.py draws the order).

Imports are read with `ast`, lazy ones inside functions included: a lazy import is still a
dependency. Imports under `if TYPE_CHECKING:` are left out (they name a type, and load nothing).
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Iterator
from pathlib import Path

from tests.worker.test_worker_startup import NOT_FOR_A_WORKER

from .workers import ROOT

PACKAGE = ROOT / "jobqueue"
ORDER = ("leaves", "models", "engine", "flows", "history", "api", "operations", "worker", "console",
         "anchors")
"""The rooms, each importing only those before it."""
ROOMS = ("engine", "flows", "history", "api", "operations", "worker", "console")
"""The rooms that are folders: a module's room is its folder."""
LEAVES = {"_compat", "exceptions", "states", "signals", "ids", "keys", "records", "options", "spec", "cron",
          "grants", "sealing", "conf", "embedded", "tracing", "collector", "debug"}
"""Top-level modules every room may import."""
ANCHORS = {"jobqueue", "apps", "admin", "urls", "metrics", "tasks", "contrib", "management",
           "templatetags"}
"""What Django, settings strings or the docs name by path (a top-level module, or a folder)."""
SCRIPTS = "jobqueue.engine.scripts"


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a folder's `__init__` by the folder's)."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        if "migrations" in path.parts:
            continue
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def room(module: str) -> str:
    """The room a module belongs to; a module no room claims fails the test that asks."""
    parts = module.split(".")
    if len(parts) == 1:
        return "anchors"
    if parts[1] in ROOMS:
        return parts[1]
    if parts[1] == "models":
        return "models"
    if len(parts) == 2 and parts[1] in LEAVES:
        return "leaves"
    if parts[1] in ANCHORS:
        return "anchors"
    raise AssertionError(f"{module} is in no room: put it in a folder, or name it a leaf or anchor")


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node, but those under `if TYPE_CHECKING:`."""
    for child in ast.iter_child_nodes(tree):
        if isinstance(child, ast.If) and _type_checking(child):
            yield from (n for part in child.orelse for n in [part, *_nodes(part)])
            continue
        yield child
        yield from _nodes(child)


def imports(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that `module` imports (`from x import y` names y when y is a
    module, else x)."""
    base = module.split(".") + (["_"] if path.name == "__init__.py" else [])
    found = set()
    for node in _nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                head = ".".join(base[: len(base) - node.level])
                target = f"{head}.{node.module}" if node.module else head
            else:
                target = node.module or ""
            subs = [f"{target}.{alias.name}" for alias in node.names]
            found.update(sub for sub in subs if sub in known)
            if any(sub not in known for sub in subs):
                found.add(target)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name in known and name != module}


def test_each_module_imports_only_its_own_room_and_the_rooms_before_it() -> None:
    known = modules()
    backward = [f"{module} ({room(module)}) imports {target} ({room(target)})"
                for module, path in sorted(known.items())
                for target in sorted(imports(module, path, known))
                if ORDER.index(room(target)) > ORDER.index(room(module))]
    assert backward == []


def test_a_rooms_init_imports_nothing() -> None:
    """Importing one module of a room must not load the whole room (a worker would load the
    console's or the metrics' modules). `flows` names the three functions the docs call, and
    `worker` its public names."""
    known = modules()
    loading = {folder: sorted(imports(f"jobqueue.{folder}", known[f"jobqueue.{folder}"], known))
               for folder in ROOMS}
    assert loading.pop("flows") == ["jobqueue.flows.members"]
    loading.pop("worker")
    assert {folder: names for folder, names in loading.items() if names} == {}


def test_only_the_engines_scripts_call_valkeys_scripts() -> None:
    known = modules()
    calling = []
    for module, path in sorted(known.items()):
        if module.startswith(SCRIPTS):
            continue
        if f"{SCRIPTS}.caller" in imports(module, path, known):
            calling.append(f"{module} imports the caller")
        text = path.read_text()
        calling += [f"{module} calls {what}" for what in ("register_script", "evalsha") if what in text]
    assert calling == []


def test_no_function_writes_the_state_of_what_it_is_given() -> None:
    """A module-level function that assigns to an attribute of a parameter does a class's work
    outside it: the class should own the change."""
    writes = []
    for module, path in sorted(modules().items()):
        for node in ast.parse(path.read_text()).body:
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            given = {arg.arg for arg in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs)}
            for inner in ast.walk(node):
                targets = (inner.targets if isinstance(inner, ast.Assign) else
                           [inner.target] if isinstance(inner, (ast.AugAssign, ast.AnnAssign)) else [])
                writes += [f"{module}.{node.name} sets {target.value.id}.{target.attr}"
                           for target in targets if isinstance(target, ast.Attribute)
                           and isinstance(target.value, ast.Name) and target.value.id in given]
    assert writes == []


def test_no_argv_built_outside_the_twins_and_no_class_name_in_two_modules() -> None:
    found = []
    defined: dict[str, list[str]] = {}
    for module, path in sorted(modules().items()):
        tree = ast.parse(path.read_text())
        found += [f"{module}:{node.lineno} calls .argv(" for node in ast.walk(tree)
                  if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and node.func.attr == "argv"]
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and not module.startswith("jobqueue.management"):
                defined.setdefault(node.name, []).append(module)
    found += [f"{name} is defined in {where}" for name, where in sorted(defined.items()) if len(where) > 1]
    assert found == []


def test_every_module_a_worker_must_not_load_exists() -> None:
    """Else a rename makes test_worker_startup pass without testing anything."""
    missing = [name for name in NOT_FOR_A_WORKER if importlib.util.find_spec(name) is None]
    assert missing == []
