"""The worker's own threads (its waiters, heartbeat, progress writer and mirror), started
guarded.

A thread that dies of an error (a bug, or a reply no code expected, such as a garbage hand-off
that only a compromised Valkey writes) stops the worker, which names the thread and logs why;
`Worker.run` then raises. A worker short of a waiter, its heartbeat or its mirror must not go on
looking healthy (the console would list it as serving while it claims less, or renews nothing).

Owns the list of those threads; on a death it sets the worker's stop and wake events, nothing
else.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

log = logging.getLogger("jobqueue.worker")


class Threads:
    """The threads a worker started for itself (not its runners: `runners.py`)."""

    def __init__(self, stop: threading.Event, wake: threading.Event) -> None:
        """`stop` stops the worker's claiming (a graceful stop), `wake` wakes its main loop."""
        self.started: list[threading.Thread] = []
        self.broken: str | None = None
        """The name of the thread whose death stopped the worker, if one did."""
        self._stop, self._wake = stop, wake

    def start(self, target: Any, name: str, *args: Any) -> None:
        """Run `target(*args)` on a thread named jobqueue-`name`, guarded."""
        thread = threading.Thread(target=self._guarded, args=(target, f"jobqueue-{name}", *args),
                                  name=f"jobqueue-{name}", daemon=True)
        thread.start()
        self.started.append(thread)

    def _guarded(self, target: Any, name: str, *args: Any) -> None:
        try:
            target(*args)
        except BaseException:
            self.broken = name
            log.critical("thread %s died: the worker is stopping (its running jobs finish, the "
                         "others are released)", name, exc_info=True)
            self._stop.set()
            self._wake.set()
