"""`runworker --workers N`: N worker processes under one command, so one command uses every core.

The supervisor runs no job itself. It starts N worker children, each with its own claim loop
(the claim script makes sharing queues safe), passes stop signals on, and starts a child again
when it dies (SIGKILL, out of memory, a handler that called `os._exit`). A child that recycled
itself (`--max-jobs`, `--max-memory`: it exits RECYCLE_EXIT, see `recycling.py`) is started
again at once, without the delay a dying child gets (after a short pause when it did so
QUICK_RECYCLES times in a row, each right after its start); `runworker` supervises even one worker
when those are set. In a burst run a child that finished its burst (exit 0) is done; the
supervisor exits 0 once all are.

A child is forked from the supervisor once Django is set up and the handlers are imported, so
it starts where the supervisor stands instead of setting Django up again in a new interpreter.
The supervisor holds nothing a child must not share: it opens no database connection (those
Django opened are closed before a fork) and no Valkey client, and it runs no thread of its own
(its signal handler only writes to a pipe that its loop reads). When some other thread runs in
it (an application's, started by the settings), a fork could copy a lock that thread holds, so
each child is then started as a new `runworker` process instead.

Children run in their own process group, so a Ctrl-C in a terminal reaches them once (through
the supervisor), not twice (which would be the "release now" second stop), and none outlives
the supervisor, even one killed with SIGKILL: each gets SIGTERM (a drain) when it dies, from the
kernel on Linux (the parent-death signal), elsewhere from a thread of the child's that watches
for it (`watch_parent`). The same holds between a worker and its mirror's process (`fork`).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from .recycling import RECYCLE_EXIT

log = logging.getLogger("jobqueue.worker")
QUICK_DEATH = 5.0
"""A child that dies sooner than this after its start is restarted with a growing delay."""
QUICK_RECYCLE = 1.0
QUICK_RECYCLES = 5
"""Recycles in a row, each sooner than QUICK_RECYCLE seconds after its start, after which a
child is restarted after RECYCLE_PAUSE instead of at once: a restart loop (a limit reached as
the process starts) must not spin. (The worker prevents the loops it can see: see
`recycling.py`; short jobs under a small `--max-jobs` recycle that fast legitimately, so the
pause is short and the count starts again after it.)"""
RECYCLE_PAUSE = 1.0
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def default_workers() -> int:
    """One worker process per core this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


PR_SET_PDEATHSIG = 1
PARENT_WATCHER = "jobqueue-parent-watch"
"""The name of the thread `watch_parent` starts."""


def _die_with_parent() -> bool:
    """In a child: ask the kernel for SIGTERM when its parent dies (Linux's prctl); whether it
    will send one (elsewhere: False, and `fork` watches for it instead)."""
    with contextlib.suppress(OSError, AttributeError):  # (not Linux: no prctl)
        return bool(ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM) == 0)
    return False


def watch_parent(parent: int, every: float = 0.5) -> threading.Thread:
    """Where the kernel sends no parent-death signal: a thread that sends this process SIGTERM
    once `parent` has died (this process is then handed to another parent), within `every`
    seconds. It blocks the stop signals itself, so they reach the thread that waits for them."""
    def watch() -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        while os.getppid() == parent:
            time.sleep(every)
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=watch, name=PARENT_WATCHER, daemon=True)
    thread.start()
    return thread


def forkable() -> bool:
    """Whether this process may fork: no thread runs in it but the caller (and a parent watcher,
    which holds no lock a fork could copy)."""
    return all(thread is threading.current_thread() or thread.name == PARENT_WATCHER
               for thread in threading.enumerate())


class Process(Protocol):
    """What the supervisor uses of a child: `subprocess.Popen`'s, or a forked child's."""

    pid: int

    def poll(self) -> int | None: ...

    def send_signal(self, sig: int) -> None: ...


class Forked:
    """A child forked from the supervisor, seen through `Popen`'s `poll`, `wait` and `send_signal`."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """Its exit code once it has exited (minus the signal that killed it), else None."""
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def wait(self) -> int:
        """Its exit code, once it has exited (minus the signal that killed it)."""
        if self.returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


def fork(run: Callable[[], int], closing: tuple[int, ...] = ()) -> Forked:
    """Run `run` in a forked child, which exits with what it returns and never comes back here;
    `closing`: the supervisor's descriptors, closed in the child."""
    supervisor = os.getpid()
    # Stop signals wait until the child has put the supervisor's handler away.
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    pid = os.fork()
    if pid:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        return Forked(pid)
    code = 1
    try:
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        for fd in closing:
            os.close(fd)
        os.setpgid(0, 0)
        if not _die_with_parent():
            watch_parent(supervisor)
        code = run() if os.getppid() == supervisor else 0  # (else it died before the prctl)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    except BaseException:  # noqa: BLE001 - a child never returns into the supervisor's code
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


