"""`runworker --workers N` killed with SIGKILL: its children, and their mirrors' processes, stop
(on Linux by the kernel's parent-death signal; elsewhere by a thread that watches the parent,
tried here on its own since this kernel has the signal)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from jobqueue import Queue
from tests.servers import ValkeyProcess
from tests.workers import ROOT, start_worker, wait_for


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


@pytest.mark.django_db(transaction=True)
def test_the_workers_and_their_mirrors_stop_when_the_supervisor_is_killed(
        valkey_server: ValkeyProcess) -> None:
    queue = Queue("default")
    supervisor = start_worker(valkey_server.url, "--workers", "2", "--concurrency", "1")
    try:
        wait_for(lambda: queue.client.hlen("{emq}:workers") == 2)
        workers = [json.loads(row)["pid"] for row in queue.client.hvals("{emq}:workers")]
        wait_for(lambda: all(children(pid) for pid in workers))  # each one's mirror
        mirrors = [mirror for pid in workers for mirror in children(pid)]
        assert len(mirrors) == 2
    finally:
        supervisor.kill()
        supervisor.wait()
    wait_for(lambda: not any(alive(pid) for pid in workers + mirrors), timeout=30)
    assert queue.client.hlen("{emq}:workers") == 0  # each drained and said goodbye


WATCHED = textwrap.dedent("""
    import os, signal, sys, time
    from jobqueue.worker.supervisor import watch_parent

    marker = sys.argv[1]
    if os.fork() == 0:  # the child: stops on SIGTERM, which only the watcher sends
        signal.signal(signal.SIGTERM, lambda *_: (open(marker, "w").write("stopped"), os._exit(0)))
        watch_parent(os.getppid(), every=0.05)
        print(os.getpid(), flush=True)
        while True:  # (the child idles until the watcher stops it: nothing to wait for)
            time.sleep(1)
    signal.pause()
""")


def test_where_the_kernel_sends_no_parent_death_signal_a_thread_watches_the_parent(
        tmp_path: Path) -> None:
    marker = tmp_path / "stopped"
    parent = subprocess.Popen([sys.executable, "-c", WATCHED, str(marker)], cwd=ROOT,
                              stdout=subprocess.PIPE, env=dict(os.environ))
    assert parent.stdout is not None
    child = int(parent.stdout.readline() or 0)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    try:
        assert child and not marker.exists()
        wait_for(lambda: marker.exists() and not alive(child), timeout=10)
        assert marker.read_text() == "stopped"
    finally:
        if child and alive(child):
            os.kill(child, signal.SIGKILL)  # a failed test leaves nothing behind


def test_a_child_that_keeps_recycling_at_once_is_restarted_with_a_delay() -> None:
    """A recycle is restarted at once, but not a child whose every process recycles as soon
    as it starts (a limit it reaches at start-up): after a few such in a row it pauses."""
    from jobqueue.worker.supervisor import QUICK_RECYCLES, Supervisor

    supervisor = Supervisor([[sys.executable, "-c", "raise SystemExit(75)"]], burst=False)
    child = supervisor.children[0]
    supervisor._start(0)
    for _ in range(QUICK_RECYCLES - 1):
        proc = child.proc
        wait_for(lambda proc=proc: proc is not None and proc.poll() is not None)
        supervisor._watch(0, child)
        assert child.proc is not None and child.proc is not proc  # started again at once
    wait_for(lambda: child.proc is not None and child.proc.poll() is not None)
    supervisor._watch(0, child)
    assert child.proc is None and child.restart_at > time.monotonic()
