"""What finished reaches Valkey exactly once: successes ride the next claim but never wait long
for one, and outcomes held while Valkey is down are recorded once it is back, whatever thread's
call failed (in-process, against a real server stopped)."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

import jobqueue.worker
from jobqueue import Queue, conf, get_job
from jobqueue.exceptions import VALKEY_DOWN
from jobqueue.records import Lease
from jobqueue.worker import Worker, WorkerConfig
from jobqueue.worker.executor import Outcome
from tests.jobapp import jobs
from tests.servers import ValkeyProcess
from tests.workers import start_worker, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
WORKER_CODE = str(Path(jobqueue.worker.__file__).parent)
LOCK = type(threading.Lock())


def _holding(queue: Queue, leases: list[Lease], **options: Any) -> Worker:
    """A worker that holds `leases` as if its runners ran them, with no maintenance due."""
    worker = Worker(WorkerConfig(queues=(queue.name,), mirror=False, name="w-1", **options))
    worker.served.add(queue, 1)
    worker.start_runners()
    worker.maintenance.hold()
    worker.held.add(leases)
    return worker


def _locks(worker: Worker) -> list[Any]:
    """The locks of the worker and of the parts it holds."""
    parts = [worker, *vars(worker).values()]
    return [value for part in parts for value in getattr(part, "__dict__", {}).values()
            if isinstance(value, LOCK)]


class Interleaved:
    """Runs `step` to its end on a thread of its own at each bytecode of the worker's code that
    the tracing thread reaches while it holds none of `locks`: every point at which the other
    thread's step could come between (the step taken as one unit). Deterministic, where
    threads left to the interpreter's switches meet at such a point once in thousands of runs."""

    def __init__(self, step: Callable[[], object], locks: list[Any]) -> None:
        self.step, self.locks, self.steps = step, locks, 0
        self.errors: list[BaseException] = []
        self._go, self._done, self._over = threading.Event(), threading.Event(), False
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while self._go.wait() and not self._over:
            self._go.clear()
            try:
                self.step()
            except BaseException as exc:  # noqa: BLE001 (raised again by the tracing thread)
                self.errors.append(exc)
            self._done.set()

    def _trace(self, frame: FrameType, event: str, arg: object) -> Any:
        if event == "call":
            if not frame.f_code.co_filename.startswith(WORKER_CODE):
                return None
            frame.f_trace_opcodes = True
        elif event == "opcode" and not any(lock.locked() for lock in self.locks):
            self._done.clear()
            self._go.set()
            if not self._done.wait(30):  # (it waits for a lock this thread holds)
                raise AssertionError(f"the step never ended at {frame.f_code.co_qualname}")
            self.steps += 1
        return self._trace

    def run(self, call: Callable[[], object]) -> None:
        """`call` on this thread, traced."""
        sys.settrace(self._trace)
        try:
            call()
        finally:
            sys.settrace(None)
        if self.errors:
            raise self.errors[0]

    def close(self) -> None:
        self._over = True
        self._go.set()
        self._thread.join()


def test_outcomes_finished_while_a_waiters_claim_fails_are_each_recorded_once_valkey_is_back(
        settings: Any) -> None:
    # While Valkey is down, the main loop records what finished and a waiter claims after a
    # wake token: both calls fail, and the waiter's claim comes between the main loop's steps
    # at every point it can. Each outcome must still be recorded once Valkey is back: a failure
    # forgotten on the way would keep its slot (and its lease, renewed) for the worker's whole
    # life; a success forgotten would run again.
    server = ValkeyProcess().start()
    try:
        settings.JOBQUEUE = {"URL": server.url, "QUEUES": {"default": {}}}
        count = 3
        jobs.always_fails.using(max_attempts=1).enqueue_many([("x",)] * count)
        jobs.add.enqueue_many([(1, 1)] * count)
        # (no retries: a call to the stopped server fails at once)
        client = redis.Redis(port=server.port, retry=Retry(NoBackoff(), 0), **conf.CLIENT_OPTIONS)
        queue = Queue("default", client=client)
        leases = queue.dequeue(count=2 * count, lease=300, worker="w-1")
        assert len(leases) == 2 * count
        worker = _holding(queue, leases, prefetch=100)  # (room: the waiter's claims are sent)

        def waiters_claim() -> None:
            with contextlib.suppress(*VALKEY_DOWN):
                worker.claims.claim(woken=(queue, 0))

        def main_loops_turn() -> None:
            with contextlib.suppress(*VALKEY_DOWN):
                worker.turn()

        server.stop()
        interleaved = Interleaved(waiters_claim, _locks(worker))
        try:
            failures = [lease for lease in leases if lease.payload["handler"].endswith("fails")]
            successes = [lease for lease in leases if lease not in failures]
            for failure, success in zip(failures, successes, strict=True):
                worker.outcomes.finished(failure, Outcome(False, error="boom"))
                worker.outcomes.finished(success, Outcome(True, result="2"))
                interleaved.run(main_loops_turn)
        finally:
            interleaved.close()
        assert interleaved.steps > 100  # (the claim came between the loop's steps)
        server.start()
        for _ in range(3):
            worker.turn()
        worker.runners.stop(wait=True)
        counts = queue.counts()
        assert (counts["dead"], counts["succeeded"], counts["active"]) == (count, count, 0)
        assert (worker.failed, worker.processed) == (count, count)
        assert not worker.held.jobs  # (every slot free again)
    finally:
        server.cleanup()


