"""`runworker --max-jobs N` and `--max-memory MB`: a worker process that has done its share, or
grown too big, stops claiming, hands back what it prefetched, finishes what runs and exits 75;
its supervisor starts a fresh one at once (also with `--workers 1`). Real workers, real Valkey:
the `leaky` handler notes each run (job, process, resident MB before it ran) in a file."""

from __future__ import annotations

import json
import signal
from collections import Counter
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from jobqueue import Queue, get_job
from jobqueue.keys import RECYCLES_KEY
from jobqueue.models import Job
from jobqueue.operations.metrics import ValkeyCollector
from jobqueue.worker import presence
from jobqueue.worker.recycling import Recycler, resident_bytes
from tests.jobapp import jobs
from tests.servers import ValkeyProcess
from tests.workers import manage, run_burst, start_worker, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def runs(path: Path) -> list[tuple[str, int, int]]:
    """Each run `leaky` noted: (job id, process id, resident MB before it ran)."""
    if not path.exists():
        return []
    return [(job, int(pid), int(mb)) for job, pid, mb in
            (line.split() for line in path.read_text().splitlines())]


def each_ran_once(path: Path, ids: list[str]) -> None:
    assert Counter(job for job, _, _ in runs(path)) == dict.fromkeys(ids, 1)


def processes(path: Path) -> set[int]:
    return {pid for _, pid, _ in runs(path)}


def recycles() -> dict[str, int]:
    return {k: int(v) for k, v in Queue("default").client.hgetall(RECYCLES_KEY).items()}


def charged(job_id: str) -> int:
    """The runs a job's budget was charged for (attempts less the uncharged hand-backs)."""
    row = Queue("default").client.hmget(Queue("default").shard(0).job(job_id),
                                        "attempts", "uncharged")
    return int(row[0] or 0) - int(row[1] or 0)


def test_max_jobs_bounds_each_claim_and_is_due_once_its_last_job_has_finished() -> None:
    trips: list[str] = []
    recycler = Recycler(10, None, lambda reason, why: trips.append(reason))
    assert recycler.room(8, held=0) == 8
    recycler.took(8)
    assert recycler.room(8, held=6) == 2  # never more than it will run
    recycler.took(2)
    assert recycler.room(8, held=3) == 0 and not trips  # its jobs still run
    assert not recycler.admits(1)  # a hand-off past the budget goes back
    assert recycler.room(8, held=0) == 0 and trips == ["max_jobs"]
    assert recycler.room(8, held=0) == 0 and trips == ["max_jobs"]  # once


def test_max_memory_is_due_once_the_process_is_past_it() -> None:
    trips: list[str] = []
    mb = (resident_bytes() or 0) >> 20
    assert mb > 0
    roomy = Recycler(None, mb + 1000, lambda reason, why: trips.append(reason))
    assert roomy.room(8, held=0) == 8 and roomy.admits(100) and not trips
    full = Recycler(None, mb - 1, lambda reason, why: trips.append(why))
    assert full.room(8, held=0) == 8 and not trips  # a process runs one job at least
    full.took(1)
    assert full.room(8, held=0) == 0 and full.reason == "max_memory"
    assert len(trips) == 1 and f"is past --max-memory {mb - 1} MB" in trips[0]
    assert Recycler.of(None, None, lambda reason, why: None) is None  # no limit: no recycler


def test_100_jobs_with_max_jobs_10_take_at_least_10_processes_each_job_run_once(
        valkey_server: ValkeyProcess, tmp_path: Path) -> None:
    path = tmp_path / "runs"
    refs = jobs.leaky.enqueue_many([(str(path),)] * 100)
    assert run_burst(valkey_server.url, "--workers", "1", "--max-jobs", "10",
                     "--concurrency", "4") == 0
    ids = [r.id for r in refs]
    each_ran_once(path, ids)
    assert len(processes(path)) >= 10
    assert max(Counter(pid for _, pid, _ in runs(path)).values()) <= 10
    assert recycles()["max_jobs"] >= 9
    # The mirror of each recycled process wrote its rows before it went.
    assert Job.objects.filter(pk__in=ids, state="succeeded").count() == 100
    assert all(charged(i) == 1 for i in ids)


def test_two_supervised_workers_recycle_too(valkey_server: ValkeyProcess, tmp_path: Path) -> None:
    path = tmp_path / "runs"
    refs = jobs.leaky.enqueue_many([(str(path),)] * 40)
    assert run_burst(valkey_server.url, "--workers", "2", "--max-jobs", "5",
                     "--concurrency", "2") == 0
    each_ran_once(path, [r.id for r in refs])
    assert len(processes(path)) >= 8


def leaks_under_max_memory_200(url: str, path: Path, *args: str) -> list[str]:
    """16 jobs that keep 40 MB each, run by a burst with --max-memory 200: their ids."""
    refs = jobs.leaky.enqueue_many([(str(path), 40)] * 16)
    assert run_burst(url, "--max-memory", "200", "--concurrency", "1", *args) == 0
    ids = [r.id for r in refs]
    each_ran_once(path, ids)
    return ids


def test_jobs_that_keep_40_mb_each_under_max_memory_200_are_spread_over_fresh_processes(
        valkey_server: ValkeyProcess, tmp_path: Path) -> None:
    path = tmp_path / "runs"
    leaks_under_max_memory_200(valkey_server.url, path, "--prefetch", "0")
    assert len(processes(path)) >= 3
    # Without prefetch every job is claimed by a check of the process's memory: none starts
    # in a process already past the limit.
    assert max(mb for _, _, mb in runs(path)) <= 200
    assert recycles()["max_memory"] >= 2 and "max_jobs" not in recycles()