@dataclass
class _Child:
    argv: list[str]
    """Its command line, should it be started as a new process."""
    proc: Process | None = None
    started: float = 0.0
    restart_at: float = 0.0
    delay: float = 0.5
    finished: bool = False
    """Exited 0 at the end of a burst, or after a stop: not to be started again."""
    exits: list[int] = field(default_factory=list)
    quick_recycles: int = 0
    """Recycles in a row that came sooner than QUICK_RECYCLE after the start."""


class Supervisor:
    """Keeps N worker processes running until asked to stop (or until their bursts end)."""

    def __init__(self, argvs: list[list[str]], burst: bool,
                 run_child: Callable[[int], int] | None = None) -> None:
        """`argvs`: each child's command line; `run_child(index)`: runs child `index` in a
        forked process (its exit code), or None to start every child from its command line."""
        self.children = [_Child(argv) for argv in argvs]
        self.burst = burst
        self._run_child = run_child
        self._stopping = threading.Event()
        self._signals: tuple[int, int] | None = None

    def request_stop(self) -> None:
        """Pass a stop signal on to every child (the first drains, a second releases at once)."""
        self._stopping.set()
        for child in self.children:
            if child.proc is not None and child.proc.poll() is None:
                child.proc.send_signal(signal.SIGTERM)

    def run(self) -> int:
        """Supervise until every child has finished; 0 unless a burst child never could. SIGTERM
        and SIGINT ask it to stop (`request_stop`)."""
        self._signals = read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        for sig in STOP_SIGNALS:
            # A handler runs between two bytecodes of the main loop, maybe while it signals a
            # child: it only writes a byte, which the loop's wait reads.
            signal.signal(sig, lambda *_: os.write(write_fd, b"!"))
        for index in range(len(self.children)):
            self._start(index)
        while not all(child.finished for child in self.children):
            for index, child in enumerate(self.children):
                self._watch(index, child)
            self._wait(read_fd, 0.1)
        log.info("supervisor: all %d workers stopped", len(self.children))
        return 0

    def _wait(self, read_fd: int, timeout: float) -> None:
        """Up to `timeout` seconds, or until a stop signal (passed on at once)."""
        ready, _, _ = select.select([read_fd], [], [], timeout)
        if ready:
            for _ in os.read(read_fd, 64):
                self.request_stop()

    def _start(self, index: int) -> None:
        child = self.children[index]
        if self._stopping.is_set():
            child.finished = True
            return
        if self._run_child is not None and forkable():
            run_child = self._run_child
            child.proc = fork(lambda: run_child(index), self._signals or ())
        else:
            # (where the kernel has no parent-death signal, a child started this way outlives
            # a supervisor killed with SIGKILL: threads do not survive its exec)
            child.proc = subprocess.Popen(child.argv, process_group=0, preexec_fn=_die_with_parent)
        child.started = time.monotonic()
        log.info("supervisor: worker %d started (pid %d)", index, child.proc.pid)

    def _recycled(self, index: int, child: _Child, pid: int, lived: float) -> None:
        """A child recycled itself: start a fresh one at once (after RECYCLE_PAUSE when it
        was the QUICK_RECYCLES-th quick one in a row)."""
        child.delay = 0.5
        child.quick_recycles = child.quick_recycles + 1 if lived < QUICK_RECYCLE else 0
        if child.quick_recycles >= QUICK_RECYCLES:
            child.quick_recycles = 0
            child.restart_at = time.monotonic() + RECYCLE_PAUSE
            log.warning("supervisor: worker %d recycled itself %d times in a row within %.0fs "
                        "of its start; starting a fresh one in %.0fs", index, QUICK_RECYCLES,
                        QUICK_RECYCLE, RECYCLE_PAUSE)
            return
        log.info("supervisor: worker %d recycled itself (pid %d); starting a fresh one",
                 index, pid)
        self._start(index)

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
        pid, child.proc = child.proc.pid, None
        if self._stopping.is_set() or (self.burst and code == 0):
            child.finished = True
            return
        lived = time.monotonic() - child.started
        if code == RECYCLE_EXIT:
            self._recycled(index, child, pid, lived)
            return
        child.delay = min(child.delay * 2, 30.0) if lived < QUICK_DEATH else 0.5
        child.restart_at = time.monotonic() + child.delay
        log.warning("supervisor: worker %d exited with code %d after %.1fs; restarting in %.1fs",
                    index, code, lived, child.delay)
