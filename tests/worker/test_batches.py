"""Batch handlers under real `runworker` processes, on standalone Valkey and on Valkey Cluster:
jobs enqueued one by one reach their handler in calls of at most `batch`, each keeps its own
result, state and retries; a short batch does not wait past `batch_wait`; a worker killed
mid-batch gives every job back; a batch costs a few script calls, not one per job."""

from __future__ import annotations

import json
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from jobqueue import BatchItem, Queue, chain, chord, conf, enqueue, job
from jobqueue.engine.scripts import source
from jobqueue.exceptions import InvalidOption, JobFailed
from jobqueue.history.mirror import Mirror
from jobqueue.models import Job
from jobqueue.worker.batches import noted
from tests.jobapp import batch_jobs
from tests.jobapp.jobs import add
from tests.servers import ValkeyProcess
from tests.workers import run_burst, serving, start_worker, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
QUEUES = {batch_jobs.QUEUE: {}}
ENV = {"JOBQUEUE_TEST_QUEUES": json.dumps(QUEUES), "JOBQUEUE_TEST_BATCHES": "1"}


@pytest.fixture(params=["standalone", "cluster"])
def url(request: pytest.FixtureRequest, settings: Any) -> str:
    where = serving(request, settings, QUEUES)
    conf.reset()
    return where


def calls_made() -> list[int]:
    return [int(n) for n in Queue(batch_jobs.QUEUE).client.lrange(batch_jobs.CALLS, 0, -1)]


def state(ref: Any) -> str | None:
    info = Queue(batch_jobs.QUEUE).get(ref.id)
    return info.state if info is not None else None


def worker(url: str, *args: str, log: Path | None = None) -> Any:
    return start_worker(url, "--queues", batch_jobs.QUEUE, "--no-mirror", *args, log=log, env=ENV)


def test_jobs_enqueued_one_by_one_run_in_batches_each_with_its_own_result(url: str) -> None:
    refs = [batch_jobs.double.using(lane="tenant-7" if i % 2 else None).enqueue(i) for i in range(94)]
    failing = batch_jobs.double.enqueue("fail")
    assert run_burst(url, "--queues", batch_jobs.QUEUE, "--no-mirror", env=ENV) == 0
    sizes = calls_made()
    assert sum(sizes) == 95 and max(sizes) <= 10 and len(sizes) >= 10
    for i, ref in enumerate(refs):
        assert ref.result(timeout=10) == {"double": i * 2, "attempt": 1, "lane": "tenant-7" if i % 2 else ""}
    with pytest.raises(JobFailed, match="refused"):
        failing.result(timeout=10)
    info = Queue(batch_jobs.QUEUE).get(failing.id)
    assert info is not None and info.state == "dead" and info.attempts == 1


def test_a_short_batch_waits_no_longer_than_its_batch_wait(url: str) -> None:
    refs = batch_jobs.double.enqueue_many([(1,), (2,), (3,)])
    started = time.monotonic()
    proc = worker(url, "--concurrency", "2")
    try:
        assert [ref.result(timeout=30)["double"] for ref in refs] == [2, 4, 6]
        # batch_wait is 0.3 s: a generous bound, far from it, only catches a batch that waited
        # for jobs that never came.
        assert time.monotonic() - started < 20
        assert calls_made() == [3]
    finally:
        proc.terminate()
        proc.wait(60)


