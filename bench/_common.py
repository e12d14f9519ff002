"""Shared helpers for the bench scripts: a private valkey-server, Django settings, a table."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


@contextmanager
def valkey(appendonly: bool = False) -> Iterator[str]:
    """A throwaway valkey-server on a free port (AOF everysec when asked), yielding its URL."""
    from jobqueue.embedded import free_port, server_args, wait_until_up

    port = free_port()
    with tempfile.TemporaryDirectory() as data:
        extra = ["--appendonly", "yes", "--appendfsync", "everysec"] if appendonly else []
        proc = subprocess.Popen(server_args(port, Path(data), *extra), stdout=subprocess.DEVNULL)
        try:
            wait_until_up(port)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            proc.terminate()
            proc.wait(10)


def prepare_database(url: str, root: Path = ROOT) -> None:
    """A fresh database at `url` (MySQL/MariaDB: dropped and created again), migrated with the
    settings in this process's environment."""
    if url.startswith("mysql://"):
        name = url.rsplit("/", 1)[1]
        subprocess.run(["mysql", "-uroot", "-h127.0.0.1", "-e",
                        f"DROP DATABASE IF EXISTS {name}; CREATE DATABASE {name} CHARACTER SET utf8mb4"],
                       check=True)
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=root, check=True,
                   env=dict(os.environ))


def compile_checkout(root: Path = ROOT) -> None:
    """Bytecode for the checkout's code and the bench's, as a deploy has it (pip compiles what it
    installs). Run from a checkout with PYTHONDONTWRITEBYTECODE=1 (so no process writes it), each
    worker compiled jobqueue's modules from source at every start: ~35 ms of its start-up's CPU."""
    here = Path(__file__).resolve().parent  # (its own files and apps: not node_modules, not venvs)
    for tree, recurse in ((root / "jobqueue", True), (root / "project", True), (here, False),
                          (here / "benchapp", True), (here / "vtasks_app", True)):
        subprocess.run([sys.executable, "-m", "compileall", "-q", *([] if recurse else ["-l"]),
                        str(tree)], check=True, stdout=subprocess.DEVNULL)


def django_setup(valkey_url: str, database_url: str | None = None) -> None:
    os.environ["VALKEY_URL"] = valkey_url
    if database_url:
        os.environ["DATABASE_URL"] = database_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    import django

    django.setup()


def rate(n: int, fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return n / (time.perf_counter() - started)


def table(title: str, rows: list[tuple[str, float]], unit: str = "jobs/s") -> None:
    print(f"\n{title}")
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"  {name:<{width}}  {value:>12,.0f} {unit}")