def test_a_recycle_hands_back_prefetched_jobs_uncharged_and_loses_none(
        valkey_server: ValkeyProcess, tmp_path: Path) -> None:
    ids = leaks_under_max_memory_200(valkey_server.url, tmp_path / "runs", "--prefetch", "4")
    assert all(charged(i) == 1 for i in ids)  # one run each, whatever went back
    client, shard = Queue("default").client, Queue("default").shard(0)
    handed_back = [i for i in ids if client.hget(shard.job(i), "uncharged")]
    assert handed_back  # prefetched jobs went back (uncharged) and ran in a later process
    assert Job.objects.filter(pk__in=ids, state="succeeded").count() == 16


def test_pool_processes_past_max_memory_are_replaced(valkey_server: ValkeyProcess,
                                                     tmp_path: Path) -> None:
    path = tmp_path / "runs"
    leaks_under_max_memory_200(valkey_server.url, path, "--processes")
    assert len(processes(path)) >= 3
    assert max(mb for _, _, mb in runs(path)) <= 200


def test_a_running_supervised_worker_recycles_until_stopped_and_the_console_counts_it(
        valkey_server: ValkeyProcess, tmp_path: Path) -> None:
    path = tmp_path / "runs"
    log = tmp_path / "worker.log"
    queue = Queue("default")
    worker = start_worker(valkey_server.url, "--max-jobs", "5", "--concurrency", "2", log=log)
    try:
        wait_for(lambda: queue.client.hlen("{emq}:workers") == 1)
        [row] = queue.client.hvals("{emq}:workers")
        first = json.loads(row)
        assert first["pid"] != worker.pid  # supervised, with --workers 1
        refs = jobs.leaky.enqueue_many([(str(path),)] * 20)
        wait_for(lambda: queue.counts()["succeeded"] == 20)
        each_ran_once(path, [r.id for r in refs])
        assert len(processes(path)) >= 4
        wait_for(lambda: queue.client.hlen("{emq}:workers") == 1)
        [listed] = presence.workers(queue.client)
        assert listed["name"] == first["name"] and listed["recycles"] >= 3
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0
    assert "recycled" in log.read_text() and "Traceback" not in log.read_text()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ValkeyCollector())
    text = generate_latest(registry).decode()
    assert 'jobqueue_worker_recycles_total{reason="max_jobs"} ' in text
    assert 'jobqueue_worker_recycles_total{reason="max_memory"} 0.0' in text


def test_without_limits_the_worker_runs_unsupervised_as_before(
        valkey_server: ValkeyProcess) -> None:
    queue = Queue("default")
    worker = start_worker(valkey_server.url, "--concurrency", "1")
    try:
        wait_for(lambda: queue.client.hlen("{emq}:workers") == 1)
        [row] = queue.client.hvals("{emq}:workers")
        assert json.loads(row)["pid"] == worker.pid
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0


@pytest.mark.parametrize(("args", "says"), [
    (("--max-memory", "10"), "--max-memory: must be at least 64 MB"),
    (("--max-jobs", "0"), "--max-jobs: must be at least 1"),
    (("--max-memory", "lots"), "--max-memory: expected a whole number"),
])
def test_bad_limits_are_one_clear_error(valkey_server: ValkeyProcess, args: tuple[str, ...],
                                        says: str) -> None:
    done = manage("runworker", "--burst", *args, url=valkey_server.url)
    assert done.returncode != 0
    assert says in done.stderr and "Traceback" not in done.stderr


def test_a_worker_past_its_share_exits_75_for_its_supervisor(valkey_server: ValkeyProcess,
                                                             tmp_path: Path) -> None:
    """As a child the supervisor started as a new process runs (`--supervised`: the command line
    it is given, which carries the limits on)."""
    from jobqueue.management.commands.runworker import Command, _child_argv

    parser = Command().create_parser("manage.py", "runworker")
    options = vars(parser.parse_args(["--max-jobs", "3", "--max-memory", "500", "--burst"]))
    argv = _child_argv(options, "w", 0)
    assert argv[-1] == "--supervised"
    assert argv[argv.index("--max-jobs"):][:2] == ["--max-jobs", "3"]
    assert argv[argv.index("--max-memory"):][:2] == ["--max-memory", "500"]
    path = tmp_path / "runs"
    refs = jobs.leaky.enqueue_many([(str(path),)] * 5)
    assert run_burst(valkey_server.url, *argv[argv.index("--concurrency"):]) == 75
    assert len(runs(path)) == 3 and Queue("default").counts()["pending"] == 2
    assert {job for job, _, _ in runs(path)} <= {r.id for r in refs}


def test_a_stop_signal_during_a_recycle_still_lets_the_running_job_finish(
        valkey_server: ValkeyProcess, tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    Queue("default").pause()  # (both jobs in the worker's first claim)
    slow = jobs.sleep.enqueue(3.0)
    jobs.leaky.enqueue(str(tmp_path / "runs"), 200)
    Queue("default").resume()
    worker = start_worker(valkey_server.url, "--max-memory", "200", "--concurrency", "2",
                          log=log)
    try:
        wait_for(lambda: "recycled (" in log.read_text())  # the sleep runs on
        worker.send_signal(signal.SIGTERM)  # the first stop, not a second: the job finishes
        assert worker.wait(30) == 0
    finally:
        worker.kill()
    info = get_job(slow.id)
    assert info is not None and info.state == "succeeded" and info.attempts == 1
    assert "second stop" not in log.read_text()