@pytest.mark.parametrize("stop", ["SIGKILL", "SIGTERM"])
def test_a_worker_stopped_mid_batch_loses_no_job_and_records_each_once(
    url: str, tmp_path: Path, stop: str
) -> None:
    """Killed mid-batch, a worker gives every job back (its leases lapse) and each runs once
    more; stopped by SIGTERM, it lets the batch finish within its grace period and records each
    job's outcome before it exits."""
    marker = tmp_path / "go"
    refs = [batch_jobs.held_until.enqueue(str(marker)) for _ in range(10)]
    proc = worker(url, "--concurrency", "2")
    try:
        wait_for(lambda: marker.with_suffix(".started").exists(), timeout=60)
        proc.send_signal(getattr(signal, stop))
        if stop == "SIGTERM":
            marker.touch()
            assert proc.wait(60) == 0
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    if stop == "SIGKILL":
        assert not Queue(batch_jobs.QUEUE).client.lrange(batch_jobs.DONE, 0, -1)
        again = worker(url, "--concurrency", "2")
        try:
            assert sorted(ref.result(timeout=60) for ref in refs) == sorted(ref.id for ref in refs)
        finally:
            again.terminate()
            again.wait(60)
    assert sorted(ref.result(timeout=5) for ref in refs) == sorted(ref.id for ref in refs)
    done = Queue(batch_jobs.QUEUE).client.lrange(batch_jobs.DONE, 0, -1)
    assert sorted(done) == sorted(ref.id for ref in refs)  # each recorded exactly once
    for ref in refs:
        info = Queue(batch_jobs.QUEUE).get(ref.id)
        assert info is not None and info.state == "succeeded"
        assert info.attempts == (2 if stop == "SIGKILL" else 1)


def test_a_raise_or_a_wrong_answer_fails_every_job_of_the_batch(url: str) -> None:
    raised = [batch_jobs.raises.enqueue(i) for i in range(5)]
    short = [batch_jobs.too_few.enqueue(i) for i in range(5)]
    assert run_burst(url, "--queues", batch_jobs.QUEUE, "--no-mirror", env=ENV) == 0
    for ref in raised:
        with pytest.raises(JobFailed, match="the whole batch of"):
            ref.result(timeout=10)
    for ref in short:
        with pytest.raises(JobFailed) as failed:
            ref.result(timeout=10)
        assert re.search(r"expected (\d) results, got (\d)", str(failed.value))
        n, m = map(
            int,
            re.search(
                r"expected (\d) results, got (\d)",  # type: ignore[union-attr]
                str(failed.value),
            ).groups(),
        )
        assert m == n - 1


def test_an_async_batch_handler_gets_one_coroutine_call_per_batch(url: str) -> None:
    refs = [batch_jobs.adouble.enqueue(i) for i in range(25)]
    assert run_burst(url, "--queues", batch_jobs.QUEUE, "--no-mirror", env=ENV) == 0
    assert [ref.result(timeout=10) for ref in refs] == [i * 2 for i in range(25)]


def test_the_context_reports_progress_and_a_cancel_of_one_job_of_the_batch(url: str) -> None:
    refs = [batch_jobs.reports.enqueue(i) for i in range(3)]
    queue = Queue(batch_jobs.QUEUE)
    proc = worker(url, "--concurrency", "2")
    try:
        wait_for(lambda: all((queue.get(ref.id) or Any).progress == {"of": 3} for ref in refs), timeout=60)
        queue.cancel(refs[1].id)
        assert refs[0].result(timeout=30) == 0 and refs[2].result(timeout=30) == 2
        wait_for(lambda: state(refs[1]) == "cancelled")
        info = queue.get(refs[0].id)
        assert info is not None and info.batch == f"3 {refs[0].id}"
    finally:
        proc.terminate()
        proc.wait(60)


def test_a_batch_under_processes_runs_in_a_pool_process(url: str) -> None:
    refs = [batch_jobs.double.enqueue(i) for i in range(12)]
    assert (
        run_burst(
            url, "--queues", batch_jobs.QUEUE, "--no-mirror", "--processes", "--concurrency", "1", env=ENV
        )
        == 0
    )
    assert [ref.result(timeout=10)["double"] for ref in refs] == [i * 2 for i in range(12)]
    assert max(calls_made()) <= 10


def test_a_thousand_jobs_in_batches_of_a_hundred_cost_few_script_calls(
    valkey_server: ValkeyProcess, settings: Any
) -> None:
    """At batch=100, the claims and acks of 1,000 jobs take at most 30 script calls (0.03 per
    job), and the batch notes one per batch, counted by the server (its slow log, every
    command logged). The handler's `batch_wait` is long, so each batch fills however slowly a
    loaded machine claims: exactly ten notes."""
    settings.JOBQUEUE = {"URL": valkey_server.url, "QUEUES": {"default": {}, **QUEUES}}
    conf.reset()
    refs = batch_jobs.count_full.enqueue_many([(i,) for i in range(1000)])

    def run() -> None:
        args = ("--queues", batch_jobs.QUEUE, "--no-mirror", "--concurrency", "4")
        assert run_burst(valkey_server.url, *args, env=ENV) == 0

    counted = script_calls(Queue(batch_jobs.QUEUE).client, ("claim", "ack", "nack", "batch"), run)
    assert sum(ref.result(timeout=10) for ref in refs) == sum(range(1000))
    print("script calls", counted)
    assert counted.get("batch", 0) == 10, counted  # (one note per batch: batch.lua)
    assert sum(counted.values()) <= 30, counted  # claims, acks and notes: 0.03 a job


