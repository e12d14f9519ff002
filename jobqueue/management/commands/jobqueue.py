"""`manage.py jobqueue resize|restore|stats|reseal|bulk|rollup`: operator commands (they parse,
then call the library)."""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime, timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from redis.exceptions import RedisError

from jobqueue.conf import get_config
from jobqueue.console import actions
from jobqueue.engine.layouts import MAX_SHARDS
from jobqueue.engine.store import Queue, known_queues
from jobqueue.exceptions import JobQueueError
from jobqueue.history import outbox
from jobqueue.keys import queue_list, validate_queue


class Command(BaseCommand):
    help = ("Operate jobqueue: resize a queue's shards live, restore durable jobs into Valkey, or "
            "print counts by queue and state.")
    requires_system_checks = ["jobqueue"]

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True,
                                        metavar="{resize,restore,stats,reseal,bulk,rollup}")
        resize = actions.add_parser("resize", help="set a queue's live shard count (1…1024) "
                                                   "without stopping anything")
        resize.add_argument("queue")
        resize.add_argument("count", metavar="N", type=_count)
        restore = actions.add_parser("restore", help="re-create in Valkey every unfinished durable "
                                                     "job that it lacks (safe to run twice)")
        restore.add_argument("--queues", help="comma-separated queue names (default: every durable "
                                              "queue)")
        stats = actions.add_parser("stats", help="counts by queue and state")
        stats.add_argument("--json", action="store_true", help="print JSON instead of a table")
        reseal = actions.add_parser("reseal", help="seal every sealed value in Valkey and the "
                                                   "database again under the first of "
                                                   "ENCRYPTION_KEYS (safe to run twice)")
        reseal.add_argument("--chunk", type=int, default=500, help="keys and rows per step")
        bulk = actions.add_parser("bulk", help="run the console's bulk operations to their end "
                                               "(resuming those whose runner died)")
        bulk.add_argument("--chunk", type=_chunk, default=500,
                          help="jobs acted on between two saves of an operation's cursor")
        bulk.add_argument("--no-wait", action="store_true",
                          help="leave operations another runner holds (by default, wait for a "
                               "dead runner's lease to lapse and resume them)")
        rollup = actions.add_parser("rollup", help="build the history charts' counts again from "
                                                   "the history rows (safe to run twice)")
        rollup.add_argument("--days", type=_days, help="only the last N days (default: all)")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            if options["action"] == "resize":
                self.resize(validate_queue(options["queue"]), options["count"])
            elif options["action"] == "bulk":
                from jobqueue.console.bulk import Runner

                finished = Runner(chunk=options["chunk"]).run(wait=not options["no_wait"])
                self.stdout.write(f"finished {finished} bulk operation(s)")
            elif options["action"] == "restore":
                self.restore(queue_list(options["queues"]))
            elif options["action"] == "reseal":
                self.reseal(max(1, options["chunk"]))
            elif options["action"] == "rollup":
                self.rollup(options["days"])
            else:
                self.stats(as_json=options["json"])
        except JobQueueError as exc:
            raise CommandError(str(exc)) from None
        except RedisError as exc:  # unreachable, wrong password, …: one line, no secret in it
            raise CommandError(f"cannot use Valkey: {exc.__class__.__name__}: {exc}") from None

    def resize(self, name: str, count: int) -> None:
        before, after = actions.resize_queue(Queue(name), count, by="manage.py jobqueue resize")
        if after == before:
            self.stdout.write(f"queue {name} already has {count} live shard(s)")
        elif count > before.live:
            self.stdout.write(f"queue {name}: {before.live} → {count} shards; new jobs spread over "
                              f"all {count} now")
        else:
            self.stdout.write(f"queue {name}: {before.live} → {count} shards; shards {count}…"
                              f"{after.span - 1} take no new jobs and retire once workers drain them")

    def restore(self, names: tuple[str, ...]) -> None:
        from jobqueue.models import Job

        if not names:
            configured = {n for n, o in get_config().queues.items() if o.durable}
            in_db = set(Job.objects.filter(durable=True).values_list("queue", flat=True).distinct())
            names = tuple(sorted(configured | in_db))

        def progress(queue: str, seen: int, restored: int) -> None:
            if seen % 10_000 < 500:  # a line per ten thousand rows on a large restore
                self.stderr.write(f"restore: {queue}: {seen:,} unfinished rows checked, "
                                  f"{restored:,} restored")

        restored = outbox.restore([Queue(name) for name in names], progress=progress)
        where = ", ".join(names) or "no durable queue"
        self.stdout.write(f"restored {restored} job(s) into Valkey ({where})")

    def reseal(self, chunk: int) -> None:
        from jobqueue.conf import get_client
        from jobqueue.operations.reseal import reseal

        report = reseal(get_client(), chunk=chunk, progress=lambda where, n: self.stderr.write(
            f"reseal: {where}: {n:,} checked"))
        self.stdout.write(f"resealed {report.resealed} value(s) under the first key")
        if report.left:
            keys = ", ".join(f"{kid}: {count}" for kid, count in sorted(report.left.items()))
            self.stdout.write(f"{report.left_total} value(s) still need an old key ({keys}): "
                              f"keep those keys listed")
        else:
            self.stdout.write("0 value(s) still need an old key: keys other than the first may "
                              "be dropped")

    def rollup(self, days: int | None) -> None:
        from jobqueue.history import rollup

        since = None if days is None else datetime.now(UTC) - timedelta(days=days)

        def progress(read: int) -> None:
            self.stderr.write(f"rollup: {read:,} history rows read")

        read = rollup.backfill(since, progress=progress)
        self.stdout.write(f"rollup rebuilt from {read:,} history row(s)"
                          + ("" if days is None else f" of the last {days} day(s)"))

    def stats(self, as_json: bool) -> None:
        counts = {name: Queue(name).counts() for name in known_queues()}
        if as_json:
            self.stdout.write(json.dumps(counts, indent=2))
            return
        states = list(next(iter(counts.values()), {}))
        width = max((len(name) for name in counts), default=5)
        self.stdout.write(f"{'queue':<{width}}  " + "  ".join(f"{s:>9}" for s in states))
        for name, row in counts.items():
            self.stdout.write(f"{name:<{width}}  " + "  ".join(f"{row[s]:>9,}" for s in states))


def _count(raw: str) -> int:
    try:
        count = int(raw)
    except ValueError:
        count = 0
    if not 1 <= count <= MAX_SHARDS:
        raise argparse.ArgumentTypeError(f"N must be a whole number in 1…{MAX_SHARDS}, got {raw!r}")
    return count


def _chunk(raw: str) -> int:
    if not raw.isdecimal() or not 1 <= int(raw) <= 100_000:
        raise argparse.ArgumentTypeError(f"--chunk must be a whole number in 1…100000, got {raw!r}")
    return int(raw)


def _days(raw: str) -> int:
    if not raw.isdecimal() or not 1 <= int(raw) <= 10_000:
        raise argparse.ArgumentTypeError(f"--days must be a whole number in 1…10000, got {raw!r}")
    return int(raw)
