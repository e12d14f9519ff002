"""Handlers the worker tests enqueue; `runworker` imports this module at start."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from jobqueue import JobContext, RetryLater, job

BALLAST = b"x" * (int(os.environ.get("JOBQUEUE_TEST_BALLAST_MB", "0")) << 20)
"""Memory a process that imports the handlers holds from its start (a test's pool processes:
their size past a --max-memory limit whatever this machine's start size)."""


@job
def add(x: int, y: int) -> int:
    return x + y


@job(takes_context=True)
def cancellable(ctx: JobContext, seconds: float) -> str:
    """Works in small steps until it is done or an operator cancels it (cooperative cancel)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not ctx.cancelled:
        time.sleep(0.05)
    ctx.raise_if_cancelled()
    return "finished"


@job(takes_context=True)
async def acancellable(ctx: JobContext, seconds: float) -> int:
    """`cancellable` as an async handler: it saves its step and looks for a cancel, awaiting."""
    import asyncio

    step = (ctx.checkpoint or {}).get("step", 0)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not await ctx.acancelled():
        step += 1
        assert await ctx.asave_checkpoint({"step": step})
        await asyncio.sleep(0.05)
    await ctx.araise_if_cancelled()
    return step


@job
async def blocks_the_loop(seconds: float) -> None:
    """An async handler that makes a blocking call (a mistake the worker must point out)."""
    time.sleep(seconds)


@job
def noop() -> None:
    return None


@job
def interpreter_state() -> dict[str, Any]:
    """How the worker's process tuned its garbage collector and its GIL's switch interval."""
    import gc
    import sys

    from jobqueue import collector

    return {"frozen": gc.get_freeze_count(), "threshold": gc.get_threshold(),
            "switch": sys.getswitchinterval(), "collecting": gc.isenabled(),
            "paused_at_start": collector.paused_at_start}


@job
async def ainterpreter_state() -> dict[str, Any]:
    return interpreter_state.func()


@job(max_attempts=2, backoff=0)
def always_fails(reason: str) -> None:
    raise ValueError(reason)


@job(backoff=0)
def retry_later(seconds: float) -> None:
    raise RetryLater("not yet", retry_in=seconds)


@job
def sleep(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


@job
def append_line(path: str, text: str) -> str:
    """Appends to a file: the tests read the order in which jobs ran."""
    with open(path, "a") as f:
        f.write(text + "\n")
    return text


@job(takes_context=True, max_attempts=3, backoff=0)
def crash_once(ctx: JobContext) -> dict[str, Any]:
    """First run saves a checkpoint, then the whole worker process dies; the re-run resumes."""
    if ctx.checkpoint is None:
        ctx.save_checkpoint({"step": 1, "attempt": ctx.attempt})
        os._exit(1)
    return {"resumed_from": ctx.checkpoint, "attempt": ctx.attempt}


@job
def unencodable() -> object:
    return object()


@job
def touch(path: str) -> None:
    Path(path).touch()


@job(max_attempts=1)
def database_session() -> int:
    """The database's id for the connection this job used (MariaDB's CONNECTION_ID,
    PostgreSQL's backend pid)."""
    from django.db import connection

    query = {"mysql": "SELECT CONNECTION_ID()", "postgresql": "SELECT pg_backend_pid()"}
    with connection.cursor() as cursor:
        cursor.execute(query.get(connection.vendor, "SELECT 1"))
        return int(cursor.fetchone()[0])


_client: Any = None  # one redis.asyncio client for every async job: it lives on the worker's loop


async def _shared_client() -> Any:
    global _client
    if _client is None:
        import redis.asyncio

        _client = redis.asyncio.Redis.from_url(os.environ["VALKEY_URL"])
    return _client


@job
async def async_sleep(seconds: float) -> dict[str, Any]:
    """Sleeps on the worker's event loop, then counts itself through a client kept between jobs
    (a client made on one loop fails on another: each job on a loop of its own would break it)."""
    import asyncio
    import threading

    started = time.monotonic()
    await asyncio.sleep(seconds)
    slept = time.monotonic()
    done = await (await _shared_client()).incr("test:async-done")
    loop = type(asyncio.get_running_loop()).__module__.split(".")[0]  # uvloop's, or asyncio's
    return {"thread": threading.get_ident(), "done": done, "started": started, "slept": slept,
            "loop": loop}


@job(takes_context=True, max_attempts=2, backoff=0)
async def async_fails(ctx: JobContext, how: str) -> None:
    if how == "retry":
        raise RetryLater("async, not yet", retry_in=0)
    raise ValueError(f"async {how} on attempt {ctx.attempt}")


from . import celery_tasks, django_tasks  # noqa: E402,F401 - the worker registers these too


@job(takes_context=True, max_attempts=20, backoff=0)
def chaos_step(ctx: Any, effects_url: str, sleep: float, roll: float) -> str:
    """For the chaos test: sleeps, sometimes fails or kills its worker, and records its effect
    once, keyed by its job id (delivery is at-least-once: a re-run must not record it again)."""
    import redis

    time.sleep(sleep)
    if roll < 0.02 and ctx.attempt == 1:
        os._exit(3)  # the worker dies mid-job; the lease expires; another worker runs it again
    if roll < 0.12 and ctx.attempt == 1:
        raise RuntimeError("chaos: a failure the retry absorbs")
    client = redis.Redis.from_url(effects_url)
    if not client.set(f"effect:{ctx.job_id}", ctx.attempt, nx=True):
        client.incr("effects:replayed")  # a re-run after a crash: the effect is already there
    client.close()
    return "done"


@job(takes_context=True, backoff=0)
def fails_once(ctx: JobContext) -> str:
    """Fails its first attempt, then returns the id of the span current while it runs (the
    tracing tests: its attempt's span, when the worker traces)."""
    from opentelemetry import trace

    if ctx.attempt == 1:
        raise ConnectionError("the first attempt fails")
    return f"0x{trace.get_current_span().get_span_context().span_id:016x}"


@job(max_attempts=1)
def mul(x: float, y: float) -> float:
    return x * y


@job(max_attempts=1)
def total(values: list[Any]) -> Any:
    """A chord's callback: the sum of its members' results (the list itself when they are not
    all numbers, e.g. an error object in a slot)."""
    if all(isinstance(v, (int, float)) for v in values):
        return sum(values)
    return values


@job(max_attempts=1)
def fails_with(reason: str) -> None:
    raise ValueError(reason)


@job(takes_context=True)
def counts_up(ctx: JobContext, to: int) -> int:
    """Reports its progress at every step of a tight loop (the worker coalesces the writes)."""
    for i in range(1, to + 1):
        ctx.progress({"done": i, "of": to})
    return to


@job(takes_context=True)
def waits_for_file(ctx: JobContext, path: str) -> str:
    """Reports progress, then works until `path` exists (a test holds it mid-run)."""
    ctx.progress("started")
    while not Path(path).exists():
        time.sleep(0.02)
    ctx.progress("finishing")
    return "finished"


@job(takes_context=True)
async def awaits_file(ctx: JobContext, path: str) -> str:
    """`waits_for_file` as an async handler."""
    import asyncio

    ctx.progress("started")
    while not Path(path).exists():
        await asyncio.sleep(0.02)
    ctx.progress("finishing")
    return "finished"


@job(takes_context=True)
def hangs_on_first_attempt(ctx: JobContext, path: str) -> int:
    """Holds its first attempt until `path` exists (a test kills its worker meanwhile, whatever
    the machine's load); a later attempt returns at once."""
    while ctx.attempt == 1 and not Path(path).exists():
        time.sleep(0.02)
    return ctx.attempt


@job(max_attempts=1)
def ends_on_file(path: str, fail: bool) -> str:
    """Works until `path` exists, then succeeds or fails: a test chooses when jobs finish."""
    while not Path(path).exists():
        time.sleep(0.02)
    if fail:
        raise ValueError("failed on purpose")
    return "done"


@job(max_attempts=20, backoff=0)
def square_slowly(i: int, seconds: float) -> int:
    time.sleep(seconds)
    return i * i


@job(max_attempts=20, backoff=0)
def record_chord(results: list[Any], effects_url: str) -> int:
    """A chord's callback that counts its runs and keeps the results it got (the tests check it
    ran once, with every result in order)."""
    import json

    import redis
    from redis.cluster import RedisCluster

    if "cluster=true" in effects_url:
        client: Any = RedisCluster.from_url(effects_url.split("?")[0])
    else:
        client = redis.Redis.from_url(effects_url)
    client.rpush("chord:runs", json.dumps(results))
    client.close()
    return len(results)


RAISED: dict[str, type[BaseException]] = {
    "SystemExit": SystemExit, "KeyboardInterrupt": KeyboardInterrupt,
    "GeneratorExit": GeneratorExit}


def _misbehave(ctx: JobContext, how: str) -> str:
    """What the plain and the async misbehaving handlers share: the BaseExceptions and the
    database's misuses (in a thread: the async one calls it through sync_to_async)."""
    import asyncio

    from django.contrib.auth.models import User
    from django.db import transaction

    if how == "CancelledError":
        raise asyncio.CancelledError()
    if how in RAISED:
        raise RAISED[how](f"{how} from the handler's own code")
    if how == "atomic left open":  # (a context manager entered and never left)
        transaction.atomic().__enter__()
        User.objects.create(username=f"left-open-{ctx.job_id}")
    elif how == "autocommit off":
        transaction.set_autocommit(False)
        User.objects.create(username=f"uncommitted-{ctx.job_id}")
    elif how == "write":  # (after the two above on the same connection: committed, alone)
        User.objects.create(username=f"written-{ctx.job_id}")
    return how


@job(takes_context=True, max_attempts=1)
def misbehaves(ctx: JobContext, how: str, path: str = "") -> str:
    """A handler that misbehaves as `how` says (the worker's matrix): raises a BaseException,
    ends its process, leaves a transaction open, or ("hang") writes its pid to `path` and runs
    until its process is killed."""
    if how == "exit":
        os._exit(7)
    if how == "hang":
        Path(path).write_text(str(os.getpid()))
        while True:
            time.sleep(0.05)
    return _misbehave(ctx, how)


@job(takes_context=True, max_attempts=1)
async def amisbehaves(ctx: JobContext, how: str, seconds: float = 0.0) -> str:
    """`misbehaves` as an async handler, with the loop's own misdeeds: a sub-task's cancel
    let through, the loop blocked for `seconds`, a cancel swallowed (it runs until its process
    ends)."""
    import asyncio

    if how == "cancelled sub-task":  # (a library whose own task was cancelled)
        inner = asyncio.ensure_future(asyncio.sleep(10))
        await asyncio.sleep(0)
        inner.cancel()
        await inner
    if how == "block":
        ctx.progress("blocking")
        time.sleep(seconds)
        return how
    if how == "swallow":
        ctx.progress("started")
        while True:
            try:
                await asyncio.sleep(seconds)
            except asyncio.CancelledError:
                continue
    return _misbehave(ctx, how)


@job(takes_context=True)
async def aholds_until(ctx: JobContext, path: str) -> str:
    """Notes its start (on the list `test:started`), then runs until `path` exists."""
    import asyncio

    await (await _shared_client()).rpush("test:started", ctx.job_id)
    while not Path(path).exists():
        await asyncio.sleep(0.02)
    return "done"


if os.environ.get("JOBQUEUE_TEST_RECEIVERS"):  # the signal tests' workers: receivers that query
    from django.dispatch import receiver

    from jobqueue.signals import job_finished, job_started

    def _note(key: str, value: object) -> None:
        import redis

        client = redis.Redis.from_url(os.environ["VALKEY_URL"])
        client.rpush(key, str(value))
        client.close()

    @receiver(job_finished, dispatch_uid="tests.jobapp.finished")
    def _finished_session(sender: object, lease: Any, **_: object) -> None:
        """Notes the database session this receiver's query used."""
        _note("test:finished-sessions", database_session.func())

    @receiver(job_started, dispatch_uid="tests.jobapp.started")
    def _started_orm(sender: object, lease: Any, **_: object) -> None:
        """Uses the ORM (on an event loop Django refuses it), then notes the job."""
        from django.contrib.auth.models import User

        User.objects.filter(username="nobody").exists()
        _note("test:started-orm", lease.job_id)


@job(max_attempts=1)
def echo(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """What it was called with (the flow tests check what a step got)."""
    return {"args": list(args), "kwargs": kwargs}


@job(takes_context=True)
def reports_then_waits(ctx: JobContext, value: Any, path: str) -> Any:
    """Reports `value` as its last progress, then works until `path` exists."""
    ctx.progress(value)
    while not Path(path).exists():
        time.sleep(0.02)
    return value


@job(takes_context=True, max_attempts=5, backoff=0)
def held_per_attempt(ctx: JobContext, path: str) -> int:
    """Reports its attempt as progress, then works until `<path>.<attempt>` exists: a test ends
    each run when it chooses. The first run then fails (a run whose lease lapsed, ending late)."""
    ctx.progress(ctx.attempt)
    while not Path(f"{path}.{ctx.attempt}").exists():
        time.sleep(0.02)
    if ctx.attempt == 1:
        raise RuntimeError("the first run ends late")
    return ctx.attempt


@job
async def ahangs(seconds: float) -> str:
    """Awaits `seconds` (a hanging async run, for its timeout to cancel)."""
    import asyncio

    await asyncio.sleep(seconds)
    return "woke"


@job(takes_context=True, backoff=0)
def overruns_first_attempt(ctx: JobContext, path: str, seconds: float) -> str:
    """Its first attempt works `seconds` without looking at its context (past its timeout), then
    notes in `path` what its context says and returns; a later attempt returns at once."""
    if ctx.attempt == 1:
        time.sleep(seconds)
        Path(path).write_text(f"cancelled={ctx.cancelled} timed_out={ctx.timed_out}")
        return "late"
    return "retried"


@job(max_attempts=1)
def spins(path: str) -> None:
    """Writes its process's pid to `path`, then spins for ever (only a kill ends it)."""
    Path(path).write_text(str(os.getpid()))
    while True:
        pass


@job(max_attempts=1)
async def aswallows_cancel(seconds: float) -> str:
    """Awaits `seconds`, and returns normally when cancelled (a handler that swallows it)."""
    import asyncio

    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        return "swallowed"
    return "woke"


KEPT: list[bytes] = []
"""What `leaky` keeps for the life of its process (a leak, as image libraries and caches make)."""


@job(takes_context=True)
def leaky(ctx: JobContext, path: str, keep_mb: int = 0) -> int:
    """Notes its run in `path` (job id, process id, resident MB before it ran), then keeps
    `keep_mb` MB for the life of its process; returns its process id. The recycling tests count
    runs and processes with it."""
    from jobqueue.worker.recycling import resident_bytes

    before = (resident_bytes() or 0) >> 20
    if keep_mb:
        KEPT.append(b"\x01" * (keep_mb << 20))  # (written: resident, not merely reserved)
    with open(path, "a") as f:
        f.write(f"{ctx.job_id} {os.getpid()} {before}\n")
    return os.getpid()


RUNNING = """local n = redis.call('INCRBY', KEYS[1], ARGV[1])
if n > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], n) end
return n"""
"""Counts the jobs of a tally running at once (KEYS[1]) and the most ever (KEYS[2])."""


@job(takes_context=True, max_attempts=5, backoff=0)
def tallied(ctx: JobContext, tally: str, seconds: float, hold_first: str = "") -> int:
    """Runs `seconds`, counted in Valkey while it runs (`{tally}:running`, its peak in
    `{tally}:peak`): the global cap's tests read how many ran at once across workers. With
    `hold_first`, a first attempt holds until that file exists, counted apart (`{tally}:held`:
    a test kills its worker meanwhile)."""
    from jobqueue.conf import get_client

    client = get_client()
    keys = (f"{{{tally}}}:running", f"{{{tally}}}:peak")
    if hold_first and ctx.attempt == 1:
        client.incr(f"{{{tally}}}:held")
        while not Path(hold_first).exists():
            time.sleep(0.02)
        return ctx.attempt
    client.eval(RUNNING, 2, *keys, 1)
    try:
        time.sleep(seconds)
    finally:
        client.eval(RUNNING, 2, *keys, -1)
    return ctx.attempt

@job(takes_context=True, max_attempts=1)
def confide(ctx: JobContext, secret: str, fail: bool = False) -> dict[str, Any]:
    """The encryption tests' handler: it keeps `secret` in its checkpoint and progress, and
    returns it upper-cased (or, with `fail`, raises an error quoting it)."""
    ctx.save_checkpoint({"seen": secret})
    ctx.progress({"at": secret})
    if fail:
        raise ValueError(f"cannot use {secret}")
    return {"echo": secret.upper(), "checkpoint": ctx.checkpoint}


@job(encrypt=True, max_attempts=1)
def confide_sealed(secret: str) -> str:
    """Sealed on any queue (`@job(encrypt=True)`): returns `secret` reversed."""
    return secret[::-1]


# Batch handlers, for the batch tests' workers only (tests/worker/test_batches.py): a worker of a
# project that has some looks at each job it claims for them.
if os.environ.get("JOBQUEUE_TEST_BATCHES"):
    from . import batch_jobs  # noqa: F401