def script_calls(client: Any, names: tuple[str, ...], run: Callable[[], Any]) -> dict[str, int]:
    """The calls of these scripts the server ran while `run` ran, counted from its slow log
    (every command logged)."""
    shas = {source(name).sha: name for name in names}
    for name in names:  # (a first call refused with NOSCRIPT would be logged too)
        client.script_load(source(name).text)
    client.config_set("slowlog-max-len", 100_000)
    client.config_set("slowlog-log-slower-than", 0)
    client.slowlog_reset()
    try:
        run()
        entries = client.slowlog_get(100_000)
    finally:
        client.config_set("slowlog-log-slower-than", 10_000)
    counted: dict[str, int] = {}
    for entry in entries:
        raw = entry["command"]
        command = (raw.decode() if isinstance(raw, bytes) else str(raw)).split()[:2]
        if len(command) == 2 and command[0].upper() == "EVALSHA" and command[1] in shas:
            counted[shas[command[1]]] = counted.get(shas[command[1]], 0) + 1
    return counted


def test_a_batch_records_its_fifty_failures_in_one_call_each_per_its_own_options(
    valkey_server: ValkeyProcess, settings: Any
) -> None:
    """A batch of 100 of which 50 items are exception instances: its failures are recorded in
    one script call (its successes ride a claim or one ack), each job fenced by its token and
    retried or dead per its own options; the counters count each."""
    settings.JOBQUEUE = {"URL": valkey_server.url, "QUEUES": {"default": {}, **QUEUES}}
    conf.reset()
    handler = batch_jobs.half_fails
    refs, dead, retried = [], [], []
    for i in range(100):
        if i % 2:
            refs.append(handler.enqueue(i))
        elif i % 4:
            dead.append(handler.using(max_attempts=1).enqueue("fail"))
        else:
            retried.append(handler.using(max_attempts=3, backoff=600).enqueue("fail"))
    queue = Queue(batch_jobs.QUEUE)
    client = queue.client

    def run() -> None:
        proc = worker(valkey_server.url, "--concurrency", "2")
        try:
            wait_for(lambda: all(state(ref) == "dead" for ref in dead), timeout=60)
            wait_for(lambda: all(state(ref) == "scheduled" for ref in retried), timeout=60)
            wait_for(lambda: all(state(ref) == "succeeded" for ref in refs), timeout=60)
        finally:
            proc.terminate()
            proc.wait(60)

    counted = script_calls(client, ("claim", "ack", "nack", "nack_many", "batch"), run)
    print("script calls", counted)
    assert calls_made() == [] and counted.get("batch") == 1, counted  # (one batch of 100)
    assert counted.get("nack", 0) == 0 and counted.get("nack_many") == 1, counted
    assert counted.get("ack", 0) <= 1, counted  # (else its successes rode a claim)
    assert [ref.result(timeout=5) for ref in refs] == list(range(1, 100, 2))
    for ref in dead:
        info = queue.get(ref.id)
        assert info is not None and info.attempts == 1 and "fails" in info.last_error
    later = time.time() + 500
    for ref in retried:
        info = queue.get(ref.id)
        assert info is not None and info.attempts == 1 and info.run_after is not None
        assert info.run_after.timestamp() > later and len(info.history) == 1
    meta = client.hgetall(queue.shard(0).key("meta"))
    assert (meta.get("n_dead"), meta.get("n_failed"), meta.get("n_succeeded")) == ("25", "25", "50")


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"batch": 0}, "batch must be an integer in 1…1000"),
        ({"batch": 1001}, "batch must be an integer in 1…1000"),
        ({"batch": 2.5}, "batch must be an integer"),
        ({"batch": True}, "batch must be an integer"),
        ({"batch": "10"}, "batch must be an integer"),
        ({"batch": 10, "batch_wait": -1}, "batch_wait must be within 0…3600"),
        ({"batch": 10, "batch_wait": 3601}, "batch_wait must be within 0…3600"),
        ({"batch": 10, "batch_wait": "soon"}, "batch_wait must be a number"),
        ({"batch": 10, "batch_wait": True}, "batch_wait must be a number"),
        ({"batch_wait": 1.0}, "batch_wait= needs batch="),
    ],
)
def test_bad_batch_options_are_refused_at_the_decorator(options: dict[str, Any], says: str) -> None:
    with pytest.raises(InvalidOption, match=re.escape(says)):

        @job(name="tests.bad_batch", **options)
        def bad(items: list[BatchItem]) -> list[Any]:
            return []


