"""The cyclic garbage collector in a worker's process: off while `runworker` starts, then
settled for the worker's threads.

Setting Django up and importing the application makes ~70k objects that live as long as the
process. At CPython's thresholds the collector walks them again and again while they are made
(152 collections to a worker's first job, one full: 6 % of its instructions), and finds little
to free. So when the process is the `runworker` command (`manage.py`, `django-admin` or
`python -m django`: the command is the first argument), jobqueue's package turns the collector
off as Django imports it with the installed apps (`pause_for_runworker`, the only thing jobqueue
does at import time), and the worker turns it back on once its handlers are loaded (`settle`),
hiding start-up's objects from it first. That is the order Python's documentation of
`gc.freeze` gives for a process that forks: collector off early, freeze before forking, on again
in the children; `runworker --workers N` settles in the supervisor before it forks them, and
the mirror's forked process settles at its own start. The pause is worth its place at import,
and only there: it saves 51 collections and 42 M of the 1,471 M instructions before the first
job (2.9 %), where the command's own start (`run_from_argv`) comes after Django's setup and the
command's import, and a pause from there saves one (bench/RESULTS.md).

Any other process that imports jobqueue (a web server, a shell, the tests, another command, a
process that multiprocessing starts from a worker) is left as it is. A `runworker` that fails
before its worker settles turns the collector back on on its way out (`resume`). An application
that turns the collector off itself while Django sets up a `runworker` process is not told apart
from this pause: it is turned back on.
"""

from __future__ import annotations

import gc
import sys

GC_GEN0 = 10_000
"""The worker's threshold for collecting its youngest objects (CPython 3.12 starts at 700)."""
paused_at_start = False
"""Whether this process started with the collector paused (a `runworker` process)."""
_paused = False


def pause_for_runworker() -> None:
    """Turn the collector off for the rest of the start when this process runs `runworker`
    through Django's command line; anywhere else, do nothing."""
    global paused_at_start, _paused
    if _runs_runworker() and gc.isenabled():
        gc.disable()
        paused_at_start = _paused = True


def _runs_runworker() -> bool:
    """Whether this process is a `runworker` command itself. A process that multiprocessing
    started (the worker's `--processes` pool, or a handler's own) is given its parent's argv
    but is not one: nothing in it would turn the collector back on."""
    command = getattr(sys, "argv", [])[1:2]  # (an embedded interpreter may have no argv)
    if command != ["runworker"] or "django.core.management" not in sys.modules:
        return False
    if "--multiprocessing-fork" in getattr(sys, "orig_argv", ()):  # (spawned: before its
        return False  # parent_process() is set, it may import jobqueue to unpickle its target)
    spawned = sys.modules.get("multiprocessing.process")
    return spawned is None or spawned.parent_process() is None


def resume() -> None:
    """Turn the collector back on if `pause_for_runworker` turned it off."""
    global _paused
    if _paused:
        _paused = False
        gc.enable()


def settle() -> None:
    """Once the handlers' modules are loaded: hide what start-up made (Django, the app, ~70k
    objects) from the cyclic collector, run its youngest pass less often, and turn it back on if
    the start paused it. A job makes and frees dozens of objects (tasks, futures, replies): at
    CPython's defaults a no-op job spent ~8 % of its time in collections, most of it in full
    passes over start-up's objects, each a pause of ~20 ms. An application that set a higher
    threshold keeps its own. (No collection first: one pass over start-up's objects costs ~30 ms
    of the worker's start and finds a few dozen to free.)"""
    gc.freeze()
    gen0, *older = gc.get_threshold()
    if 0 < gen0 < GC_GEN0:  # (0: the application turned collection off)
        gc.set_threshold(GC_GEN0, *older)
    resume()
