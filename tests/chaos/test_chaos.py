"""Chaos: real workers SIGKILLed and restarted at random while jobs sleep, fail and sometimes
kill their worker; Valkey SIGKILLed and restarted from its append-only file; MariaDB stopped and
started mid-run. At the end every job is terminal, has exactly one mirror row, and recorded its
effect exactly once.

CI runs a short round (about 45 s). A long one: `CHAOS_JOBS=20000 CHAOS_SECONDS=600
.venv/bin/pytest tests/chaos -s`.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from jobqueue import Queue
from tests.jobapp import jobs

from ..servers import MariaDBProcess, ValkeyProcess
from ..workers import ROOT, start_worker, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True),
              pytest.mark.skipif(not shutil.which("mariadbd"), reason="needs MariaDB's server")]
JOBS = int(os.environ.get("CHAOS_JOBS", "1500"))
SECONDS = float(os.environ.get("CHAOS_SECONDS", "25"))


def each_effect_once(recorded: redis.Redis, refs: list[Any]) -> int:
    """Each job recorded its effect under its own id, once: a re-run (at-least-once delivery)
    came back with the same id, so its SET NX found the effect already there. Returns how many
    re-runs were absorbed that way."""
    assert {key.decode()[7:] for key in recorded.keys("effect:*")} == {r.id for r in refs}
    return int(recorded.get("effects:replayed") or 0)


def test_nothing_is_lost_or_recorded_twice_under_chaos(settings: Any, tmp_path: Path) -> None:
    rng = random.Random(int(os.environ.get("CHAOS_SEED", "7")))
    valkey = ValkeyProcess().start()  # its own server: AOF with appendfsync always
    effects = ValkeyProcess(appendonly=False).start()  # where handlers record their effects
    db = MariaDBProcess().start()
    workers: list[subprocess.Popen[bytes]] = []
    kills = restarts = outages = 0
    try:
        db.query("CREATE DATABASE jq CHARACTER SET utf8mb4")
        env = dict(os.environ, DJANGO_SETTINGS_MODULE="tests.settings", DATABASE_URL=db.url("jq"))
        subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)
        settings.JOBQUEUE = {"URL": valkey.url, "QUEUES": {"default": {}}}
        refs = jobs.chaos_step.using(immediate=True).enqueue_many(
            [(effects.url, rng.uniform(0, 0.02), rng.random()) for _ in range(JOBS)])

        logs: dict[int, Path] = {}

        def worker() -> subprocess.Popen[bytes]:
            log = tmp_path / f"w{len(logs)}.log"
            started = start_worker(valkey.url, "--concurrency", "4", "--lease", "1",
                                   db_url=db.url("jq"), log=log)
            logs[started.pid] = log
            return started

        def serving(w: subprocess.Popen[bytes]) -> bool:
            """Its signal handlers are in: a worker logs "serving" once they are."""
            return w.poll() is not None or "serving" in logs[w.pid].read_text()

        workers = [worker(), worker()]
        deadline = time.monotonic() + SECONDS
        while time.monotonic() < deadline:
            time.sleep(rng.uniform(0.5, 1.5))  # (the pace of the chaos: a random gap between events)
            event = rng.random()
            if event < 0.5:  # a worker is killed outright; a new one takes its place
                victim = workers.pop(rng.randrange(len(workers)))
                victim.send_signal(signal.SIGKILL)
                victim.wait(10)
                kills += 1
            elif event < 0.7:  # Valkey dies and comes back from its append-only file
                valkey.stop(kill=True)
                time.sleep(rng.uniform(0.1, 1.0))  # (how long the outage lasts)
                valkey.start()
                restarts += 1
            elif event < 0.85:  # the database goes away for a while
                db.stop()
                time.sleep(rng.uniform(0.5, 2.0))  # (how long the outage lasts)
                db.start()
                outages += 1
            workers = [w for w in workers if w.poll() is None]  # os._exit in a handler
            while len(workers) < 2:
                workers.append(worker())
        for w in workers:  # (those started last too: a SIGTERM before its handlers would kill it)
            wait_for(lambda w=w: serving(w), timeout=60)
        for w in workers:
            w.send_signal(signal.SIGTERM)
        assert {w.wait(60) for w in workers} <= {0, 3}  # 3: a handler's os._exit got there first
        workers = []
        log = tmp_path / "burst.log"
        for _ in range(60):  # drain what is left; a handler's os._exit may end a burst early
            burst = start_worker(valkey.url, "--burst", "--lease", "1", db_url=db.url("jq"),
                                 log=log)
            try:
                if burst.wait(120) == 0:
                    break
            except subprocess.TimeoutExpired:
                spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
                stacks = subprocess.run([spy, "dump", "--pid", str(burst.pid)], capture_output=True,
                                        text=True).stdout if Path(spy).exists() else ""
                burst.kill()
                raise AssertionError(stacks + log.read_text()[-3000:]) from None
        assert burst.returncode == 0

        rows = db.query("SELECT state, COUNT(*), COUNT(DISTINCT id) FROM jobqueue_job GROUP BY state", "jq")
        by_state = {state: (n, distinct) for state, n, distinct in rows}
        assert by_state == {"succeeded": (JOBS, JOBS)}, by_state  # each once, none lost
        counts = Queue("default").counts()
        assert counts["pending"] == counts["scheduled"] == counts["active"] == 0
        replays = each_effect_once(redis.Redis.from_url(effects.url), refs)
        print(f"\nchaos: {JOBS} jobs, {SECONDS:.0f} s, {kills} worker kills, {restarts} Valkey "
              f"restarts, {outages} database outages, {replays} replays absorbed, lost 0")
    finally:
        for w in workers:
            w.kill()
        valkey.cleanup()
        effects.cleanup()
        db.cleanup()


@pytest.mark.django_db(transaction=True)
def test_a_durable_queue_survives_valkey_losing_everything_mid_run(settings: Any) -> None:
    """Valkey is flushed while two workers drain a durable queue (running jobs, unmirrored
    finishes and all); `jobqueue restore` brings back every unfinished row, and every job ends
    succeeded exactly once in the database, its effect recorded once."""
    from ..workers import manage

    valkey = ValkeyProcess().start()
    effects = ValkeyProcess(appendonly=False).start()
    workers: list[subprocess.Popen[bytes]] = []
    jobs_n = min(JOBS, 600)
    try:
        settings.JOBQUEUE = {"URL": valkey.url, "QUEUES": {"default": {}, "durable": {"durable": True}}}
        rng = random.Random(11)
        refs = jobs.chaos_step.using(queue="durable", immediate=True).enqueue_many(
            [(effects.url, rng.uniform(0, 0.01), 0.5) for _ in range(jobs_n)])
        workers = [start_worker(valkey.url, "--queues", "durable", "--concurrency", "4")
                   for _ in range(2)]
        recorded = redis.Redis.from_url(effects.url)
        wait_for(lambda: len(recorded.keys("effect:*")) >= jobs_n // 3, timeout=60)
        redis.Redis.from_url(valkey.url).flushall()  # Valkey lost its data under the workers
        restored = manage("jobqueue", "restore", url=valkey.url)
        assert restored.returncode == 0, restored.stderr
        # The workers run restored jobs before they stop (Valkey's counts began again at the
        # flush: a success counted now is of a job claimed after the restore).
        wait_for(lambda: Queue("durable").counts()["succeeded"] > 0, timeout=60)
        for w in workers:
            w.send_signal(signal.SIGTERM)
        assert {w.wait(60) for w in workers} == {0}
        workers = []
        # Rows the flush took before they were mirrored are still unfinished in the database:
        # restore again, then drain.
        assert manage("jobqueue", "restore", url=valkey.url).returncode == 0
        assert start_worker(valkey.url, "--queues", "durable", "--burst").wait(120) == 0
        from jobqueue.models import Job

        states = dict(Job.objects.filter(queue="durable").values_list("id", "state"))
        assert states == {ref.id: "succeeded" for ref in refs}
        replays = each_effect_once(recorded, refs)
        print(f"\nflush under a durable queue: {jobs_n} jobs, {replays} replays absorbed, "
              f"{restored.stdout.strip()}, lost 0")
    finally:
        for w in workers:
            w.kill()
        valkey.cleanup()
        effects.cleanup()
