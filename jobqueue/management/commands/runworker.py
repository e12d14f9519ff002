"""`manage.py runworker`: parse the options, wire signals, run a Worker."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import connections
from django.utils.module_loading import autodiscover_modules

from jobqueue import collector
from jobqueue.exceptions import JobQueueError
from jobqueue.keys import queue_list
from jobqueue.worker import Worker, WorkerConfig
from jobqueue.worker.mirror_thread import MirrorProcess
from jobqueue.worker.recycling import MEMORY_FLOOR_MB, check_start
from jobqueue.worker.supervisor import Supervisor, default_workers


def _whole(minimum: int, unit: str = "") -> Callable[[str], int]:
    """An argparse type: a whole number of at least `minimum` (`unit`: what its bound says)."""

    def parse(raw: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {raw!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}{unit}, got {value}")
        return value

    return parse


def _workers(raw: str) -> int:
    return default_workers() if raw == "auto" else _whole(1)(raw)


def _seconds(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {raw!r}") from None
    if not 0 < value <= 86_400:
        raise argparse.ArgumentTypeError(f"must be within 0…86400 seconds, got {value}")
    return value


def _relay_signals(worker: Worker, mirror: MirrorProcess | None = None) -> threading.Event:
    """SIGTERM/SIGINT ask the worker to stop, from a thread of their own; a second one also cuts
    the mirror's final pass short. Returns an event set at that second one.

    A handler runs on the main thread between two bytecodes, possibly inside `Event.wait()`
    holding that event's lock; calling `Event.set()` there can deadlock. So the handler only
    writes a byte to a pipe (async-signal-safe) and a relay thread calls `request_stop()`.
    """
    read_fd, write_fd = os.pipe()
    asked, aborted = threading.Event(), threading.Event()

    def relay() -> None:
        while os.read(read_fd, 1):
            worker.request_stop()
            if asked.is_set():
                aborted.set()
                if mirror is not None:
                    mirror.abort()
            asked.set()

    threading.Thread(target=relay, name="jobqueue-signals", daemon=True).start()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: os.write(write_fd, b"!"))
    return aborted


def _child_name(name: str, index: int, workers: int) -> str:
    """A supervised worker's name: `name-index`, or `name` itself when it is the only one
    (`--workers 1` with a limit: one worker, as the operator named it)."""
    return name if workers == 1 else f"{name}-{index}"


def _child_argv(options: dict[str, Any], name: str, index: int, workers: int = 2) -> list[str]:
    """The command line of one supervised worker (of `workers`): these options, one process,
    its own name (a child started as a new process rather than forked: see `supervisor.py`)."""
    argv = [sys.executable, "-m", "django", "runworker", "--workers", "1",
            "--name", _child_name(name, index, workers),
            "--concurrency", str(options["concurrency"]), "--grace", str(options["grace"]),
            "--log-level", options["log_level"]]
    for option in ("queues", "prefetch", "lease", "max_jobs", "max_memory"):
        if options[option] is not None:
            argv += ["--" + option.replace("_", "-"), str(options[option])]
    for flag in ("burst", "processes", "no_mirror"):
        if options[flag]:
            argv.append("--" + flag.replace("_", "-"))
    return [*argv, "--supervised"]


class Command(BaseCommand):
    help = "Run jobs from Valkey queues and mirror finished ones to the database."
    # Only jobqueue's own settings check: Django's model checks query MySQL, and a worker must
    # start (and run jobs) while the database is down; the mirror catches up when it returns.
    requires_system_checks = ["jobqueue"]

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--queues", help="comma-separated queue names (default: every known queue)")
        parser.add_argument("--workers", type=_workers, default=None,
                            help="worker processes, each with its own claim loop (default: one per "
                                 "core; 'auto' says the same)")
        parser.add_argument("--concurrency", type=_whole(1), default=4,
                            help="jobs run at once (default 4)")
        parser.add_argument("--prefetch", type=_whole(0), default=None,
                            help="jobs claimed ahead of free threads (default: the concurrency; 0: none)")
        parser.add_argument("--burst", action="store_true",
                            help="exit 0 once the queues hold no ready or running job, nor one "
                                 "scheduled within 60 s (a retry's backoff; jobs due later wait "
                                 "for a later run), and every finished job is mirrored")
        parser.add_argument("--lease", type=_seconds,
                            help="lease seconds, overriding the job's and the queue's")
        parser.add_argument("--processes", action="store_true",
                            help="run jobs in a process pool (CPU-bound work) instead of threads")
        parser.add_argument("--grace", type=_seconds, default=30.0,
                            help="seconds running jobs get to finish on the first SIGTERM (default 30)")
        parser.add_argument("--name", help="worker name (default host:pid)")
        parser.add_argument("--no-mirror", action="store_true",
                            help="do not mirror finished jobs to the database from this worker")
        parser.add_argument("--max-jobs", type=_whole(1), default=None,
                            help="jobs a worker process runs before a fresh one takes its place "
                                 "(supervised, also with --workers 1)")
        parser.add_argument("--max-memory", default=None,
                            type=_whole(MEMORY_FLOOR_MB, " MB (what a worker process needs to start)"),
                            help=f"resident MB (at least {MEMORY_FLOOR_MB}) past which a worker "
                                 f"process, or a --processes pool process, makes way for a "
                                 f"fresh one")
        parser.add_argument("--supervised", action="store_true", help=argparse.SUPPRESS)
        # (--supervised: a child the supervisor started as a new process runs its worker itself)
        parser.add_argument("--log-level", default="INFO",
                            choices=["DEBUG", "INFO", "WARNING", "ERROR"])

    @staticmethod
    def config(options: dict[str, Any]) -> WorkerConfig:
        """The worker's configuration from parsed options; a CommandError names a bad one."""
        try:
            return WorkerConfig(
                queues=queue_list(options["queues"]),
                concurrency=options["concurrency"], prefetch=options["prefetch"],
                burst=options["burst"], lease=options["lease"],
                processes=options["processes"], grace=options["grace"],
                mirror=not options["no_mirror"],
                max_jobs=options["max_jobs"], max_memory=options["max_memory"],
                **({"name": options["name"]} if options["name"] else {}),
            )
        except JobQueueError as exc:
            raise CommandError(str(exc)) from None

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            self._run(options)
        finally:  # (a worker that failed before it settled the collector: see jobqueue.collector)
            collector.resume()

    def _run(self, options: dict[str, Any]) -> None:
        self._configure_logging(options["log_level"])
        config = self.config(options)
        workers = options["workers"] or default_workers()
        # A limit puts a supervisor over even one worker: it starts a fresh one as one recycles.
        if workers > 1 or (config.recycles and not options["supervised"]):
            autodiscover_modules("jobs")  # (once, here: each forked child starts with them)
            try:
                check_start(config.max_memory)
            except JobQueueError as exc:
                raise CommandError(str(exc)) from None
            connections.close_all()  # (a child must not share a connection with another)
            collector.settle()  # (before forking: the children share start-up's objects)
            supervisor = Supervisor([_child_argv(options, config.name, i, workers)
                                     for i in range(workers)], burst=config.burst,
                                    run_child=lambda i: self._child(config, i, workers))
            sys.exit(supervisor.run())
        worker = self.serve(config)
        code = worker.exit_code
        if worker.abandoned:
            # Handlers still running were released to other workers; do not wait for them.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        if code:
            sys.exit(code)

    @staticmethod
    def serve(config: WorkerConfig) -> Worker:
        """Run one worker (and its mirror's process) until it stops; the stopped worker (how
        many running jobs it released at the end, whether it recycled itself)."""
        mirror = MirrorProcess.start(config) if config.mirror else None
        worker = Worker(dataclasses.replace(config, mirror=False) if mirror else config)
        aborted = _relay_signals(worker, mirror)
        try:
            worker.run()
        except JobQueueError as exc:  # e.g. wrong credentials: one line, no traceback
            raise CommandError(str(exc)) from None
        finally:
            if mirror is not None and not mirror.finish(abort=aborted.is_set()):
                worker.unmirrored = config.burst
        return worker

    def _child(self, config: WorkerConfig, index: int, workers: int) -> int:
        """Supervised worker `index` (of `workers`), in a process forked from the supervisor:
        its exit code."""
        try:
            worker = self.serve(dataclasses.replace(
                config, name=_child_name(config.name, index, workers)))
        except CommandError as exc:
            self.stderr.write(f"CommandError: {exc}")
            return 1
        return worker.exit_code

    def _configure_logging(self, level: str) -> None:
        logger = logging.getLogger("jobqueue")
        logger.setLevel(level)
        if not logger.handlers and not logging.getLogger().handlers:
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
            logger.addHandler(handler)