@pytest.mark.parametrize(
    ("handler", "mode"),
    [("overruns", ()), ("overruns", ("--processes",)), ("aoverruns", ())],
    ids=["thread", "process", "async"],
)
def test_a_batch_past_its_timeout_fails_each_of_its_jobs_with_job_timeout(
    url: str, handler: str, mode: tuple[str, ...]
) -> None:
    refs = getattr(batch_jobs, handler).enqueue_many([(4,), (4,), (4,)])
    proc = worker(url, "--concurrency", "1", *mode)
    try:
        for ref in refs:  # (recorded at the deadline: before the handler's 4 s are up)
            with pytest.raises(JobFailed, match=re.escape("passed its timeout of 0.5 s")):
                ref.result(timeout=30)
    finally:
        proc.terminate()
        proc.wait(60)
    for ref in refs:
        info = Queue(batch_jobs.QUEUE).get(ref.id)
        assert info is not None and info.state == "dead" and info.attempts == 1


def test_batch_jobs_come_from_flows_and_from_an_enqueue_by_name(url: str) -> None:
    """Each job of a chord's header, of a chain and of an enqueue by dotted name is a job of its
    own that the worker runs in batches; a flow's step gets what came before as its item's
    first argument."""
    flow = chord([batch_jobs.count.s(i) for i in range(12)], batch_jobs.count.s()).enqueue()
    steps = chain(batch_jobs.count.s(5), batch_jobs.double.s()).enqueue()
    named = enqueue("tests.jobapp.batch_jobs.double", args=[21])
    assert run_burst(url, "--queues", batch_jobs.QUEUE, "--no-mirror", env=ENV) == 0
    assert flow.result(timeout=10) == list(range(12))
    assert steps.result(timeout=10)["double"] == 10
    assert named.result(timeout=10)["double"] == 42


def test_the_job_page_says_which_jobs_ran_together(
    admin_client: Any, settings: Any, valkey_server: ValkeyProcess
) -> None:
    """The note batch.lua leaves on each job's row: the job page names the batch's first job
    (a link to it) and its size; the first job's own page says it was the first."""
    settings.JOBQUEUE = {"URL": valkey_server.url, "QUEUES": {"default": {}, **QUEUES}}
    conf.reset()
    refs = batch_jobs.double.enqueue_many([(1,), (2,), (3,)])
    leases = Queue(batch_jobs.QUEUE).dequeue(count=3)
    assert noted(leases) == ["", "", ""]
    first, second = leases[0].job_id, leases[1].job_id
    page = admin_client.get(f"/admin/jobqueue/job/live/jobs/batches/{second}/").content.decode()
    assert "ran in a batch of 3 with" in page
    assert f'/admin/jobqueue/job/live/jobs/batches/{first}/">{first}</a>' in page
    page = admin_client.get(f"/admin/jobqueue/job/live/jobs/batches/{first}/").content.decode()
    assert "ran in a batch of 3, first of it" in page
    assert {ref.id for ref in refs} == {lease.job_id for lease in leases}