def test_a_success_that_no_claim_carries_is_recorded_at_once(valkey_server: ValkeyProcess) -> None:
    # Successes wait a few ms for the next claim to carry their acks. With every slot held by
    # long jobs no claim comes: the short job must be recorded anyway, not when the others end.
    quick = jobs.add.using(priority=10).enqueue(1, 1)
    jobs.sleep.enqueue_many([(3,)] * 7)
    worker = start_worker(valkey_server.url, "--concurrency", "4")  # holds 8: 4 run, 4 wait
    try:
        # Ordering, not seconds (a loaded machine may start the worker slowly): the quick job
        # is recorded while the long ones still hold their slots.
        wait_for(lambda: (get_job(quick.id) or quick).state == "succeeded")  # type: ignore[union-attr]
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
    good, bad = jobs.add.enqueue(1, 1), jobs.always_fails.using(max_attempts=1).enqueue("x")
    queue = Queue("default")
    leases = {lease.job_id: lease for lease in queue.dequeue(count=2, worker="w-1")}
    worker = _holding(queue, list(leases.values()))
    valkey_server.stop()
    try:
        worker.outcomes.finished(leases[good.id], Outcome(True, result="2"))
        with pytest.raises(VALKEY_DOWN):
            worker.turn()  # its ack was to ride in a claim, which failed
        worker.outcomes.finished(leases[bad.id], Outcome(False, error="boom"))
        with pytest.raises(VALKEY_DOWN):
            worker.turn()  # the nack failed as well
    finally:
        valkey_server.start()
    worker.turn()
    worker.runners.stop(wait=True)
    assert (queue.get(good.id).state, queue.get(bad.id).state) == ("succeeded", "dead")  # type: ignore[union-attr]
    assert (worker.processed, worker.failed) == (1, 1) and not worker.held.jobs


@contextlib.contextmanager
def _busy(server: ValkeyProcess) -> Iterator[None]:
    """Valkey busy running a script: every other command is refused (BUSY, a ResponseError)
    until the script is killed on the way out."""
    client = redis.Redis(port=server.port)
    client.config_set("busy-reply-threshold", 10)

    def loop() -> None:
        with contextlib.suppress(redis.exceptions.ResponseError):  # (killed)
            redis.Redis(port=server.port).eval("while true do end", 0)

    looping = threading.Thread(target=loop, daemon=True)
    looping.start()
    wait_for(lambda: _refused(client))
    try:
        yield
    finally:
        client.script_kill()
        looping.join(10)


def _refused(client: redis.Redis) -> bool:
    try:
        client.ping()
    except redis.exceptions.ResponseError as exc:
        return "BUSY" in str(exc)
    return False


def test_outcomes_valkey_refuses_are_each_recorded_once_it_takes_them(
        valkey_server: ValkeyProcess) -> None:
    # In-process, step by step: Valkey answers every call with an error that is not a
    # connection error (BUSY here; read-only after a failover, out of memory are alike).
    # Nothing may be dropped: a failure or a success dropped here would stay held, its lease
    # renewed for the worker's whole life.
    bad = jobs.always_fails.using(max_attempts=1).enqueue_many([("x",)] * 2)
    good = jobs.add.enqueue_many([(1, 1)] * 2)
    queue = Queue("default")
    leases = {lease.job_id: lease for lease in queue.dequeue(count=4, worker="w-1")}
    worker = _holding(queue, list(leases.values()))
    for ref in bad:
        worker.outcomes.finished(leases[ref.id], Outcome(False, error="boom"))
    for ref in good:
        worker.outcomes.finished(leases[ref.id], Outcome(True, result="2"))
    with _busy(valkey_server):
        with pytest.raises(redis.exceptions.ResponseError, match="BUSY"):
            worker.turn()  # the nacks are refused, then the acks
        with pytest.raises(redis.exceptions.ResponseError, match="BUSY"):
            worker.outcomes.record()  # (and again, the way a stopping worker records)
    assert len(worker.held.jobs) == 4 and worker.outcomes.unrecorded()
    worker.turn()
    worker.runners.stop(wait=True)
    assert {queue.get(ref.id).state for ref in bad} == {"dead"}  # type: ignore[union-attr]
    assert {queue.get(ref.id).state for ref in good} == {"succeeded"}  # type: ignore[union-attr]
    assert (worker.processed, worker.failed) == (2, 2) and not worker.held.jobs


