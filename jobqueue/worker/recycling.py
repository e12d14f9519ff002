"""`runworker --max-jobs N` and `--max-memory MB`: when a worker process has done its share, or
grown too big, it makes way for a fresh one (leaky handlers: image libraries, ML models, ORM
caches).

The policy lives here, in `Recycler`, which the claim asks before each claim how much room is
left (`Claims.recycler`; None, and so no cost, without the flags):

- `--max-jobs N`: the worker claims at most N jobs (hand-offs included), so it never holds
  more than it will run; once they have all finished, it is due.
- `--max-memory MB`: before each claim the process's resident memory is read (on Linux from
  /proc, a few microseconds); past the limit the worker is due at once (once it has taken a
  job). No restart loop: a process already past the limit at its first claim (a fresh one
  would be too) says so in one ERROR and is not held to the limit.

A worker that is due trips its recycle (`Worker._recycle`): it stops claiming as a stop signal
would, hands back its prefetched jobs uncharged, finishes what runs (however long it takes:
only a stop during the drain starts the `--grace` clock), counts the recycle
(`presence.recycled`: the metrics and the console read it) and exits RECYCLE_EXIT; the
supervisor (`supervisor.py`), which `runworker` puts over every worker when a limit is set
(also with `--workers 1`), starts a fresh one at once. Under `--processes` the pool processes
are held to `--max-memory` too: one past it after a job is replaced (`pool.py`), unless it
was past it when it started (`PoolLimit`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import sys
import threading
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
            return _statm_resident(statm.read())
    except (OSError, ValueError, IndexError):
        return None if pid is not None else _peak()


def _statm_resident(statm: bytes) -> int:
    """The resident bytes a /proc/<pid>/statm line says (its second field, in pages)."""
    return int(statm.split()[1]) * _PAGE


def megabytes(size: int) -> str:
    """`size` bytes in MB, with a decimal (64.3 MB is past a 64 MB limit; "64 MB" is not)."""
    return f"{size / (1 << 20):.1f} MB"


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
                return _statm_resident(os.pread(self._fd, 128, 0))
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
    """The resident bytes of `pid` (None: this process) when past `limit_mb`, else None."""
    rss = resident_bytes(pid)
    return rss if rss is not None and rss > limit_mb << 20 else None


class PoolLimit:
    """`--max-memory` for one worker's pool processes (`pool.py`): each is sized when it is
    ready; one already past the limit then is kept (a fresh one would be too: a spawn, Django
    set up again, per job), with one WARNING for the worker."""

    def __init__(self, max_memory: int) -> None:
        self.max_memory = max_memory
        self._warned = False

    def holds(self, pid: int) -> bool:
        """Whether the pool process `pid`, just ready, is to be held to the limit."""
        rss = over(self.max_memory, pid)
        if rss is None:
            return True
        if not self._warned:
            self._warned = True
            log.warning("a pool process holds %s once started, past --max-memory %d MB: pool "
                        "processes are not replaced for their memory", megabytes(rss),
                        self.max_memory)
        return False

    def past(self, pid: int) -> int | None:
        """The resident bytes of the pool process `pid` when past the limit, else None."""
        return over(self.max_memory, pid)


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
        self.spent = threading.Event()
        """Set once `--max-jobs` jobs were taken: the worker claims nothing more, and its
        waiters stop taking the wake tokens another worker could use."""
        self._trip = trip
        self._resident = Resident() if max_memory is not None else None
        self._limit = (max_memory or 0) << 20
        self._sized = False
        """Whether its memory was read at a claim (the first says whether it started past)."""

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
        rss = self._past_memory()
        if rss is not None:
            self._due("max_memory", f"resident memory {megabytes(rss)} is past --max-memory "
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

    def _past_memory(self) -> int | None:
        """The resident bytes when they are past `--max-memory` and the worker is due for it:
        once it has taken a job, and unless it was past it at its first claim already (a
        fresh process would be too: a restart loop), which it says once."""
        if self._resident is None:
            return None
        rss = self._resident.bytes()
        first, self._sized = not self._sized, True
        if rss <= self._limit:
            return None
        if first:
            log.error("--max-memory is below this worker's size after start: %s (--max-memory "
                      "%d MB); its memory is not held to the limit", megabytes(rss),
                      self.max_memory)
            self._resident = None
            return None
        return rss if self.taken else None

    def admits(self, count: int) -> bool:
        """Whether jobs an idle offer brought fit the budget (else they go back uncharged)."""
        return self.reason is None and (self.max_jobs is None
                                        or self.taken + count <= self.max_jobs)

    def took(self, count: int) -> bool:
        """Jobs claimed or handed over reached the runners; True when they spent the budget."""
        self.taken += count
        if self.max_jobs is None or self.taken < self.max_jobs or self.spent.is_set():
            return False
        self.spent.set()
        return True

    def _due(self, reason: str, why: str) -> None:
        self.reason = reason
        self._trip(reason, why)


def check_start(max_memory: int | None) -> None:
    """Refuse a `--max-memory` that this process, set up with the handlers imported (what each
    worker starts from), already fills: its workers would make way after every job."""
    if max_memory is None:
        return
    rss = over(max_memory)
    if rss is not None:
        raise ConfigurationError(f"--max-memory {max_memory} MB is below what a worker needs to "
                                 f"start: this process already holds {megabytes(rss)} once the "
                                 f"handlers are imported")
