"""`runworker --workers N`: N worker processes under one command, so one command uses every core.

The supervisor runs no job itself. It starts N `runworker` children, each with its own claim
loop (the claim script makes sharing queues safe), passes stop signals on, and starts a child
again when it dies (SIGKILL, out of memory, a handler that called `os._exit`). In a burst run a
child that finished its burst (exit 0) is done; the supervisor exits 0 once all are.

Children run in their own process group, so a Ctrl-C in a terminal reaches them once (through
the supervisor), not twice (which would be the "release now" second stop), and each asks the
kernel for SIGTERM should the supervisor die, so none outlives it.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field

log = logging.getLogger("jobqueue.worker")
QUICK_DEATH = 5.0
"""A child that dies sooner than this after its start is restarted with a growing delay."""


def default_workers() -> int:
    """One worker process per core this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the supervisor dies (Linux prctl PDEATHSIG)."""
    # Not Linux: no prctl, and a child outlives a supervisor killed with SIGKILL.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


@dataclass
class _Child:
    argv: list[str]
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    restart_at: float = 0.0
    delay: float = 0.5
    finished: bool = False
    """Exited 0 at the end of a burst, or after a stop: not to be started again."""
    exits: list[int] = field(default_factory=list)


class Supervisor:
    """Keeps N worker processes running until asked to stop (or until their bursts end)."""

    def __init__(self, argvs: list[list[str]], burst: bool) -> None:
        self.children = [_Child(argv) for argv in argvs]
        self.burst = burst
        self._stopping = threading.Event()
        self._lock = threading.Lock()

    def request_stop(self) -> None:
        """Pass a stop signal on to every child (the first drains, a second releases at once)."""
        self._stopping.set()
        with self._lock:
            for child in self.children:
                if child.proc is not None and child.proc.poll() is None:
                    child.proc.send_signal(signal.SIGTERM)

    def run(self) -> int:
        """Supervise until every child has finished; 0 unless a burst child never could."""
        for index in range(len(self.children)):
            self._start(index)
        while not all(child.finished for child in self.children):
            for index, child in enumerate(self.children):
                self._watch(index, child)
            self._stopping.wait(0.1)
        log.info("supervisor: all %d workers stopped", len(self.children))
        return 0

    def _start(self, index: int) -> None:
        child = self.children[index]
        with self._lock:
            if self._stopping.is_set():
                child.finished = True
                return
            child.proc = subprocess.Popen(child.argv, process_group=0, preexec_fn=_die_with_parent)
            child.started = time.monotonic()
        log.info("supervisor: worker %d started (pid %d)", index, child.proc.pid)

    def _watch(self, index: int, child: _Child) -> None:
        if child.finished:
            return
        if child.proc is None:  # waiting to be restarted
            if time.monotonic() >= child.restart_at:
                self._start(index)
            return
        code = child.proc.poll()
        if code is None:
            return
        child.exits.append(code)
        child.proc = None
        if self._stopping.is_set() or (self.burst and code == 0):
            child.finished = True
            return
        lived = time.monotonic() - child.started
        child.delay = min(child.delay * 2, 30.0) if lived < QUICK_DEATH else 0.5
        child.restart_at = time.monotonic() + child.delay
        log.warning("supervisor: worker %d exited with code %d after %.1fs; restarting in %.1fs",
                    index, code, lived, child.delay)
