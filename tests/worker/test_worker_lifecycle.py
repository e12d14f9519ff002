"""The real runworker in subprocesses, against real Valkey and the real test database: jobs
run and recorded, signals, outages, supervision, isolation between queues."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from jobqueue import Queue, enqueue, get_job
from jobqueue.models import Job
from tests.jobapp import jobs
from tests.servers import MariaDBProcess, ValkeyProcess
from tests.workers import ROOT, database_url, run_burst, start_worker, stop_twice, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def states() -> Counter:
    return Counter(Job.objects.values_list("state", flat=True))


def test_200_jobs_round_trip_into_the_mirror(valkey_server: ValkeyProcess) -> None:
    refs = jobs.add.enqueue_many([(i, i) for i in range(200)])
    assert run_burst(valkey_server.url, "--concurrency", "8") == 0
    rows = {row.id: row for row in Job.objects.all()}
    assert len(rows) == 200 and states() == {"succeeded": 200}
    assert all(rows[r.id].result == 2 * i for i, r in enumerate(refs))
    info = get_job(refs[7].id)
    assert info and info.state == "succeeded" and info.result == 14


def test_priorities_lanes_delays_retries_dead_and_unique_keys(
    valkey_server: ValkeyProcess, tmp_path: Path
) -> None:
    order = tmp_path / "order.txt"
    Queue("default").pause()  # enqueue everything before the worker sees any of it
    for p in (0, 5, -5, 5):
        jobs.append_line.using(priority=p).enqueue(str(order), f"p{p}")
    # Due well after the worker (a subprocess: 1–2 s to start on a slow machine) has run the rest.
    later = jobs.append_line.using(delay=4.0).enqueue(str(order), "delayed")
    fails = jobs.always_fails.enqueue("boom")
    first = jobs.add.using(unique_key="k1").enqueue(1, 1)
    dup = jobs.add.using(unique_key="k1").enqueue(2, 2)
    laned = [jobs.add.using(lane=f"player-{i % 3}").enqueue(i, 0) for i in range(9)]
    Queue("default").resume()
    assert run_burst(valkey_server.url, "--concurrency", "1") == 0
    assert order.read_text().split() == ["p5", "p5", "p0", "p-5", "delayed"]
    assert dup.id == first.id and Job.objects.get(pk=first.id).result == 2
    dead = Job.objects.get(pk=fails.id)
    assert dead.state == "dead" and dead.attempts == 2 and "ValueError: boom" in dead.last_error
    assert Job.objects.get(pk=later.id).state == "succeeded"
    assert all(Job.objects.get(pk=r.id).lane.startswith("player-") for r in laned)


def test_bad_jobs_go_dead_with_a_reason_and_the_worker_lives_on(valkey_server: ValkeyProcess) -> None:
    unknown = enqueue("tests.jobapp.jobs.nope", args=[1])
    bad_result = jobs.unencodable.enqueue()
    corrupt = jobs.add.enqueue(1, 2)
    Queue("default").client.hset(f"emq:{{default}}:job:{corrupt.id}", "payload", "{garbage")
    not_a_call = Queue("default").enqueue(["just", "a", "list"])
    fine = jobs.add.enqueue(2, 3)
    assert run_burst(valkey_server.url) == 0
    rows = {row.id: row for row in Job.objects.all()}
    assert "tests.jobapp.jobs.nope" in rows[unknown.id].last_error and rows[unknown.id].attempts == 1
    assert "not JSON-serialisable" in rows[bad_result.id].last_error
    assert "corrupt" in rows[corrupt.id].last_error and rows[corrupt.id].payload == "{garbage"
    assert "payload must be" in rows[not_a_call.id].last_error
    assert {rows[i].state for i in (unknown.id, bad_result.id, corrupt.id, not_a_call.id)} == {"dead"}
    assert rows[fine.id].state == "succeeded"


def test_a_crash_mid_job_resumes_from_its_checkpoint(valkey_server: ValkeyProcess) -> None:
    ref = jobs.crash_once.enqueue()
    crashed = start_worker(valkey_server.url, "--lease", "1")
    assert crashed.wait(30) == 1  # the handler took the whole worker down with os._exit(1)
    assert run_burst(valkey_server.url, "--lease", "1") == 0
    row = Job.objects.get(pk=ref.id)
    assert row.state == "succeeded" and row.attempts == 2
    assert row.result == {"resumed_from": {"step": 1, "attempt": 1}, "attempt": 2}


def test_sigkill_loses_nothing_and_records_nothing_twice(valkey_server: ValkeyProcess) -> None:
    refs = jobs.sleep.enqueue_many([(0.01,)] * 600)
    queue = Queue("default")
    victim = start_worker(valkey_server.url, "--concurrency", "8", "--lease", "2")
    wait_for(lambda: queue.counts()["succeeded"] >= 100)
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    assert run_burst(valkey_server.url, "--concurrency", "8", "--lease", "2") == 0
    rows = Job.objects.filter(pk__in=[r.id for r in refs])
    assert rows.count() == 600 and states() == {"succeeded": 600}
    assert queue.counts()["active"] == queue.counts()["pending"] == 0


def test_sigterm_lets_the_running_job_finish_and_exits_0(valkey_server: ValkeyProcess) -> None:
    ref = jobs.sleep.enqueue(3)
    worker = start_worker(valkey_server.url)
    wait_for(lambda: (get_job(ref.id) or ref).state == "active")  # type: ignore[union-attr]
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(20) == 0
    info = get_job(ref.id)
    assert info and info.state == "succeeded" and info.attempts == 1


def test_second_signal_releases_without_charging_the_budget(valkey_server: ValkeyProcess,
                                                            tmp_path: Path) -> None:
    ref = jobs.sleep.using(max_attempts=1).enqueue(30)
    log = tmp_path / "worker.log"
    worker = start_worker(valkey_server.url, log=log)
    wait_for(lambda: (get_job(ref.id) or ref).state == "active")  # type: ignore[union-attr]
    stop_twice(worker, log)
    assert worker.wait(10) == 0
    info = get_job(ref.id)
    assert info and info.state == "pending" and info.attempts == 1  # back, budget intact


def test_a_rate_limited_queue_starts_no_more_than_its_bucket_allows(
        valkey_server: ValkeyProcess) -> None:
    limited = jobs.noop.using(queue="limited").enqueue_many([()] * 30)  # rate "10/s"
    others = jobs.noop.enqueue_many([()] * 20)
    started = time.monotonic()
    assert run_burst(valkey_server.url, "--queues", "limited,default", "--concurrency", "4") == 0
    assert time.monotonic() - started >= 1.8  # 30 jobs: 10 at once, then 10 a second
    starts = sorted(get_job(r.id, queue="limited").started_at.timestamp()  # type: ignore[union-attr]
                    for r in limited)
    # A bucket of 10 refilled at 10 a second: any k successive starts span ≥ (k - 10) / 10 s.
    for i in range(len(starts)):
        for j in range(i + 10, len(starts)):
            assert starts[j] - starts[i] >= (j - i + 1 - 10) / 10 - 0.002, (i, j)
    # Meanwhile the worker served its other queue: those were done within the first second.
    last_other = max(get_job(r.id).finished_at.timestamp() for r in others)  # type: ignore[union-attr]
    assert last_other < starts[-1] - 0.5


@pytest.mark.parametrize("mode", [[], ["--processes"]])
def test_a_running_job_sees_its_cancel_and_is_recorded_cancelled(valkey_server: ValkeyProcess,
                                                                  mode: list[str]) -> None:
    ref = jobs.cancellable.enqueue(60)
    worker = start_worker(valkey_server.url, *mode)
    try:
        wait_for(lambda: (get_job(ref.id) or ref).state == "active")  # type: ignore[union-attr]
        assert Queue("default").cancel(ref.id) == "active"  # flagged: the handler decides
        wait_for(lambda: (get_job(ref.id) or ref).state == "cancelled", timeout=10)  # type: ignore[union-attr]
        info = get_job(ref.id)
        assert info and "cancelled while it ran" in info.last_error and info.attempts == 1
        done = jobs.cancellable.enqueue(0.2)  # a job nobody cancels still finishes
        wait_for(lambda: (get_job(done.id) or done).state == "succeeded")  # type: ignore[union-attr]
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(20) == 0


def test_a_job_running_ten_times_its_lease_is_never_reaped(valkey_server: ValkeyProcess) -> None:
    # Reaped over and over for the job's whole run: its lease, renewed, never runs out.
    ref = jobs.sleep.enqueue(3)
    helper = start_worker(valkey_server.url, "--lease", "0.3", "--concurrency", "1")
    wait_for(lambda: (get_job(ref.id) or ref).state == "active")  # type: ignore[union-attr]
    reaps, reaped = 0, 0

    def reap_until_done() -> bool:
        nonlocal reaps, reaped
        reaps, reaped = reaps + 1, reaped + Queue("default").reap()
        return (get_job(ref.id) or ref).state != "active"  # type: ignore[union-attr]

    wait_for(reap_until_done, timeout=30, every=0.05)
    helper.send_signal(signal.SIGTERM)
    assert helper.wait(20) == 0
    info = get_job(ref.id)
    assert reaped == 0 and info and info.state == "succeeded" and info.attempts == 1
    assert reaps >= 10  # (reaped many times over while it ran)


def test_a_valkey_restart_does_not_stop_the_worker(valkey_server: ValkeyProcess,
                                                   tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    worker = start_worker(valkey_server.url, "--concurrency", "4", log=log)
    try:
        first = jobs.add.enqueue_many([(i, 1) for i in range(50)])
        wait_for(lambda: Job.objects.filter(pk__in=[r.id for r in first]).count() == 50)
        valkey_server.stop()
        wait_for(lambda: "Valkey unreachable" in log.read_text())  # (the worker met the outage)
        valkey_server.start()
        second = jobs.add.enqueue_many([(i, 2) for i in range(50)])
        wait_for(lambda: Job.objects.filter(pk__in=[r.id for r in second]).count() == 50)
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(20) == 0
    assert states() == {"succeeded": 100}


def test_retry_later_and_per_queue_options(valkey_server: ValkeyProcess) -> None:
    ref = jobs.retry_later.using(max_attempts=2).enqueue(0.2)
    assert run_burst(valkey_server.url) == 0
    row = Job.objects.get(pk=ref.id)
    assert row.state == "dead" and row.attempts == 2 and row.last_error == "not yet"


@pytest.mark.skipif(not shutil.which("mariadbd"), reason="needs MariaDB's server binaries")
def test_a_mariadb_outage_under_load_loses_no_mirror_row(valkey_server: ValkeyProcess,
                                                         tmp_path: Path) -> None:
    db = MariaDBProcess().start()
    try:
        db.query("CREATE DATABASE jq CHARACTER SET utf8mb4")
        env = dict(os.environ, DJANGO_SETTINGS_MODULE="tests.settings", DATABASE_URL=db.url("jq"))
        subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)
        count = "SELECT COUNT(*), COUNT(DISTINCT id) FROM jobqueue_job WHERE state = 'succeeded'"
        log = tmp_path / "worker.log"
        worker = start_worker(valkey_server.url, "--concurrency", "8", db_url=db.url("jq"), log=log)
        try:
            jobs.sleep.using(immediate=True).enqueue_many([(0.002,)] * 300)
            wait_for(lambda: db.query(count, "jq")[0][0] == 300)
            db.stop()
            jobs.sleep.using(immediate=True).enqueue_many([(0.002,)] * 300)
            wait_for(lambda: Queue("default").counts()["succeeded"] == 600)
            # The mirror fails and backs off while the jobs keep running.
            wait_for(lambda: "the events wait in Valkey" in log.read_text())
            db.start()
            wait_for(lambda: db.query(count, "jq")[0][0] == 600, timeout=60)
        finally:
            worker.send_signal(signal.SIGTERM)
            assert worker.wait(30) == 0
        assert db.query(count, "jq") == ((600, 600),)
    finally:
        db.cleanup()


def test_the_process_pool_runs_jobs_and_survives_a_crashing_one(valkey_server: ValkeyProcess) -> None:
    refs = jobs.add.enqueue_many([(i, 1) for i in range(20)])
    crash = jobs.crash_once.enqueue()  # os._exit in a pool process breaks the pool, not the worker
    coroutine = jobs.async_sleep.enqueue(0)  # (one: asyncio.run in a pool process, on uvloop)
    assert run_burst(valkey_server.url, "--processes", "--concurrency", "2", "--lease", "2") == 0
    assert {Job.objects.get(pk=r.id).result for r in refs} == {i + 1 for i in range(20)}
    assert Job.objects.get(pk=coroutine.id).result["loop"] == "uvloop"
    row = Job.objects.get(pk=crash.id)
    assert row.state == "succeeded" and row.result["resumed_from"] == {"step": 1, "attempt": 1}


def kill_session(session: int) -> bool:
    """End a database session server-side, as a server's `wait_timeout` or restart would (KILL
    in MariaDB, pg_terminate_backend in PostgreSQL); False when it had ended already."""
    from django.db import OperationalError, connection

    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT pg_terminate_backend(%s)", [session])
            return bool(cursor.fetchone()[0])
        try:
            cursor.execute(f"KILL {int(session)}")
        except OperationalError:  # 1094: unknown thread id
            return False
        return True


@pytest.mark.parametrize("mode", [[], ["--processes"]], ids=["threads", "processes"])
@pytest.mark.parametrize("kept", ["", "?conn_max_age=600&conn_health_checks=true"],
                         ids=["closed-after-each-job", "kept-with-health-checks"])
def test_a_job_after_its_database_connection_died_still_runs(valkey_server: ValkeyProcess,
                                                              kept: str, mode: list[str]) -> None:
    """Each job gets a usable connection, as each request does: closed after the job, or kept
    (CONN_MAX_AGE) and checked before the next, so a connection the server dropped while the
    worker idled (wait_timeout, a restart) does not fail the next job; in a pool process too."""
    from django.db import connection

    if connection.vendor not in ("mysql", "postgresql"):
        pytest.skip("needs MariaDB or PostgreSQL")
    worker = start_worker(valkey_server.url, "--concurrency", "1", *mode,
                          db_url=database_url() + kept)
    try:
        first = jobs.database_session.enqueue()
        wait_for(lambda: (get_job(first.id) or first).state == "succeeded", timeout=60)  # type: ignore[union-attr]
        assert kill_session(get_job(first.id).result) == bool(kept)  # type: ignore[union-attr]
        second = jobs.database_session.enqueue()
        wait_for(lambda: (get_job(second.id) or second).state in ("succeeded", "dead"))  # type: ignore[union-attr]
        assert get_job(second.id).state == "succeeded"  # type: ignore[union-attr]
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(20) == 0


def test_the_worker_runs_on_a_valkey_cluster(valkey_cluster: Any, settings: Any) -> None:
    settings.JOBQUEUE = {"URL": valkey_cluster.url, "QUEUES": {"default": {"shards": 3}}}
    Queue("default").client.flushall(target_nodes="primaries")
    refs = jobs.add.enqueue_many([(i, 1) for i in range(90)])
    laned = jobs.add.using(lane="player-1").enqueue(5, 5)
    assert run_burst(valkey_cluster.url, "--concurrency", "4") == 0
    assert Job.objects.filter(state="succeeded").count() == 91
    assert {Job.objects.get(pk=r.id).shard for r in refs} == {0, 1, 2}
    assert Job.objects.get(pk=laned.id).result == 10


def test_workers_stop_on_sigterm_whatever_moment_it_arrives(valkey_server: ValkeyProcess) -> None:
    import random

    workers = [start_worker(valkey_server.url, "--concurrency", "2") for _ in range(8)]
    wait_for(lambda: Queue("default").client.hlen("{emq}:workers") == 8)
    for worker in workers:
        time.sleep(random.uniform(0, 0.3))  # (jitter: the SIGTERM lands at a random moment)
        worker.send_signal(signal.SIGTERM)
    assert [w.wait(15) for w in workers] == [0] * 8


def test_a_worker_for_every_queue_serves_queues_created_after_it_started(
    valkey_server: ValkeyProcess,
) -> None:
    worker = start_worker(valkey_server.url)
    try:
        wait_for(lambda: Queue("default").client.hlen("{emq}:workers") == 1)
        ref = jobs.add.using(queue="latecomer").enqueue(2, 2)
        wait_for(lambda: (get_job(ref.id, queue="latecomer") or ref).state == "succeeded")  # type: ignore[union-attr]
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(20) == 0


def test_sigterm_hands_prefetched_jobs_back_at_once_uncharged(valkey_server: ValkeyProcess) -> None:
    first, second = jobs.sleep.using(max_attempts=1).enqueue_many([(2,), (2,)])
    worker = start_worker(valkey_server.url, "--concurrency", "1", "--prefetch", "1")
    wait_for(lambda: Queue("default").counts()["active"] == 2)  # one running, one prefetched
    worker.send_signal(signal.SIGTERM)
    wait_for(lambda: Queue("default").counts()["pending"] == 1, timeout=1.5)  # before the run ends
    assert worker.wait(20) == 0
    states = {ref.id: get_job(ref.id) for ref in (first, second)}
    assert sorted(i.state for i in states.values()) == ["pending", "succeeded"]  # type: ignore[union-attr]
    waiting = next(i for i in states.values() if i.state == "pending")  # type: ignore[union-attr]
    assert waiting.last_error == "" and waiting.attempts == 1  # released: budget of 1 intact


def test_the_mirror_recreates_a_lost_consumer_group(valkey_server: ValkeyProcess) -> None:
    worker = start_worker(valkey_server.url)
    try:
        first = jobs.add.enqueue(1, 1)
        wait_for(lambda: Job.objects.filter(pk=first.id).exists())
        Queue("default").client.xgroup_destroy("emq:{default}:done", "mirror")
        second = jobs.add.enqueue(2, 2)
        wait_for(lambda: Job.objects.filter(pk=second.id).exists())
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(20) == 0


def test_a_worker_started_before_valkey_waits_for_it(tmp_path: Path) -> None:
    from jobqueue import conf

    late = ValkeyProcess()
    log = tmp_path / "worker.log"
    worker = start_worker(late.url, "--queues", "default", log=log)
    try:
        wait_for(lambda: "unreachable at start" in log.read_text())
        assert worker.poll() is None, "the worker gave up while Valkey was not there yet"
        late.start()
        queue = Queue("default", client=conf.client_for_url(late.url))
        ref = queue.enqueue({"handler": "tests.jobapp.jobs.add", "args": [3, 4], "kwargs": {}})
        wait_for(lambda: queue.get(ref.id).state == "succeeded", timeout=20)  # type: ignore[union-attr]
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(20) == 0
        late.cleanup()


def test_a_worker_starts_and_runs_jobs_while_the_database_is_down(valkey_server: ValkeyProcess) -> None:
    ref = jobs.add.using(immediate=True).enqueue(4, 4)
    worker = start_worker(valkey_server.url, db_url="mysql://root@127.0.0.1:1/unreachable")
    try:
        wait_for(lambda: Queue("default").get(ref.id).state == "succeeded")  # type: ignore[union-attr]
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0
    assert Queue("default").client.xlen("emq:{default}:done") == 1  # waiting for the mirror


def test_a_queues_concurrency_keeps_it_from_taking_every_slot(valkey_server: ValkeyProcess) -> None:
    worker = start_worker(valkey_server.url, "--queues", "isolated,default", "--concurrency", "4")
    try:
        wait_for(lambda: Queue("default").client.hlen("{emq}:workers") == 1)  # (started up)
        slow = jobs.sleep.using(queue="isolated").enqueue_many([(0.5,)] * 4)  # concurrency 1
        quick = jobs.add.enqueue_many([(i, i) for i in range(20)])
        most_held = 0

        def quick_done() -> bool:
            nonlocal most_held
            most_held = max(most_held, Queue("isolated").counts()["active"])
            return all((get_job(r.id) or r).state == "succeeded" for r in quick)  # type: ignore[union-attr]

        wait_for(quick_done, every=0.01)
        # Ordering, not seconds: the slow ones run one at a time (two seconds at least), and
        # the quick ones do not wait for them: at most two of them had finished by then.
        slow_done = sum((get_job(r.id, "isolated") or r).state == "succeeded" for r in slow)  # type: ignore[union-attr]
        wait_for(lambda: all((get_job(r.id, "isolated") or r).state == "succeeded" for r in slow))  # type: ignore[union-attr]
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(20) == 0
    assert most_held <= 1 and slow_done <= 2


def test_a_stop_signal_while_valkey_is_still_unreachable_at_start_exits_0(tmp_path: Path) -> None:
    from jobqueue.embedded import free_port

    log = tmp_path / "worker.log"
    worker = start_worker(f"redis://127.0.0.1:{free_port()}/0", log=log)
    wait_for(lambda: "unreachable at start" in log.read_text())
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(15) == 0
    assert "Traceback" not in log.read_text() and "stopped before Valkey answered" in log.read_text()


def test_workers_n_runs_n_processes_and_restarts_one_that_dies(valkey_server: ValkeyProcess,
                                                             tmp_path: Path) -> None:
    queue = Queue("default")
    log = tmp_path / "supervisor.log"
    supervisor = start_worker(valkey_server.url, "--workers", "2", "--concurrency", "2", log=log)
    try:
        wait_for(lambda: queue.client.hlen("{emq}:workers") == 2)
        names = sorted(queue.client.hkeys("{emq}:workers"))
        assert [n.rsplit("-", 1)[1] for n in names] == ["0", "1"]
        victim = json.loads(queue.client.hget("{emq}:workers", names[0]))["pid"]
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: "exited with code -9" in log.read_text())
        refs = jobs.add.enqueue_many([(i, 1) for i in range(100)])
        wait_for(lambda: queue.counts()["succeeded"] == 100)
        wait_for(lambda: json.loads(queue.client.hget("{emq}:workers", names[0]))["pid"] != victim)
    finally:
        supervisor.send_signal(signal.SIGTERM)
        assert supervisor.wait(30) == 0
    assert queue.client.hlen("{emq}:workers") == 0  # each said goodbye
    assert all((get_job(r.id) or r).state == "succeeded" for r in refs)  # type: ignore[union-attr]


def test_workers_n_forks_its_children_from_the_set_up_supervisor(valkey_server: ValkeyProcess) -> None:
    queue = Queue("default")
    supervisor = start_worker(valkey_server.url, "--workers", "2", "--concurrency", "1")
    try:
        wait_for(lambda: queue.client.hlen("{emq}:workers") == 2)
        pids = [json.loads(row)["pid"] for row in queue.client.hvals("{emq}:workers")]
        command = Path(f"/proc/{supervisor.pid}/cmdline").read_bytes()
        # A forked child keeps the supervisor's command line; a new process has its own.
        assert [Path(f"/proc/{pid}/cmdline").read_bytes() for pid in pids] == [command, command]
    finally:
        supervisor.send_signal(signal.SIGTERM)
        assert supervisor.wait(30) == 0


def test_the_worker_mirrors_from_a_process_of_its_own(valkey_server: ValkeyProcess) -> None:
    refs = jobs.add.enqueue_many([(i, 1) for i in range(50)])
    worker = start_worker(valkey_server.url, "--concurrency", "2")
    try:
        ids = [r.id for r in refs]
        wait_for(lambda: Job.objects.filter(pk__in=ids, state="succeeded").count() == 50)
        [mirror] = Path(f"/proc/{worker.pid}/task/{worker.pid}/children").read_text().split()
        # Forked (the worker's command line), and it outlives the worker's stop only to make its
        # final pass: the worker waits for it.
        command = Path(f"/proc/{worker.pid}/cmdline").read_bytes()
        assert Path(f"/proc/{mirror}/cmdline").read_bytes() == command
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0
    assert not Path(f"/proc/{mirror}").exists()


def test_a_burst_with_several_workers_exits_0_when_all_are_done(valkey_server: ValkeyProcess) -> None:
    refs = jobs.add.enqueue_many([(i, i) for i in range(300)])
    assert run_burst(valkey_server.url, "--workers", "2", "--concurrency", "4") == 0
    assert Job.objects.filter(pk__in=[r.id for r in refs], state="succeeded").count() == 300


def test_a_busy_worker_still_serves_a_queue_it_found_empty_moments_ago(
        valkey_server: ValkeyProcess) -> None:
    busy = jobs.sleep.enqueue_many([(0.01,)] * 300)
    worker = start_worker(valkey_server.url, "--queues", "default,isolated", "--concurrency", "2")
    try:
        wait_for(lambda: Queue("default").counts()["succeeded"] >= 20)  # isolated was found empty
        late = jobs.add.using(queue="isolated").enqueue(1, 1)
        wait_for(lambda: (get_job(late.id, queue="isolated") or late).state == "succeeded",  # type: ignore[union-attr]
                 timeout=10)
        assert Queue("default").counts()["succeeded"] < len(busy)  # served while still busy
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0


def test_a_burst_whose_database_refuses_the_rows_gives_up_after_its_grace(
        valkey_server: ValkeyProcess, tmp_path: Path) -> None:
    """A burst run insists on mirroring what is left, but not forever: a database that refuses
    every row (here: never migrated) is given up after `--grace`, saying why and what waits."""
    ref = jobs.add.using(immediate=True).enqueue(2, 3)
    log = tmp_path / "worker.log"
    started = time.monotonic()
    code = run_burst(valkey_server.url, "--queues", "default", "--grace", "2",
                     db_url=f"sqlite:///{tmp_path / 'empty.db'}", log=log, timeout=60)
    assert time.monotonic() - started < 45
    assert Queue("default").get(ref.id).state == "succeeded"  # type: ignore[union-attr]
    text = log.read_text()
    assert "mirror gave up" in text and "1 event(s) wait in Valkey" in text, text[-2000:]
    assert code == 1  # a burst that could not record what it ran is not a success
    assert Queue("default").client.xlen("emq:{default}:done") == 1  # for the next mirror