def test_the_batch_a_job_ran_in_reaches_the_history_and_its_page_from_the_database(
    admin_client: Any, settings: Any, valkey_server: ValkeyProcess
) -> None:
    """The batch note rides the job's terminal event into the `Job` table; once the Valkey row
    is gone, the job page read from the database still says which jobs ran together. A job
    run alone writes no `batch` field in its event."""
    settings.JOBQUEUE = {"URL": valkey_server.url, "QUEUES": {"default": {}, **QUEUES}}
    conf.reset()
    refs = batch_jobs.double.enqueue_many([(1,), (2,), (3,)])
    alone = add.using(queue=batch_jobs.QUEUE).enqueue(1, 2)
    assert run_burst(valkey_server.url, "--queues", batch_jobs.QUEUE, "--no-mirror", env=ENV) == 0
    queue = Queue(batch_jobs.QUEUE)
    events = {fields["id"]: fields for _, fields in queue.client.xrange(queue.shard(0).key("done"))}
    marks = {events[ref.id]["batch"] for ref in refs}
    assert len(marks) == 1 and marks.pop().startswith("3 ")
    assert "batch" not in events[alone.id]
    assert Mirror([queue], "test").step() == 4
    first = events[refs[0].id]["batch"].split()[1]
    for ref in (*refs, alone):
        queue.client.delete(queue.shard(0).job(ref.id))
    rows = {row.id: row.batch for row in Job.objects.filter(id__in=[*(ref.id for ref in refs), alone.id])}
    assert rows == {**{ref.id: f"3 {first}" for ref in refs}, alone.id: None}
    other = next(ref.id for ref in refs if ref.id != first)
    page = admin_client.get(f"/admin/jobqueue/job/live/jobs/batches/{other}/").content.decode()
    assert "ran in a batch of 3 with" in page, page
    assert f'/admin/jobqueue/job/live/jobs/batches/{first}/">{first}</a>' in page
    page = admin_client.get(f"/admin/jobqueue/job/live/jobs/batches/{alone.id}/").content.decode()
    assert alone.id in page and "ran in a batch" not in page


def test_a_batch_handlers_job_on_a_queue_of_plain_handlers_still_gets_a_list(url: str) -> None:
    """The worker serves only `default`, whose handlers take no batches: a batch handler's job
    enqueued there is still handed over as a list of items (a batch as large as a claim
    brings)."""
    refs = [batch_jobs.double.using(queue="default").enqueue(i) for i in range(3)]
    assert run_burst(url, "--queues", "default", "--no-mirror", env=ENV) == 0
    assert [ref.result(timeout=10)["double"] for ref in refs] == [0, 2, 4]


def test_each_job_of_a_running_batch_has_its_lease_renewed(url: str) -> None:
    """A batch that runs three times its jobs' lease: the reaper (run here all along) finds no
    lease of it lapsed, and each job succeeds on its first attempt."""
    refs = batch_jobs.outlasts_its_lease.enqueue_many([(3,)] * 5)
    queue, reaped = Queue(batch_jobs.QUEUE), 0
    proc = worker(url, "--concurrency", "1")
    try:

        def reap_until_done() -> bool:
            nonlocal reaped
            reaped += queue.reap()
            return all(state(ref) == "succeeded" for ref in refs)

        wait_for(reap_until_done, timeout=60, every=0.05)
    finally:
        proc.terminate()
        proc.wait(60)
    assert reaped == 0 and [ref.result(timeout=5) for ref in refs] == [1] * 5


@pytest.mark.parametrize(
    "mode",
    [("--concurrency", "2"), ("--concurrency", "1"), ("--processes",)],
    ids=["threads", "one", "processes"],
)
def test_sigterm_hands_back_the_jobs_of_a_half_filled_batch_uncharged(
    url: str, tmp_path: Path, mode: tuple[str, ...]
) -> None:
    """A worker stopped (SIGTERM) while a batch handler's buffer holds jobs that wait for more
    (its batch_wait is a minute) hands each back at once, its attempt uncharged; nothing is
    lost, and the attempt it was claimed for is not counted against its budget."""
    refs = batch_jobs.count_full.enqueue_many([(1,), (2,), (3,)])
    log = tmp_path / "worker.log"
    proc = worker(url, *mode, log=log)
    try:
        wait_for(lambda: all(state(ref) == "active" for ref in refs), timeout=60)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert [state(ref) for ref in refs] == ["pending"] * 3
    assert log.read_text().count("outcome=released") == 3
    for ref in refs:
        info = Queue(batch_jobs.QUEUE).get(ref.id)
        assert info is not None and info.attempts == 1 and info.batch is None  # (never ran)
        assert (
            Queue(batch_jobs.QUEUE).client.hget(
                Queue(batch_jobs.QUEUE).shard(info.shard).job(ref.id), "uncharged"
            )
            == "1"
        )


