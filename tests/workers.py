"""Run the real `manage.py runworker` in a subprocess, against the test's Valkey and database."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.db import connection

ROOT = Path(__file__).resolve().parent.parent
OWNER = f"JOBQUEUE_TEST_OWNER={os.getpid()}"
"""In the environment of every worker this test process starts, and so of the processes they fork
(a worker's mirror, a pool's processes): `end_leftovers` finds them by it."""
_started = False


def database_url() -> str:
    """The URL of the test database this test process uses, for a subprocess to share."""
    s = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{s['NAME']}"
    scheme, port = {"mysql": ("mysql", 3306), "postgresql": ("postgres", 5432)}[connection.vendor]
    password = f":{s['PASSWORD']}" if s.get("PASSWORD") else ""
    return f"{scheme}://{s['USER']}{password}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or port}/{s['NAME']}"


def start_worker(valkey_url: str, *args: str, db_url: str | None = None,
                 log: Path | None = None, env: dict[str, str] | None = None,
                 new_session: bool = False) -> subprocess.Popen[bytes]:
    """`runworker` with these arguments; `new_session`: in a process group of its own, as a
    terminal or a process manager starts it (the group's id is the worker's pid)."""
    global _started
    _started = True
    owner, pid = OWNER.split("=")
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="tests.settings", VALKEY_URL=valkey_url,
               DATABASE_URL=db_url or database_url(), PYTHONUNBUFFERED="1", **{owner: pid},
               **(env or {}))
    if "--workers" not in args:  # one process unless the test asks for more (default: per core)
        args = ("--workers", "1", *args)
    command = [sys.executable, "manage.py", "runworker", *args]
    if log is None:
        return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.STDOUT, start_new_session=new_session)
    with open(log, "ab") as out:
        return subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=new_session)


def run_burst(valkey_url: str, *args: str, timeout: float = 120, **kw: object) -> int:
    proc = start_worker(valkey_url, "--burst", *args, **kw)  # type: ignore[arg-type]
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()  # a failed test leaves no worker behind
        proc.wait()
        raise


def _leftovers() -> list[int]:
    """The live processes (not zombies) whose environment holds `OWNER`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            if OWNER.encode() in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except (OSError, IndexError):  # (it ended meanwhile, or is not ours to read)
            continue
    return found


def end_leftovers(timeout: float = 15) -> list[int]:
    """After a test that started workers: wait until every process they started has ended (a
    SIGKILLed worker's mirror ends on its own, after a last pass that writes rows), then SIGKILL
    what is left. A test's database is emptied after it: nothing may write there later. Gives
    the processes it had to kill."""
    global _started
    if not _started or not Path("/proc/self/environ").exists():
        return []
    _started = False
    deadline = time.monotonic() + timeout
    while (left := _leftovers()) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return left


def wait_for(condition: Callable[[], object], timeout: float = 30, every: float = 0.02) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {condition}")
        time.sleep(every)


def stop_twice(proc: subprocess.Popen[bytes], log: Path) -> None:
    """SIGTERM (drain), then, once the worker's log shows it took that one, SIGTERM again
    (release now)."""
    proc.send_signal(signal.SIGTERM)
    wait_for(lambda: "stop requested" in log.read_text())
    proc.send_signal(signal.SIGTERM)


def dead_job(payload_arg: object, error: str) -> str:
    """A job on `default` that ran once and died with `error`, as a failing handler leaves it."""
    from jobqueue import Queue
    from tests.jobapp import jobs

    ref = jobs.always_fails.using(max_attempts=1).enqueue(payload_arg)
    queue = Queue("default")
    [lease] = queue.dequeue(count=1)
    queue.nack(lease, error)
    return ref.id


def manage(*args: str, url: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run a manage.py command against `url` and the test database (`env`: more variables for
    tests/settings.py); its output as text."""
    env = {"DJANGO_SETTINGS_MODULE": "tests.settings", "VALKEY_URL": url,
           "DATABASE_URL": database_url(), "PATH": "/usr/bin:/bin", **(env or {})}
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


def serving(request: Any, settings: Any, queues: dict[str, Any]) -> str:
    """The Valkey URL a worker test and its workers use (the standalone server, or the cluster
    flushed, as `request.param` says), with `queues` configured for the test."""
    from jobqueue import Queue

    where = request.getfixturevalue("valkey_server").url
    if request.param == "cluster":
        where = request.getfixturevalue("valkey_cluster").url
    settings.JOBQUEUE = {"URL": where, "QUEUES": {"default": {}, **queues}}
    if request.param == "cluster":
        Queue("default").client.flushall(target_nodes="primaries")
    return where
