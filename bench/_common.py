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


DEPLOYED = {
    "deploy": "pip install '.[mysql,metrics]' && bench/.venv-deploy/bin/pip uninstall -y jobqueue",
    "vtasks": "pip install 'django-vtasks[valkey]>=3.2,<4' 'valkey-glide>=2.0,<3' 'redis[hiredis]>=7.0,<9'",
}
"""The venvs whose Python runs a system's workers as a deploy has them: only what the system
and the bench's job need (jobqueue's code itself comes from the checkout, PYTHONPATH), not the
development venv's test tools and editable install. That venv has the OpenTelemetry SDK, which
redis-py imports whenever it is installed (~35 ms of every start), and an editable install's
import hook (~17 ms at interpreter start): costs a deploy of either system does not pay. Each is made by
`python3.12 -m venv bench/.venv-<name> && bench/.venv-<name>/bin/<the command>`, run from the
checkout's root."""


def deployed_python(name: str) -> str:
    """The Python of venv `name` (`DEPLOYED`); exits with the command that makes it if absent."""
    python = Path(__file__).resolve().parent / f".venv-{name}" / "bin" / "python"
    if not python.exists():
        sys.exit(f"bench/.venv-{name} is missing; from the checkout's root: python3.12 -m venv "
                 f"bench/.venv-{name} && bench/.venv-{name}/bin/{DEPLOYED[name]}")
    return str(python)


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