def test_a_failing_flow_member_in_a_batch_fails_its_flow_and_the_others_go_on(url: str) -> None:
    """Two chains' first steps and 98 other jobs in one batch: the failures are recorded
    together, a failing member's dependent is cancelled as for a member run alone, and the
    succeeding member's dependent runs."""
    handler = batch_jobs.half_fails.using(max_attempts=1)
    broken = chain(handler.s("fail"), batch_jobs.double.s()).enqueue()
    whole = chain(handler.s(5), batch_jobs.double.s()).enqueue()
    others = handler.enqueue_many([("fail",)] + [(i,) for i in range(97)])
    assert run_burst(url, "--queues", batch_jobs.QUEUE, "--no-mirror", env=ENV) == 0
    assert whole.result(timeout=10)["double"] == 10
    with pytest.raises(JobFailed):
        broken.result(timeout=10)
    assert state(others[0]) == "dead" and [ref.result(timeout=10) for ref in others[1:]] == list(range(97))
    assert state(broken) == "cancelled" and calls_made() == [1]  # (the whole chain's `double`)


def test_a_worker_with_no_batch_handler_registered_runs_such_jobs_as_before(url: str) -> None:
    """A worker whose project registers no batch handler (the test's handlers unimported) fails
    a job named for one as it fails any job of an unknown handler, on the batches' queue too."""
    named = enqueue("tests.jobapp.batch_jobs.double", args=[1], queue=batch_jobs.QUEUE)
    unknown = enqueue("tests.jobapp.nowhere", args=[1], queue=batch_jobs.QUEUE)
    env = {"JOBQUEUE_TEST_QUEUES": json.dumps(QUEUES)}
    assert run_burst(url, "--queues", batch_jobs.QUEUE, "--no-mirror", env=env) == 0
    infos = [Queue(batch_jobs.QUEUE).get(ref.id) for ref in (named, unknown)]
    assert [info.state for info in infos if info] == ["dead", "dead"]
    assert [info.attempts for info in infos if info] == [1, 1]
    assert [info.batch for info in infos if info] == [None, None]
    assert "tests.jobapp.batch_jobs.double" in infos[0].last_error  # type: ignore[union-attr]


def test_a_lane_cap_and_the_global_cap_count_each_job_of_a_batch(url: str) -> None:
    """A lane capped at 3 and a queue capped at 4 (both set live): no batch holds more of the
    lane's jobs than its cap nor more jobs than the queue's cap, and every job runs."""
    queue = Queue(batch_jobs.QUEUE)
    queue.set_lane_concurrency("narrow", 3)
    queue.set_global_concurrency(4)
    try:
        narrow = [batch_jobs.double.using(lane="narrow").enqueue(i) for i in range(9)]
        assert run_burst(url, "--queues", batch_jobs.QUEUE, "--no-mirror", env=ENV) == 0
        assert [ref.result(timeout=10)["double"] for ref in narrow] == [i * 2 for i in range(9)]
        assert sum(calls_made()) == 9 and max(calls_made()) <= 3
        queue.set_lane_concurrency("narrow", None)
        Queue(batch_jobs.QUEUE).client.delete(batch_jobs.CALLS)
        wide = batch_jobs.double.enqueue_many([(i,) for i in range(12)])
        assert run_burst(url, "--queues", batch_jobs.QUEUE, "--no-mirror", env=ENV) == 0
        assert [ref.result(timeout=10)["double"] for ref in wide] == [i * 2 for i in range(12)]
        assert sum(calls_made()) == 12 and max(calls_made()) <= 4
    finally:
        queue.set_lane_concurrency("narrow", None)
        queue.set_global_concurrency(None)
