"""The real runworker's waits (subprocesses, real Valkey): an idle worker sleeps in BLPOP, offers
itself for hand-offs and takes the jobs an enqueue hands over; a busy one waits for tokens."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from jobqueue import Queue, get_job, keys
from jobqueue.models import Job
from jobqueue.worker.waiters import IDLE_WAIT
from tests.jobapp import jobs
from tests.servers import ValkeyProcess
from tests.workers import run_burst, start_worker, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


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


def test_an_offer_refused_while_valkey_is_full_is_made_again_once_it_has_room(
        settings: Any, tmp_path: Path) -> None:
    # A full Valkey (noeviction) refuses the offer with OOM: that passes, so the worker must
    # not stop offering for the rest of its life as it does for a server without HSETEX.
    import redis

    server = ValkeyProcess("--maxmemory-policy", "noeviction", appendonly=False).start()
    try:
        settings.JOBQUEUE = {**settings.JOBQUEUE, "URL": server.url}
        client = redis.Redis(port=server.port)
        idle = Queue("default").shard(0).key("idle")
        log = tmp_path / "worker.log"
        worker = start_worker(server.url, "--queues", "default", log=log)
        try:
            wait_for(lambda: client.hlen(idle) == 1)
            with client.pipeline(transaction=False) as pipe:  # (small commands: a big one's
                for _ in range(64):  # query buffer would count until the server shrinks it)
                    pipe.append("filler", b"x" * (128 << 10))
                pipe.execute()
            client.config_set("maxmemory", int(client.info("memory")["used_memory"]) - (4 << 20))
            wait_for(lambda: client.hlen(idle) == 0, timeout=4 * IDLE_WAIT)  # (refused anew)
            client.delete("filler")
            wait_for(lambda: client.hlen(idle) == 1, timeout=4 * IDLE_WAIT)
        finally:
            worker.send_signal(signal.SIGTERM)
            assert worker.wait(20) == 0
        assert "takes no offer" not in log.read_text()
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


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _blocked_waiters(client: Any) -> int:
    """Connections blocked in a BLPOP on the server (a worker's waiters, idle)."""
    return sum(entry.get("cmd") == "blpop" for entry in client.client_list())


def test_an_idle_worker_sleeps_and_wakes_at_once(valkey_server: ValkeyProcess) -> None:
    """Counted, not timed: an idle worker sends about a hundred commands a second on these
    five queues (its maintenance turn, one claim per queue and its mirror's reads, each once a
    second; its waiters block for seconds). A loop that polls sends hundreds more; a thread
    that spins uses a whole core, a quarter of which is a wide bound for a slow machine. The
    rates are per second of the window actually measured, so a slow machine does not skew
    them. A new job then starts at once: the median of five waits is well under the second in
    which a maintenance turn's claim would have found it anyway (a single sample is at the
    mercy of a loaded machine's scheduler)."""
    worker = start_worker(valkey_server.url)
    client = Queue("default").client
    try:
        wait_for(lambda: client.hlen("{emq}:workers") == 1)
        wait_for(lambda: _blocked_waiters(client) >= 5)  # (settled: all five waiters idle)
        client.config_resetstat()
        before, started = _cpu_seconds(worker.pid), time.monotonic()
        time.sleep(4)  # (the window the rates are measured over, not a wait for something)
        seconds = time.monotonic() - started
        idle_share = (_cpu_seconds(worker.pid) - before) / seconds
        stats = client.info("commandstats")
        sent = sum(s["calls"] for name, s in stats.items() if name not in (
            "cmdstat_config|resetstat", "cmdstat_info", "cmdstat_client|list"))
        assert sent / seconds < 150, f"an idle worker sent {sent / seconds:.0f} commands a second"
        waits = stats.get("cmdstat_blpop", {}).get("calls", 0)
        assert waits <= 5 * 2, f"five waiters waited {waits} times in 4 s"
        assert idle_share < 0.25, f"idle worker used {idle_share:.1%} of a core"
        latencies = []
        for _ in range(5):
            wait_for(lambda: _blocked_waiters(client) >= 5)  # (idle again)
            started = time.monotonic()
            ref = jobs.noop.enqueue()
            wait_for(lambda ref=ref: (get_job(ref.id) or ref).state == "succeeded", every=0.002)  # type: ignore[union-attr]
            latencies.append(time.monotonic() - started)
        assert sorted(latencies)[2] < 0.4, f"an idle worker took {latencies} s to run new jobs"
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
    """Whether a waiter offered itself for hand-offs (see `handoff.wait_commands`)."""
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
        seen: list[int] = []
        until = time.monotonic() + 2.5  # the offer outlasts the idle main loop's claims (1 a second)

        def watched() -> bool:
            seen.append(client.hlen(offered))
            return time.monotonic() > until

        wait_for(watched, every=0.05)
        # Renewed every IDLE_WAIT (5 s): within 2.5 s it may be gone once, a moment, at most.
        # Counted in gaps, not samples: a loaded machine takes fewer samples, not more gaps.
        gaps = sum(1 for i, n in enumerate(seen) if n == 0 and (i == 0 or seen[i - 1] == 1))
        assert gaps <= 1 and seen.count(1) >= 0.8 * len(seen), seen
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
        # Idle again, it offers itself anew: from the loop's connection, not the thread's.
        wait_for(lambda: any(map(_offers, monitor.waiters(settled).values())))
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
    client, idle = Queue("default").client, Queue("default").shard(0).key("idle")
    for job, args in ((jobs.noop, ()), (jobs.async_sleep, (0,))):
        worker = start_worker(valkey_server.url, "--queues", "default")
        ref = job.enqueue(*args)
        wait_for(lambda ref=ref: (get_job(ref.id) or ref).state == "succeeded")  # type: ignore[union-attr]
        wait_for(lambda: client.hlen(idle) == 1)  # (waiting again, offered: IDLE_WAIT ahead)
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
        # Two maintenance turns later (each writes the worker's heartbeat), the main loop, idle,
        # would have ended a wait that could offer.
        beats: set[float] = set()

        def turned_twice() -> bool:
            beats.update(json.loads(w)["heartbeat"] for w in client.hvals("{emq}:workers"))
            return len(beats) >= 3

        wait_for(turned_twice)
        # (its plain waits borrow any of the client's connections: there may be several)
        assert monitor.waiters() and not any(map(_offers, monitor.waiters().values()))
        assert "cmdstat_client|unblock" not in client.info("commandstats")
    finally:
        monitor.close()
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(20) == 0


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


def _idle_worker(maintenance_every: float) -> tuple[Any, threading.Thread]:
    """An in-process worker on `default` whose maintenance turn comes once, at its start."""
    from jobqueue.worker import Worker, WorkerConfig

    worker = Worker(WorkerConfig(queues=("default",), concurrency=1, mirror=False,
                                 maintenance_every=maintenance_every))
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    return worker, thread


def test_an_idle_worker_runs_a_resumed_queues_job_before_its_next_maintenance_turn(
        valkey_server: ValkeyProcess) -> None:
    queue = Queue("default")
    worker, thread = _idle_worker(3600)
    try:
        wait_for(lambda: queue.client.hlen(queue.shard(0).key("idle")) == 1)  # idle, offering
        queue.pause()
        ref = jobs.add.enqueue(1, 2)  # its token finds the queue paused: drained
        wait_for(lambda: queue.client.llen(queue.shard(0).key("wake")) == 0)
        queue.resume()
        wait_for(lambda: (get_job(ref.id) or ref).state == "succeeded")  # type: ignore[union-attr]
    finally:
        worker.request_stop()
        thread.join(20)


def test_an_idle_worker_promotes_a_scheduled_job_when_it_is_due_not_at_a_later_turn(
        valkey_server: ValkeyProcess) -> None:
    queue = Queue("default")
    ref = jobs.add.using(delay=0.5).enqueue(1, 2)  # (known at the worker's first turn)
    worker, thread = _idle_worker(3600)
    try:
        wait_for(lambda: (get_job(ref.id) or ref).state == "succeeded")  # type: ignore[union-attr]
        assert worker.maintenance.next_due is None and queue.counts()["scheduled"] == 0
    finally:
        worker.request_stop()
        thread.join(20)


def test_a_worker_that_falls_busy_withdraws_its_offers_on_its_other_shards(
        valkey_server: ValkeyProcess, settings: Any, tmp_path: Path) -> None:
    # Idle, a worker offers itself on each shard. Handed a job on one, it is busy: its offers
    # on the others go at once, or enqueues there would hand it more jobs than it has room for
    # (capacity 2 here: one running, one claimed ahead) while other workers idle.
    from jobqueue import conf, ids
    from jobqueue.engine import layouts

    wide = {"wide": {"shards": 3}}
    settings.JOBQUEUE = {"URL": valkey_server.url, "QUEUES": {"default": {}, **wide}}
    conf.reset()
    queue = Queue("wide")
    idle = [queue.shard(i).key("idle") for i in range(3)]

    def job_on(shard: int, name: str) -> Any:
        job_id = next(i for i in iter(ids.new_id, None) if layouts.place(i, "", "", 3) == shard)
        return jobs.reports_then_waits.using(queue="wide", job_id=job_id).enqueue(
            name, str(tmp_path / name))

    def state(ref: Any) -> str:
        return queue.get(ref.id).state  # type: ignore[union-attr]

    worker = start_worker(valkey_server.url, "--queues", "wide", "--concurrency", "1",
                          env={"JOBQUEUE_TEST_QUEUES": json.dumps(wide)})
    try:
        wait_for(lambda: [queue.client.hlen(key) for key in idle] == [1, 1, 1], timeout=60)
        first = job_on(0, "first")
        wait_for(lambda: queue.get(first.id).progress == "first")  # type: ignore[union-attr]
        others = [job_on(1, "b"), job_on(2, "c")]
        wait_for(lambda: "active" in [state(ref) for ref in others])
        assert sorted(state(ref) for ref in others) == ["active", "pending"]
        for name in ("first", "b", "c"):
            (tmp_path / name).touch()
        assert [ref.result(timeout=30) for ref in [first, *others]] == ["first", "b", "c"]
    finally:
        for name in ("first", "b", "c"):
            (tmp_path / name).touch()
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0
