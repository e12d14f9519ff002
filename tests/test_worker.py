"""The real runworker in subprocesses, against real Valkey and the real test database."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from jobqueue import Queue, enqueue, get_job, keys
from jobqueue.models import Job
from jobqueue.worker.core import IDLE_WAIT
from tests.jobapp import jobs

from .servers import MariaDBProcess, ValkeyProcess
from .workers import ROOT, database_url, run_burst, start_worker, wait_for

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


def test_a_server_that_refuses_the_offer_still_serves_an_idle_worker_by_tokens(
        settings: Any, tmp_path: Path) -> None:
    # A server without HSETEX (older than Valkey 9 or Redis 8), or an ACL that denies it: the
    # worker says so once and stops offering; its idle waits take wake tokens, as before.
    server = ValkeyProcess().start()
    try:
        import redis

        redis.Redis(port=server.port).execute_command(
            "ACL", "SETUSER", "default", "on", "nopass", "~*", "&*", "+@all", "-hsetex")
        settings.JOBQUEUE = {**settings.JOBQUEUE, "URL": server.url}
        log = tmp_path / "worker.log"
        worker = start_worker(server.url, "--queues", "default", log=log)
        try:
            wait_for(lambda: "takes no offer" in log.read_text())
            for n in range(3):
                ref = jobs.add.enqueue(n, 1)
                wait_for(lambda ref=ref: (get_job(ref.id) or ref).state == "succeeded")  # type: ignore[union-attr]
        finally:
            worker.send_signal(signal.SIGTERM)
            assert worker.wait(20) == 0
        assert log.read_text().count("takes no offer") == 1
    finally:
        server.cleanup()


def test_a_job_handed_to_a_worker_killed_while_idle_runs_once_its_lease_ends(
        valkey_server: ValkeyProcess) -> None:
    # A worker killed in its idle wait stays offered until that wait would have ended: a job
    # handed to it then is leased to it, as a claimed job is, and runs once the lease ends.
    queue = Queue("default")
    idle = queue.shard(0).key("idle")
    victim = start_worker(valkey_server.url, "--lease", "2")

    def fresh_offer() -> bool:  # (one with seconds to run, so that it is still there below)
        names = queue.client.hkeys(idle)
        return bool(names) and queue.client.execute_command(
            "HPTTL", idle, "FIELDS", 1, names[0])[0] > 3000

    wait_for(fresh_offer, every=0.05)
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    ref = jobs.add.enqueue(2, 2)
    assert (get_job(ref.id) or ref).state == "active"  # type: ignore[union-attr]
    assert run_burst(valkey_server.url, "--lease", "2") == 0
    info = get_job(ref.id)
    assert info and info.state == "succeeded" and info.attempts == 2 and info.result == 4
    assert queue.client.keys(queue.shard(0).hand("*")) == []  # (the dead one's list expired)


def test_sigterm_lets_the_running_job_finish_and_exits_0(valkey_server: ValkeyProcess) -> None:
    ref = jobs.sleep.enqueue(3)
    worker = start_worker(valkey_server.url)
    wait_for(lambda: (get_job(ref.id) or ref).state == "active")  # type: ignore[union-attr]
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(20) == 0
    info = get_job(ref.id)
    assert info and info.state == "succeeded" and info.attempts == 1


def test_second_signal_releases_without_charging_the_budget(valkey_server: ValkeyProcess) -> None:
    ref = jobs.sleep.using(max_attempts=1).enqueue(30)
    worker = start_worker(valkey_server.url)
    wait_for(lambda: (get_job(ref.id) or ref).state == "active")  # type: ignore[union-attr]
    worker.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    worker.send_signal(signal.SIGTERM)
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


def test_an_async_handler_saves_checkpoints_and_sees_its_cancel_awaiting(
        valkey_server: ValkeyProcess) -> None:
    ref = jobs.acancellable.enqueue(60)
    other = jobs.acancellable.enqueue(0.5)  # on the same loop meanwhile: never held up
    worker = start_worker(valkey_server.url)
    try:
        wait_for(lambda: ((get_job(ref.id) or ref).checkpoint or {}).get("step", 0) >= 3)  # type: ignore[union-attr]
        wait_for(lambda: (get_job(other.id) or other).state == "succeeded", timeout=10)  # type: ignore[union-attr]
        assert Queue("default").cancel(ref.id) == "active"
        wait_for(lambda: (get_job(ref.id) or ref).state == "cancelled", timeout=10)  # type: ignore[union-attr]
        info = get_job(ref.id)
        assert info and "cancelled while it ran" in info.last_error and info.checkpoint["step"] >= 3
        assert (get_job(other.id) or other).result >= 5  # type: ignore[union-attr, operator]
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(20) == 0


def test_an_async_handler_that_blocks_the_loop_is_named_in_the_log(
        valkey_server: ValkeyProcess, tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    ref = jobs.blocks_the_loop.enqueue(2.5)
    worker = start_worker(valkey_server.url, log=log)
    try:
        wait_for(lambda: (get_job(ref.id) or ref).state == "succeeded", timeout=20)  # type: ignore[union-attr]
        wait_for(lambda: "blocked the worker's event loop" in log.read_text(), timeout=5)
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(20) == 0
    text = log.read_text()
    assert "in blocks_the_loop" in text and "time.sleep(seconds)" in text  # the blocking call
    assert text.count("blocked the worker's event loop") == 1  # once per stall


def test_a_job_running_ten_times_its_lease_is_never_reaped(valkey_server: ValkeyProcess) -> None:
    ref = jobs.sleep.enqueue(3)
    helper = start_worker(valkey_server.url, "--lease", "0.3", "--concurrency", "1")
    wait_for(lambda: (get_job(ref.id) or ref).state == "active")  # type: ignore[union-attr]
    reaped = sum(Queue("default").reap() for _ in range(25) if time.sleep(0.1) is None)
    helper.send_signal(signal.SIGTERM)
    assert helper.wait(20) == 0
    info = get_job(ref.id)
    assert reaped == 0 and info and info.state == "succeeded" and info.attempts == 1


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_an_idle_worker_sleeps_and_wakes_at_once(valkey_server: ValkeyProcess) -> None:
    """Counted, not timed: an idle worker sends about a hundred commands a second on these
    five queues (its maintenance turn, one claim per queue and its mirror's reads, each once a
    second; its waiters block for seconds). A loop that polls sends hundreds more; a thread
    that spins uses a whole core, a quarter of which is a wide bound for a slow machine."""
    worker = start_worker(valkey_server.url)
    client = Queue("default").client
    try:
        wait_for(lambda: client.hlen("{emq}:workers") == 1)
        time.sleep(1)
        client.config_resetstat()
        before, started = _cpu_seconds(worker.pid), time.monotonic()
        time.sleep(4)
        seconds = time.monotonic() - started
        idle_share = (_cpu_seconds(worker.pid) - before) / seconds
        stats = client.info("commandstats")
        sent = sum(s["calls"] for name, s in stats.items() if name not in (
            "cmdstat_config|resetstat", "cmdstat_info"))
        assert sent / seconds < 150, f"an idle worker sent {sent / seconds:.0f} commands a second"
        waits = stats.get("cmdstat_blpop", {}).get("calls", 0)
        assert waits <= 5 * 2, f"five waiters waited {waits} times in 4 s"
        assert idle_share < 0.25, f"idle worker used {idle_share:.1%} of a core"
        started = time.monotonic()
        ref = jobs.noop.enqueue()
        wait_for(lambda: (get_job(ref.id) or ref).state == "succeeded", every=0.002)  # type: ignore[union-attr]
        latency = time.monotonic() - started
        assert latency < 0.5, f"an idle worker took {latency:.3f}s to run a new job"
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(20) == 0


class _Monitor:
    """Every command clients send to Valkey, as MONITOR reports it: (connection, command)."""

    def __init__(self, client: Any) -> None:
        self.seen: list[tuple[str, str]] = []
        self._monitor = client.monitor()
        self._monitor.__enter__()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        with contextlib.suppress(Exception):  # (the connection closed: the test is over)
            while True:
                got = self._monitor.next_command()
                if got["client_address"] != "lua":  # (not the commands scripts call)
                    self.seen.append((f"{got['client_address']}:{got['client_port']}",
                                      " ".join(got["command"].split()[:2]).upper()))

    def close(self) -> None:
        self._monitor.connection.disconnect()

    def waiters(self, since: int = 0) -> dict[str, list[str]]:
        """Per connection that waited on a wake list: the commands it sent (from `since`)."""
        waiting = {conn for conn, command in self.seen if command.startswith("BLPOP")}
        return {conn: [command for c, command in self.seen[since:] if c == conn]
                for conn in waiting}


def _offers(commands: list[str]) -> bool:
    """Whether a waiter offered itself for hand-offs (see `Queue.wait_commands`)."""
    return any(command.startswith("HSETEX") for command in commands)


def test_an_idle_worker_offers_itself_and_takes_the_job_an_enqueue_hands_over(
        valkey_server: ValkeyProcess) -> None:
    client = Queue("default").client
    client.config_resetstat()  # (the server is shared: earlier tests' workers used it)
    monitor = _Monitor(client)
    worker = start_worker(valkey_server.url, "--queues", "default", "--concurrency", "2")
    try:
        # Idle: the waiter's connection offers the worker, then waits on its list and the wake
        # list; the enqueue leases the job to it, so no claim is sent.
        wait_for(lambda: [_offers(c) for c in monitor.waiters().values()] == [True])
        offered = Queue("default").shard(0).key("idle")
        seen = []
        for _ in range(25):  # 2.5 s: the offer outlasts the idle main loop's claims (1 a second)
            seen.append(client.hlen(offered))
            time.sleep(0.1)
        assert seen.count(1) >= 23, seen  # (renewed every IDLE_WAIT: gone a moment at most)
        first = jobs.add.enqueue(1, 2)
        wait_for(lambda: (get_job(first.id) or first).state == "succeeded")  # type: ignore[union-attr]
        (waiter,) = monitor.waiters()
        assert not any(c == waiter and command.startswith("EVALSHA") for c, command in monitor.seen)
        ref = jobs.sleep.enqueue(0.5)
        # Busy: a token, then a claim of what there is room for (from other connections); the
        # waiter tells its connection's id so that the worker can end that wait.
        wait_for(lambda: [("CLIENT ID" in c) for c in monitor.waiters().values()] == [True])
        wait_for(lambda: (get_job(ref.id) or ref).state == "succeeded")  # type: ignore[union-attr]
        # Idle again: the worker unblocks that wait, and the waiter offers itself again.
        wait_for(lambda: client.info("commandstats").get("cmdstat_client|unblock"))
        unblocked = len(monitor.seen)  # (MONITOR does not show CLIENT UNBLOCK itself)
        wait_for(lambda: [_offers(c) for c in monitor.waiters(unblocked).values()] == [True])
        late = jobs.add.enqueue(2, 3)
        wait_for(lambda: (get_job(late.id) or late).state == "succeeded")  # type: ignore[union-attr]
    finally:
        monitor.close()
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(20) == 0
    assert Queue("default").counts()["active"] == 0
    assert client.hlen(Queue("default").shard(0).key("idle")) == 0  # (a stopped worker withdraws)


def test_once_an_async_job_ran_the_idle_wait_runs_on_the_event_loop(
        valkey_server: ValkeyProcess) -> None:
    # An async job claimed by a wait on the worker's event loop starts there, without a hand-over
    # from the waiter's thread: that wait has a connection of its own (the loop's).
    client = Queue("default").client
    monitor = _Monitor(client)
    worker = start_worker(valkey_server.url, "--queues", "default", "--concurrency", "2")
    try:
        wait_for(lambda: [_offers(c) for c in monitor.waiters().values()] == [True])
        (threaded,) = monitor.waiters()
        first = jobs.async_sleep.enqueue(0)
        wait_for(lambda: (get_job(first.id) or first).state == "succeeded")  # type: ignore[union-attr]
        since = len(monitor.seen)
        wait_for(lambda: any(_offers(c) for conn, c in monitor.waiters(since).items()
                             if conn != threaded))
        settled = len(monitor.seen)
        second = jobs.async_sleep.enqueue(0)
        wait_for(lambda: (get_job(second.id) or second).state == "succeeded")  # type: ignore[union-attr]
        time.sleep(1.5)  # (an idle wait of the thread's would have run out and been sent again)
        after = monitor.waiters(settled)
        assert not _offers(after[threaded])  # (it waits the plain way while a job runs)
        assert any(_offers(c) for conn, c in after.items() if conn != threaded)
    finally:
        monitor.close()
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(20) == 0
    assert get_job(second.id).result["done"] == 2  # type: ignore[union-attr]


def test_a_stopping_worker_ends_its_idle_waits_at_once(valkey_server: ValkeyProcess) -> None:
    # An idle wait lasts up to IDLE_WAIT unless a token or a stop ends it: a worker stopped just
    # after it went back to waiting exits well before that, on a waiter's thread (before any
    # async job) and on the event loop (after one).
    for job, args in ((jobs.noop, ()), (jobs.async_sleep, (0,))):
        worker = start_worker(valkey_server.url, "--queues", "default")
        ref = job.enqueue(*args)
        wait_for(lambda ref=ref: (get_job(ref.id) or ref).state == "succeeded")  # type: ignore[union-attr]
        time.sleep(0.3)  # (waiting again, with IDLE_WAIT ahead)
        started = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(20) == 0
        assert time.monotonic() - started < IDLE_WAIT - 1.5, f"{job.name} left its wait late"


def test_a_capped_queues_waiter_never_offers_itself(valkey_server: ValkeyProcess) -> None:
    # A job handed over could go beyond the queue's `concurrency` cap (only the claim script
    # counts it): its waiter always waits for a token (and an idle worker has no such wait to
    # end).
    client = Queue("isolated").client
    client.config_resetstat()  # (the server is shared: earlier tests' workers used it)
    monitor = _Monitor(client)
    worker = start_worker(valkey_server.url, "--queues", "isolated", "--concurrency", "2")
    try:
        wait_for(lambda: len(monitor.waiters()) >= 1)
        ref = jobs.add.using(queue="isolated").enqueue(1, 2)
        wait_for(lambda: (get_job(ref.id, queue="isolated") or ref).state == "succeeded")  # type: ignore[union-attr]
        time.sleep(2.5)  # (two of the waiter's 1 s waits run out)
        # (its plain waits borrow any of the client's connections: there may be several)
        assert monitor.waiters() and not any(map(_offers, monitor.waiters().values()))
        assert "cmdstat_client|unblock" not in client.info("commandstats")
    finally:
        monitor.close()
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(20) == 0


def test_a_valkey_restart_does_not_stop_the_worker(valkey_server: ValkeyProcess) -> None:
    worker = start_worker(valkey_server.url, "--concurrency", "4")
    try:
        first = jobs.add.enqueue_many([(i, 1) for i in range(50)])
        wait_for(lambda: Job.objects.filter(pk__in=[r.id for r in first]).count() == 50)
        valkey_server.stop()
        time.sleep(1)
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
def test_a_mariadb_outage_under_load_loses_no_mirror_row(valkey_server: ValkeyProcess) -> None:
    db = MariaDBProcess().start()
    try:
        db.query("CREATE DATABASE jq CHARACTER SET utf8mb4")
        env = dict(os.environ, DJANGO_SETTINGS_MODULE="tests.settings", DATABASE_URL=db.url("jq"))
        subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)
        count = "SELECT COUNT(*), COUNT(DISTINCT id) FROM jobqueue_job WHERE state = 'succeeded'"
        worker = start_worker(valkey_server.url, "--concurrency", "8", db_url=db.url("jq"))
        try:
            jobs.sleep.using(immediate=True).enqueue_many([(0.002,)] * 300)
            wait_for(lambda: db.query(count, "jq")[0][0] == 300)
            db.stop()
            jobs.sleep.using(immediate=True).enqueue_many([(0.002,)] * 300)
            wait_for(lambda: Queue("default").counts()["succeeded"] == 600)
            time.sleep(2)  # the mirror fails and backs off while the jobs keep running
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


@pytest.mark.parametrize("kept", ["", "?conn_max_age=600&conn_health_checks=true"],
                         ids=["closed-after-each-job", "kept-with-health-checks"])
def test_a_job_after_its_database_connection_died_still_runs(valkey_server: ValkeyProcess,
                                                              kept: str) -> None:
    """Each job gets a usable connection, as each request does: closed after the job, or kept
    (CONN_MAX_AGE) and checked before the next, so a connection the server dropped while the
    worker idled (wait_timeout, a restart) does not fail the next job."""
    from django.db import OperationalError, connection

    if connection.vendor != "mysql":
        pytest.skip("needs MariaDB")
    worker = start_worker(valkey_server.url, "--concurrency", "1", db_url=database_url() + kept)
    try:
        first = jobs.database_session.enqueue()
        wait_for(lambda: (get_job(first.id) or first).state == "succeeded")  # type: ignore[union-attr]
        session = get_job(first.id).result  # type: ignore[union-attr]
        try:
            with connection.cursor() as cursor:
                cursor.execute(f"KILL {int(session)}")  # as the server's wait_timeout would
        except OperationalError:  # 1094: already closed after its job
            assert not kept
        second = jobs.database_session.enqueue()
        wait_for(lambda: (get_job(second.id) or second).state in ("succeeded", "dead"))  # type: ignore[union-attr]
        assert get_job(second.id).state == "succeeded"  # type: ignore[union-attr]
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(20) == 0


def test_async_handlers_share_one_event_loop_and_run_side_by_side(
        valkey_server: ValkeyProcess) -> None:
    refs = jobs.async_sleep.enqueue_many([(1.0,)] * 40)
    fails = jobs.async_fails.enqueue("boom")
    retried = jobs.async_fails.enqueue("retry")
    plain = jobs.add.enqueue(2, 2)  # a plain handler beside them still runs on a thread
    started = time.monotonic()
    assert run_burst(valkey_server.url, "--concurrency", "40") == 0
    results = [Job.objects.get(pk=r.id).result for r in refs]
    assert time.monotonic() - started < 25  # 40 one-second sleeps at once, not one after another
    assert max(r["started"] for r in results) - min(r["started"] for r in results) < 1.0
    assert len({r["thread"] for r in results}) == 1  # one loop thread ran them all
    assert {r["loop"] for r in results} == {"uvloop"}  # (installed: the default)
    assert sorted(r["done"] for r in results) == list(range(1, 41))  # one client, kept
    dead = Job.objects.get(pk=fails.id)
    assert dead.state == "dead" and dead.attempts == 2
    assert "ValueError: async boom on attempt 2" in dead.last_error
    assert Job.objects.get(pk=retried.id).state == "dead"
    assert Job.objects.get(pk=plain.id).result == 4


def test_event_loop_asyncio_runs_async_handlers_on_asyncios_own_loop(
        valkey_server: ValkeyProcess) -> None:
    refs = jobs.async_sleep.enqueue_many([(0,)] * 3)
    assert run_burst(valkey_server.url, env={"JOBQUEUE_TEST_EVENT_LOOP": "asyncio"}) == 0
    assert {Job.objects.get(pk=r.id).result["loop"] for r in refs} == {"asyncio"}


def test_the_worker_tunes_the_interpreter_for_its_threads(valkey_server: ValkeyProcess) -> None:
    # Start-up's objects are hidden from the garbage collector (full collections over Django's
    # objects were most of a no-op job's time in it); once async handlers run, the GIL changes
    # hands sooner (the main loop and the event loop each wait for sockets in turn).
    plain = jobs.interpreter_state.enqueue()
    assert run_burst(valkey_server.url) == 0
    state = Job.objects.get(pk=plain.id).result
    assert state["frozen"] > 10_000 and state["threshold"][0] == 10_000
    assert state["switch"] == 0.005  # (plain handlers only: the default)
    coroutine = jobs.ainterpreter_state.enqueue()
    assert run_burst(valkey_server.url) == 0
    assert Job.objects.get(pk=coroutine.id).result["switch"] == pytest.approx(0.0002)


def test_a_stopping_worker_lets_async_jobs_finish_or_cancels_and_releases_them(
        valkey_server: ValkeyProcess) -> None:
    short = jobs.async_sleep.enqueue(2)
    worker = start_worker(valkey_server.url)
    wait_for(lambda: (get_job(short.id) or short).state == "active")  # type: ignore[union-attr]
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(20) == 0
    assert (info := get_job(short.id)) and info.state == "succeeded" and info.attempts == 1
    long = jobs.async_sleep.using(max_attempts=1).enqueue(60)
    worker = start_worker(valkey_server.url)
    wait_for(lambda: (get_job(long.id) or long).state == "active")  # type: ignore[union-attr]
    worker.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    worker.send_signal(signal.SIGTERM)  # the second: release now; the task is cancelled
    assert worker.wait(10) == 0
    assert (info := get_job(long.id)) and info.state == "pending" and info.attempts == 1


def test_the_worker_runs_on_a_valkey_cluster(valkey_cluster: Any, settings: Any) -> None:
    settings.JOBQUEUE = {"URL": valkey_cluster.url, "QUEUES": {"default": {"shards": 3}}}
    Queue("default").client.flushall(target_nodes="primaries")
    refs = jobs.add.enqueue_many([(i, 1) for i in range(90)])
    laned = jobs.add.using(lane="player-1").enqueue(5, 5)
    assert run_burst(valkey_cluster.url, "--concurrency", "4") == 0
    assert Job.objects.filter(state="succeeded").count() == 91
    assert {Job.objects.get(pk=r.id).shard for r in refs} == {0, 1, 2}
    assert Job.objects.get(pk=laned.id).result == 10


def test_an_idle_worker_on_a_valkey_cluster_offers_itself_on_each_shards_node(
        valkey_cluster: Any, settings: Any) -> None:
    # Each waiter keeps a connection to the node that holds its shard: the offer and the wait go
    # there, so a cluster's idle worker takes handed jobs as a standalone one does.
    settings.JOBQUEUE = {"URL": valkey_cluster.url, "QUEUES": {"default": {"shards": 3}}}
    queue = Queue("default")
    queue.client.flushall(target_nodes="primaries")
    idle = [queue.shard(i).key("idle") for i in range(3)]
    assert len({keys.slot(key) for key in idle}) == 3
    first = jobs.add.enqueue(0, 0)  # (the queue's three shards are registered: the worker reads them)
    worker = start_worker(valkey_cluster.url, "--concurrency", "4")
    try:
        wait_for(lambda: [queue.client.hlen(key) for key in idle] == [1, 1, 1])
        refs = [first, *(jobs.add.enqueue(i, 1) for i in range(30))]  # (by id: every shard)
        wait_for(lambda: Job.objects.filter(state="succeeded").count() == 31)
        assert {Job.objects.get(pk=r.id).shard for r in refs} == {0, 1, 2}
        assert all(Job.objects.get(pk=r.id).attempts == 1 for r in refs)
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(20) == 0
    assert [queue.client.hlen(key) for key in idle] == [0, 0, 0]  # (withdrawn on stop)


def test_workers_stop_on_sigterm_whatever_moment_it_arrives(valkey_server: ValkeyProcess) -> None:
    import random

    workers = [start_worker(valkey_server.url, "--concurrency", "2") for _ in range(8)]
    wait_for(lambda: Queue("default").client.hlen("{emq}:workers") == 8)
    for worker in workers:
        time.sleep(random.uniform(0, 0.3))
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


def test_a_worker_started_before_valkey_waits_for_it() -> None:
    from jobqueue import conf

    late = ValkeyProcess()
    worker = start_worker(late.url, "--queues", "default")
    try:
        time.sleep(1.5)
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
    slow = jobs.sleep.using(queue="isolated").enqueue_many([(0.5,)] * 4)  # "isolated": concurrency 1
    quick = jobs.add.enqueue_many([(i, i) for i in range(20)])
    worker = start_worker(valkey_server.url, "--queues", "isolated,default", "--concurrency", "4")
    try:
        most_held = 0
        started = time.monotonic()
        while any((get_job(r.id) or r).state != "succeeded" for r in quick):  # type: ignore[union-attr]
            most_held = max(most_held, Queue("isolated").counts()["active"])
            time.sleep(0.01)
        quick_done = time.monotonic() - started
        wait_for(lambda: all((get_job(r.id, "isolated") or r).state == "succeeded" for r in slow))  # type: ignore[union-attr]
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(20) == 0
    assert most_held <= 1 and quick_done < 1.5


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


def test_a_success_that_no_claim_carries_is_recorded_at_once(valkey_server: ValkeyProcess) -> None:
    # Successes wait a few ms for the next claim to carry their acks. With every slot held by
    # long jobs no claim comes: the short job must be recorded anyway, not when the others end.
    quick = jobs.add.using(priority=10).enqueue(1, 1)
    jobs.sleep.enqueue_many([(3,)] * 7)
    worker = start_worker(valkey_server.url, "--concurrency", "4")  # holds 8: 4 run, 4 wait
    try:
        wait_for(lambda: (get_job(quick.id) or quick).state == "succeeded", timeout=2)  # type: ignore[union-attr]
        assert Queue("default").counts()["active"] == 7  # the long ones still hold their slots
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0
    counts = Queue("default").counts()
    # The quick job's runner took a waiting one: 4 long jobs finished, 3 were handed back.
    assert counts["succeeded"] == 5 and counts["pending"] == 3 and counts["active"] == 0


def test_outcomes_held_while_valkey_is_down_are_each_recorded_once_it_is_back(
        valkey_server: ValkeyProcess) -> None:
    # In-process, step by step: a success whose claim failed (Valkey down), then a failure
    # whose nack failed too. Neither may be forgotten: both are recorded once Valkey is back.
    from jobqueue.worker import Worker, WorkerConfig
    from jobqueue.worker.executor import Outcome
    from jobqueue.worker.heartbeat import Held
    from jobqueue.worker.mirror_thread import VALKEY_DOWN
    from jobqueue.worker.runners import Runners

    good, bad = jobs.add.enqueue(1, 1), jobs.always_fails.using(max_attempts=1).enqueue("x")
    queue = Queue("default")
    leases = {lease.job_id: lease for lease in queue.dequeue(count=2, worker="w-1")}
    worker = Worker(WorkerConfig(queues=("default",), mirror=False, name="w-1"))
    worker.queues, worker.shard_totals = [queue], {"default": 1}
    worker._runners = Runners(1, worker._finished_one)
    worker._next_maintenance = worker._next_fire = worker._next_summary = float("inf")
    for lease in leases.values():
        worker._running[lease.job_id] = Held(lease)
        worker._held["default"] += 1
    valkey_server.stop()
    try:
        worker._finished_one(leases[good.id], Outcome(True, result="2"))
        with pytest.raises(VALKEY_DOWN):
            worker._cycle()  # its ack was to ride in a claim, which failed
        worker._finished_one(leases[bad.id], Outcome(False, error="boom"))
        with pytest.raises(VALKEY_DOWN):
            worker._cycle()  # the nack failed as well
    finally:
        valkey_server.start()
    worker._cycle()
    worker._runners.stop(wait=True)
    assert (queue.get(good.id).state, queue.get(bad.id).state) == ("succeeded", "dead")  # type: ignore[union-attr]
    assert (worker.processed, worker.failed) == (1, 1) and not worker._running