def test_successes_a_refused_claim_carried_are_recorded_by_a_later_one(
        valkey_server: ValkeyProcess) -> None:
    # The successes a claim carries are no longer held: a claim refused (a waiter's after a
    # wake token, or the main loop's) must give them back, or they run again once their
    # leases end.
    good = jobs.add.enqueue(1, 1)
    queue = Queue("default")
    [lease] = queue.dequeue(count=1, worker="w-1")
    worker = _holding(queue, [lease], prefetch=100)
    worker.outcomes.finished(lease, Outcome(True, result="2"))
    carried = worker.outcomes.record(defer_acks=True)
    with _busy(valkey_server), pytest.raises(redis.exceptions.ResponseError, match="BUSY"):
        worker.claims.claim(carried, woken=(queue, 0))
    worker.turn()
    worker.runners.stop(wait=True)
    job = queue.get(good.id)
    assert job is not None and (job.state, job.attempts) == ("succeeded", 1)
    assert worker.processed == 1


def test_an_outcome_refused_again_and_again_holds_up_no_other(valkey_server: ValkeyProcess) -> None:
    # One failure's nack is refused every time (its row is not a hash: WRONGTYPE from the
    # script). The failure and the success behind it are recorded all the same, each once.
    stuck, other = jobs.always_fails.using(max_attempts=1).enqueue_many([("x",)] * 2)
    good = jobs.add.enqueue(1, 1)
    queue = Queue("default")
    leases = {lease.job_id: lease for lease in queue.dequeue(count=3, worker="w-1")}
    worker = _holding(queue, list(leases.values()))
    for ref in (stuck, other):
        worker.outcomes.finished(leases[ref.id], Outcome(False, error="boom"))
    worker.outcomes.finished(leases[good.id], Outcome(True, result="2"))
    row = queue.shard(leases[stuck.id].shard).job(stuck.id)
    queue.client.delete(row)
    queue.client.set(row, "not a hash")
    for _ in range(3):
        with pytest.raises(redis.exceptions.ResponseError):
            worker.turn()
    worker.runners.stop(wait=True)
    assert queue.get(other.id).state == "dead"  # type: ignore[union-attr]
    assert queue.get(good.id).state == "succeeded"  # type: ignore[union-attr]
    assert (worker.processed, worker.failed) == (1, 1)
    assert [job_id for job_id, _ in worker.held.jobs] == [stuck.id] and worker.outcomes.unrecorded()


def test_a_worker_records_every_outcome_valkey_refused(valkey_server: ValkeyProcess,
                                                      tmp_path: Path) -> None:
    # The real worker: its jobs finish while Valkey refuses every call (BUSY), so each nack
    # and ack fails. Once Valkey answers again each outcome is recorded once, no job running
    # twice, and the worker holds nothing (no lease renewed for ever, no slot lost).
    go, log = tmp_path / "go", tmp_path / "worker.log"
    refs = jobs.ends_on_file.enqueue_many([(str(go), i % 2 == 1) for i in range(6)])
    queue = Queue("default")
    worker = start_worker(valkey_server.url, "--concurrency", "6", log=log)
    try:
        wait_for(lambda: queue.counts()["active"] == 6)
        with _busy(valkey_server):
            go.touch()
            wait_for(lambda: log.read_text().count("Valkey refused a command") >= 2)
        wait_for(lambda: queue.counts()["active"] == 0)
        states = {ref.id: queue.get(ref.id) for ref in refs}
        assert sorted(job.state for job in states.values()) == ["dead"] * 3 + ["succeeded"] * 3  # type: ignore[union-attr]
        assert {job.attempts for job in states.values()} == {1}  # type: ignore[union-attr]
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0


def test_at_concurrency_1_a_success_whose_claim_fails_is_recorded_once_valkey_is_back(
        valkey_server: ValkeyProcess) -> None:
    # At concurrency 1 the runner that finished a job acks it in the claim of the next, made on
    # its own thread: when that claim fails, the success goes to the main loop, not away.
    good = jobs.add.enqueue(1, 1)
    queue = Queue("default")
    [lease] = queue.dequeue(count=1, worker="w-1")
    worker = _holding(queue, [lease], concurrency=1)
    valkey_server.stop()
    try:
        worker.claims.finished_one(lease, Outcome(True, result="2"))
        assert worker.outcomes.unrecorded() and worker.wake.is_set()
    finally:
        valkey_server.start()
    worker.turn()
    worker.runners.stop(wait=True)
    assert queue.get(good.id).state == "succeeded"  # type: ignore[union-attr]
    assert worker.processed == 1 and not worker.held.jobs
