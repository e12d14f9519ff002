"""`runworker --max-jobs N` and `--max-memory MB`: a worker process that has done its share, or
grown too big, stops claiming, hands back what it prefetched, finishes what runs and exits 75;
its supervisor starts a fresh one at once (also with `--workers 1`). Real workers, real Valkey:
the `leaky` handler notes each run (job, process, resident MB before it ran) in a file."""

from __future__ import annotations

import json
import logging
import signal
import socket
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from jobqueue import Queue, get_job
from jobqueue.keys import RECYCLES_KEY
from jobqueue.models import Job
from jobqueue.operations.metrics import ValkeyCollector
from jobqueue.worker import Worker, WorkerConfig, presence
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


def test_max_memory_is_due_once_the_process_has_grown_past_it() -> None:
    trips: list[str] = []
    mb = (resident_bytes() or 0) >> 20
    assert mb > 0
    roomy = Recycler(None, mb + 1000, lambda reason, why: trips.append(reason))
    assert roomy.room(8, held=0) == 8 and roomy.admits(100) and not trips
    growing = Recycler(None, mb + 50, lambda reason, why: trips.append(why))
    assert growing.room(8, held=0) == 8 and not trips
    kept = b"\x01" * (100 << 20)  # (written: resident)
    assert growing.room(8, held=0) == 8 and not trips  # a process runs one job at least
    growing.took(1)
    assert growing.room(8, held=0) == 0 and growing.reason == "max_memory"
    assert len(trips) == 1 and f"is past --max-memory {mb + 50} MB" in trips[0]
    assert len(kept) and Recycler.of(None, None, lambda reason, why: None) is None


def test_a_process_past_max_memory_at_its_first_claim_says_so_once_and_is_not_held_to_it(
        caplog: pytest.LogCaptureFixture) -> None:
    """No restart loop: a fresh process would start past the limit too."""
    trips: list[str] = []
    mb = (resident_bytes() or 0) >> 20
    full = Recycler(None, mb - 1, lambda reason, why: trips.append(why))
    with caplog.at_level(logging.INFO, logger="jobqueue.worker"):
        assert full.room(8, held=0) == 8
        full.took(1)
        assert full.room(8, held=0) == 8 and full.room(8, held=0) == 8
    assert not trips and full.reason is None
    [error] = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert error.startswith("--max-memory is below this worker's size after start: ")


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
        assert first["name"] == f"{socket.gethostname()}:{worker.pid}"  # its name, no "-0"
        refs = jobs.leaky.enqueue_many([(str(path),)] * 20)
        wait_for(lambda: queue.counts()["succeeded"] == 20)
        each_ran_once(path, [r.id for r in refs])
        assert len(processes(path)) >= 4
        # (read in one go: a process making way for the next one leaves the list for a moment)
        wait_for(lambda: [(w["name"], w["recycles"] >= 3) for w in presence.workers(queue.client)]
                 == [(first["name"], True)])
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


def in_thread(worker: Worker) -> threading.Thread:
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    return thread


def heartbeat(name: str) -> float:
    """The time of the worker's last presence entry (0: none)."""
    raw = Queue("default").client.hget("{emq}:workers", name)
    return float(json.loads(raw)["heartbeat"]) if raw else 0.0


def recycling_mid_run(name: str = "w-recycling") -> tuple[Worker, str]:
    """A worker (grace 0.3 s) whose first claim takes a 2 s sleep and a job that keeps
    100 MB in this process, past the worker's --max-memory (set 60 MB above this process's
    size): it recycles while the sleep runs. Its running thread, and the sleep's id."""
    limit = ((resident_bytes() or 0) >> 20) + 60
    Queue("default").pause()  # (both jobs in the worker's first claim)
    slow = jobs.sleep.enqueue(2.0)
    jobs.leaky.enqueue("/dev/null", 100)
    Queue("default").resume()
    worker = Worker(WorkerConfig(queues=("default",), concurrency=2, mirror=False,
                                 max_memory=limit, grace=0.3, name=name))
    return worker, slow.id


@pytest.fixture
def kept_memory_freed() -> Iterator[None]:
    yield
    jobs.KEPT.clear()


@pytest.mark.usefixtures("kept_memory_freed")
def test_a_memory_recycle_never_cuts_a_running_job_short(valkey_server: ValkeyProcess) -> None:
    """A recycle's drain has no deadline (only a real stop starts the grace): the job that
    runs on past --grace finishes, charged once, rather than go back to be run again (a job
    that itself takes each process past the limit would loop forever, never charged)."""
    worker, slow = recycling_mid_run()
    thread = in_thread(worker)
    wait_for(lambda: worker.recycle_reason is not None)
    seen = heartbeat(worker.config.name)
    wait_for(lambda: heartbeat(worker.config.name) > seen, timeout=5)  # (advertised: not stale)
    thread.join(30)
    assert worker.recycle_reason == "max_memory" and worker.abandoned == 0
    info = get_job(slow)
    assert info is not None and info.state == "succeeded" and charged(slow) == 1


