"""`runworker --max-jobs N` and `--max-memory MB`: when a worker process has done its share, or
grown too big, it makes way for a fresh one (leaky handlers: image libraries, ML models, ORM
caches).

The policy lives here, in `Recycler`, which the claim asks before each claim how much room is
left (`Claims.recycler`; None, and so no cost, without the flags):

- `--max-jobs N`: the worker claims at most N jobs (hand-offs included), so it never holds
  more than it will run; once they have all finished, it is due.
- `--max-memory MB`: before each claim the process's resident memory is read (on Linux from
  /proc, a few microseconds); past the limit the worker is due at once (once it has taken a
  job: each process runs one at least, so a limit below a process's start cannot make a loop).

A worker that is due trips its recycle (`Worker.recycle`): it stops claiming as a stop signal
would, hands back its prefetched jobs uncharged, finishes what runs within `--grace`, counts
the recycle (`presence.recycled`: the metrics and the console read it) and exits RECYCLE_EXIT;
the supervisor (`supervisor.py`), which `runworker` puts over every worker when a limit is set
(also with `--workers 1`), starts a fresh one at once. Under `--processes` the pool processes
are held to `--max-memory` too: one past it after a job is replaced (`pool.py`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import sys
from collections.abc import Callable

from ..exceptions import ConfigurationError

log = logging.getLogger("jobqueue.worker")
RECYCLE_EXIT = 75
"""The exit code of a worker that recycled itself (EX_TEMPFAIL): start a fresh one at once."""
MEMORY_FLOOR_MB = 64
"""The least `--max-memory` accepted: about what a worker process needs to start (Python,
Django, the handlers); below it a worker would recycle after every job."""
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_bytes(pid: int | None = None) -> int | None:
    """The resident memory of process `pid` (None: this one), in bytes. From /proc on Linux;
    elsewhere this process's peak (getrusage), and None for another process."""
    try:
        with open(f"/proc/{pid or 'self'}/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None if pid is not None else _peak()


def _peak() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # (bytes on macOS, else KiB)


class Resident:
    """This process's resident memory, read before each claim: through /proc/<pid>/statm kept
    open, a read is one `pread` (~4 µs; opening the file each time cost 30–70 µs on a busy
    2-core VM). Opened again in a forked child (another pid). Without /proc: the peak."""

    def __init__(self) -> None:
        self._pid, self._fd = 0, -1

    def bytes(self) -> int:
        if os.getpid() != self._pid:
            self._reopen()
        if self._fd >= 0:
            try:
                return int(os.pread(self._fd, 128, 0).split()[1]) * _PAGE
            except (OSError, ValueError, IndexError):
                pass
        return _peak()

    def _reopen(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # (the parent's, copied by a fork)
        self._pid, self._fd = os.getpid(), -1
        with contextlib.suppress(OSError):  # (no /proc: the peak instead)
            self._fd = os.open(f"/proc/{self._pid}/statm", os.O_RDONLY)


def over(limit_mb: int, pid: int | None = None) -> int | None:
    """The resident MB of `pid` (None: this process) when it is past `limit_mb`, else None."""
    rss = resident_bytes(pid)
    return rss >> 20 if rss is not None and rss > limit_mb << 20 else None


class Recycler:
    """When this worker is due to make way for a fresh one (see the module's docstring). Read
    and written under the claim lock; `trip` is the worker's, called once when it is due."""

    def __init__(self, max_jobs: int | None, max_memory: int | None,
                 trip: Callable[[str, str], None]) -> None:
        """`max_memory` in MB; `trip(reason, why)` stops the worker for a recycle."""
        self.max_jobs, self.max_memory = max_jobs, max_memory
        self.taken = 0
        """Jobs claimed or handed over so far."""
        self.reason: str | None = None
        """Why it recycles ("max_jobs", "max_memory"), once due."""
        self._trip = trip
        self._resident = Resident() if max_memory is not None else None
        self._limit = (max_memory or 0) << 20

    @classmethod
    def of(cls, max_jobs: int | None, max_memory: int | None,
           trip: Callable[[str, str], None]) -> Recycler | None:
        """A recycler for these limits; None when neither is set (the worker pays nothing)."""
        if max_jobs is None and max_memory is None:
            return None
        return cls(max_jobs, max_memory, trip)

    def room(self, room: int, held: int) -> int:
        """The room a claim may fill: `room`, within what `--max-jobs` leaves; 0 once the
        worker is due (it trips then). `held`: the jobs the worker holds now."""
        if self.reason is not None:
            return 0
        # (not before its first job: a process that starts past the limit would make way for
        # another that does too, in a loop with no job between)
        if self._resident is not None and self.taken and (rss := self._resident.bytes()) > self._limit:
            self._due("max_memory", f"resident memory {rss >> 20} MB is past --max-memory "
                                    f"{self.max_memory} MB")
            return 0
        if self.max_jobs is not None:
            left = self.max_jobs - self.taken
            if left <= 0:
                if not held:  # (its last job has finished)
                    self._due("max_jobs", f"{self.taken} jobs taken, --max-jobs {self.max_jobs}")
                return 0
            return min(room, left)
        return room

    def admits(self, count: int) -> bool:
        """Whether jobs an idle offer brought fit the budget (else they go back uncharged)."""
        return self.reason is None and (self.max_jobs is None
                                        or self.taken + count <= self.max_jobs)

    def took(self, count: int) -> None:
        """Jobs claimed or handed over reached the runners."""
        self.taken += count

    def _due(self, reason: str, why: str) -> None:
        self.reason = reason
        self._trip(reason, why)


def check_start(max_memory: int | None) -> None:
    """Refuse a `--max-memory` that this process, set up with the handlers imported (what each
    worker starts from), already fills: its workers would make way after every job."""
    if max_memory is None:
        return
    mb = over(max_memory)
    if mb is not None:
        raise ConfigurationError(f"--max-memory {max_memory} MB is below what a worker needs to "
                           f"start: this process already holds {mb} MB once the handlers are "
                           f"imported")