@pytest.mark.usefixtures("kept_memory_freed")
def test_a_stop_during_a_recycle_leaves_no_count_behind(valkey_server: ValkeyProcess) -> None:
    """A stop while a recycle drains (the supervisor stops too: no fresh process follows):
    the recycle is counted by its reason, but not under the worker's name (nothing would
    remove it), and the grace runs from the stop."""
    from jobqueue.keys import WORKERS_KEY

    worker, _slow = recycling_mid_run("w-final")
    thread = in_thread(worker)
    wait_for(lambda: worker.recycle_reason is not None)
    worker.request_stop()  # (the operator's stop, relayed by the supervisor)
    thread.join(30)
    client = Queue("default").client
    assert client.hget(WORKERS_KEY, "w-final") is None
    assert client.hget(RECYCLES_KEY, "name:w-final") is None
    assert recycles()["max_memory"] == 1
    assert worker.abandoned == 1  # (the grace of 0.3 s from the stop: the sleep went back)


def test_pool_processes_that_start_past_max_memory_are_kept_with_one_warning(
        valkey_server: ValkeyProcess, tmp_path: Path, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A pool process past --max-memory once it is ready (here by 80 MB of ballast its handlers'
    import holds) would be replaced after every job by one as big: it is kept, with one WARNING.
    (In this process: `runworker` refuses a limit its own process passes.)"""
    monkeypatch.setenv("JOBQUEUE_TEST_BALLAST_MB", "80")  # (spawned pool processes inherit it)
    path = tmp_path / "runs"
    jobs.leaky.enqueue_many([(str(path),)] * 6)
    worker = Worker(WorkerConfig(queues=("default",), concurrency=1, mirror=False,
                                 processes=True, max_memory=96, burst=True))
    with caplog.at_level(logging.INFO, logger="jobqueue.worker"):
        in_thread(worker).join(60)
    assert len(runs(path)) == 6
    assert len(processes(path)) == 1, "a spawned pool process (Django set up again) per job"
    said = [r for r in caplog.records if "pool process holds" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING
    assert "once started" in said[0].getMessage()


def test_a_worker_past_its_share_leaves_wake_tokens_to_the_others(
        valkey_server: ValkeyProcess) -> None:
    """--max-jobs used up while its last job runs: its waiters stop taking the shard's wake
    tokens (it could claim nothing with them): an enqueue's token stays for another worker."""
    queue = Queue("default")
    jobs.sleep.enqueue(3.0)
    worker = Worker(WorkerConfig(queues=("default",), concurrency=2, mirror=False, max_jobs=1,
                                 maintenance_every=3600))
    thread = in_thread(worker)
    try:
        wait_for(lambda: worker.held.jobs and worker.recycler.taken == 1)  # type: ignore[union-attr]
        jobs.add.enqueue(1, 2)
        wake = queue.shard(0).key("wake")
        wait_for(lambda: queue.client.llen(wake) == 1, timeout=5)
        with pytest.raises(AssertionError):  # (and it stays there)
            wait_for(lambda: queue.client.llen(wake) == 0, timeout=1.5)
    finally:
        worker.request_stop()
        thread.join(20)


def test_a_worker_that_starts_past_max_memory_says_so_once_and_does_not_recycle(
        valkey_server: ValkeyProcess, caplog: pytest.LogCaptureFixture) -> None:
    """No restart loop: a process already past --max-memory at its first claim logs one ERROR
    and keeps running (its memory is not held to the limit)."""
    refs = jobs.add.enqueue_many([(1, 2)] * 3)
    worker = Worker(WorkerConfig(queues=("default",), concurrency=1, mirror=False,
                                 max_memory=64, burst=True))
    with caplog.at_level(logging.INFO, logger="jobqueue.worker"):
        in_thread(worker).join(30)
    assert worker.recycle_reason is None and all(get_job(r.id).state == "succeeded" for r in refs)  # type: ignore[union-attr]
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "--max-memory is below this worker's size after start" in errors[0]


def test_the_last_jobs_of_the_budget_are_claimed_while_the_others_run(
        valkey_server: ValkeyProcess) -> None:
    """--max-jobs leaves less than a batch's worth: those are claimed as soon as there is room
    for them, not once the worker is empty."""
    queue = Queue("default")
    queue.pause()
    jobs.add.enqueue(1, 2)
    jobs.sleep.enqueue_many([(2.0,)] * 3)
    queue.resume()
    worker = Worker(WorkerConfig(queues=("default",), concurrency=4, mirror=False, max_jobs=5))
    thread = in_thread(worker)
    try:
        wait_for(lambda: worker.recycler.taken == 4 and len(worker.held.jobs) == 3)  # type: ignore[union-attr]
        last = jobs.add.enqueue(2, 3)
        wait_for(lambda: worker.recycler.taken == 5, timeout=1.5)  # type: ignore[union-attr]
        assert len(worker.held.jobs) >= 3  # (the sleeps still run)
    finally:
        thread.join(30)
    info = get_job(last.id)
    assert worker.recycle_reason == "max_jobs" and info is not None and info.state == "succeeded"
