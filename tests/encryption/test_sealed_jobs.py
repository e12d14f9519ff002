"""Encryption at rest: a sealed job's args, result, checkpoint, progress and error are stored
sealed in Valkey and the database; its handler, `result()` and `get_job()` see plain values."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis

from jobqueue import Queue, chord, get_job, sealing
from jobqueue.exceptions import ConfigurationError, JobFailed
from jobqueue.history import outbox
from jobqueue.models import Job
from tests.jobapp import jobs
from tests.servers import ValkeyProcess
from tests.workers import run_burst, wait_for

from .conftest import NEW, OLD, SECRET, client, database_dump, kid, sealed_settings, valkey_dump

pytestmark = pytest.mark.django_db(transaction=True)


def _nothing_plain(*texts: str) -> None:
    stored = database_dump() + valkey_dump(client())
    for text in (SECRET, *texts):
        assert text not in stored, f"{text!r} is stored in the clear"


def test_a_waiting_and_a_finished_sealed_job_store_no_byte_of_their_data(settings: Any, where: str) -> None:
    env = sealed_settings(settings, where, [NEW])
    done = jobs.confide.using(queue="vault").enqueue(SECRET)
    failed = jobs.confide.using(queue="vault").enqueue(SECRET + "-bad", fail=True)
    durable = jobs.confide.using(queue="vaultd").enqueue(SECRET + "-kept")
    assert done.id in valkey_dump(client()) and durable.id in database_dump()  # (it reads them)
    _nothing_plain()
    assert run_burst(where, "--queues", "vault,vaultd", env=env) == 0
    assert done.result(5) == {"echo": SECRET.upper(), "checkpoint": {"seen": SECRET}}
    with pytest.raises(JobFailed) as failure:
        failed.result(5)
    assert f"cannot use {SECRET}-bad" in str(failure.value)
    wait_for(
        lambda: (
            Job.objects.filter(
                pk__in=[done.id, failed.id, durable.id], state__in=["succeeded", "dead"]
            ).count()
            == 3
        )
    )
    _nothing_plain(SECRET.upper())
    info = get_job(done.id, "vault")
    assert info is not None and info.payload["args"] == [SECRET] and info.progress == {"at": SECRET}
    assert info.result["echo"] == SECRET.upper()
    raw = Queue("vault").get(done.id)
    assert raw is not None and sealing.payload_key(raw.payload) == kid(NEW)
    assert sealing.sealed_key(raw.result) == kid(NEW)


def test_a_handler_sealed_by_its_own_option_on_a_plain_queue(
    settings: Any, valkey_server: ValkeyProcess
) -> None:
    env = sealed_settings(settings, valkey_server.url, [NEW])
    ref = jobs.confide_sealed.enqueue(SECRET)
    plain = jobs.add.enqueue(2, 3)
    _nothing_plain()
    assert run_burst(valkey_server.url, env=env) == 0
    assert ref.result(5) == SECRET[::-1] and plain.result(5) == 5
    _nothing_plain(SECRET[::-1])
    assert Queue("default").get(plain.id).payload["args"] == [2, 3]  # type: ignore[union-attr]


def test_a_rotated_in_key_runs_old_jobs_and_reseal_moves_them(
    settings: Any, valkey_server: ValkeyProcess
) -> None:
    from tests.workers import manage

    sealed_settings(settings, valkey_server.url, [OLD])
    waiting = [jobs.confide.using(queue="vault").enqueue(f"{SECRET}-{i}") for i in range(3)]
    kept = jobs.confide.using(queue="vaultd").enqueue(SECRET)
    env = sealed_settings(settings, valkey_server.url, [NEW, OLD])  # the new key goes first
    first = jobs.confide.using(queue="vault").enqueue(SECRET + "-new")
    assert sealing.payload_key(Queue("vault").get(first.id).payload) == kid(NEW)  # type: ignore[union-attr]
    out = manage("jobqueue", "reseal", "--chunk", "2", url=valkey_server.url, env=env)
    assert out.returncode == 0, out.stderr
    assert "0 value(s) still need an old key" in out.stdout, out.stdout
    row = Job.objects.get(pk=kept.id)
    assert sealing.payload_key(row.payload) == kid(NEW)
    again = manage("jobqueue", "reseal", url=valkey_server.url, env=env)
    assert "resealed 0 value(s)" in again.stdout
    # the old key can go now: every job still runs
    env = sealed_settings(settings, valkey_server.url, [NEW])
    assert run_burst(valkey_server.url, "--queues", "vault,vaultd", env=env) == 0
    assert [ref.result(5)["echo"] for ref in waiting] == [f"{SECRET}-{i}".upper() for i in range(3)]
    assert kept.result(5)["echo"] == SECRET.upper()


def test_a_worker_with_both_keys_runs_jobs_sealed_under_either(
    settings: Any, valkey_server: ValkeyProcess
) -> None:
    sealed_settings(settings, valkey_server.url, [OLD])
    old = jobs.confide.using(queue="vault").enqueue(SECRET)
    env = sealed_settings(settings, valkey_server.url, [NEW, OLD])
    new = jobs.confide.using(queue="vault").enqueue(SECRET)
    assert run_burst(valkey_server.url, "--queues", "vault", env=env) == 0
    assert old.result(5) == new.result(5)


def test_a_dropped_key_kills_only_its_jobs_naming_the_key(
    settings: Any, valkey_server: ValkeyProcess
) -> None:
    sealed_settings(settings, valkey_server.url, [OLD])
    lost = jobs.confide.using(queue="vault").enqueue(SECRET)
    env = sealed_settings(settings, valkey_server.url, [NEW])
    fine = jobs.confide.using(queue="vault").enqueue(SECRET)
    plain = jobs.add.enqueue(1, 2)
    assert run_burst(valkey_server.url, "--queues", "default,vault", env=env) == 0
    assert fine.result(5)["echo"] == SECRET.upper() and plain.result(5) == 3
    with pytest.raises(JobFailed) as failure:
        lost.result(5)
    assert failure.value.state == "dead" and kid(OLD) in str(failure.value)
    assert OLD not in str(failure.value)
    wait_for(lambda: Job.objects.filter(pk=lost.id, state="dead").exists())
    # its payload, in Valkey and in its mirror row: kept for whoever still holds the key
    assert _reseal().left == {kid(OLD): 2}


def _reseal() -> Any:
    from jobqueue.operations.reseal import reseal

    return reseal(client())


def test_a_tampered_or_copied_value_kills_only_that_job(settings: Any, valkey_server: ValkeyProcess) -> None:
    env = sealed_settings(settings, valkey_server.url, [NEW])
    tampered, copied, fine = (jobs.confide.using(queue="vault").enqueue(SECRET) for _ in range(3))
    valkey, keys = client(), Queue("vault").shard(0)
    payload = json.loads(valkey.hget(keys.job(tampered.id), "payload"))
    body = payload["sealed"]
    payload["sealed"] = body[:-5] + ("A" if body[-5] != "A" else "B") + body[-4:]
    valkey.hset(keys.job(tampered.id), "payload", json.dumps(payload))
    valkey.hset(keys.job(copied.id), "payload", valkey.hget(keys.job(fine.id), "payload"))
    assert run_burst(valkey_server.url, "--queues", "vault", env=env) == 0
    assert fine.result(5)["echo"] == SECRET.upper()
    for ref in (tampered, copied):
        with pytest.raises(JobFailed) as failure:
            ref.result(5)
        assert "does not open" in str(failure.value) and kid(NEW) in str(failure.value)


def test_a_chord_of_sealed_jobs_hands_its_callback_plain_results(settings: Any, where: str) -> None:
    env = sealed_settings(settings, where, [NEW])
    header = [jobs.mul.using(queue="vault").s(f"{SECRET}-{i}", 2) for i in range(3)]
    ref = chord(header, jobs.total.using(queue="vault").s()).enqueue()
    assert run_burst(where, "--queues", "vault", env=env) == 0
    assert ref.result(10) == [f"{SECRET}-{i}" * 2 for i in range(3)]  # (the callback's values)
    _nothing_plain()


def test_a_failed_member_of_a_sealed_chord_hands_its_callback_an_opened_error(
    settings: Any, valkey_server: ValkeyProcess
) -> None:
    env = sealed_settings(settings, valkey_server.url, [NEW])
    header = [
        jobs.mul.using(queue="vault").s(SECRET, 1),
        jobs.fails_with.using(queue="vault").s(f"bad {SECRET}"),
    ]
    ref = chord(header, jobs.total.using(queue="vault").s(), on_failure="ignore").enqueue()
    assert run_burst(valkey_server.url, "--queues", "vault", env=env) == 0
    ok, failed = ref.result(10)
    assert ok == SECRET and failed["state"] == "dead"
    # the error, sealed, fits its slot only when short; else the callback is told where it is
    assert f"bad {SECRET}" in failed["error"] or "cut short" in failed["error"]
    _nothing_plain()


def test_a_durable_sealed_job_is_restored_sealed_after_valkey_lost_its_data(
    settings: Any, valkey_server: ValkeyProcess
) -> None:
    env = sealed_settings(settings, valkey_server.url, [NEW])
    ref = jobs.confide.using(queue="vaultd").enqueue(SECRET)
    redis.Redis.from_url(valkey_server.url).flushall()  # Valkey lost its data
    assert outbox.restore([Queue("vaultd")]) == 1
    _nothing_plain()
    assert run_burst(valkey_server.url, "--queues", "vaultd", env=env) == 0
    assert ref.result(5)["echo"] == SECRET.upper()


def test_sealed_celery_tasks_run_and_answer_plain(settings: Any, valkey_server: ValkeyProcess) -> None:
    from tests.jobapp import celery_tasks

    env = sealed_settings(settings, valkey_server.url, [NEW])
    result = celery_tasks.shout.apply_async([SECRET], queue="vault")
    _nothing_plain()
    assert run_burst(valkey_server.url, "--queues", "vault", env=env) == 0
    assert result.get(timeout=5) == SECRET.upper() + "!"
    _nothing_plain(SECRET.upper())


def test_a_sealed_queue_without_keys_stores_nothing(settings: Any, valkey_server: ValkeyProcess) -> None:
    sealed_settings(settings, valkey_server.url, [])
    with pytest.raises(ConfigurationError, match="ENCRYPTION_KEYS"):
        jobs.confide.using(queue="vault").enqueue(SECRET)
    with pytest.raises(ConfigurationError, match="ENCRYPTION_KEYS"):
        jobs.confide.using(queue="vaultd").enqueue(SECRET)
    assert client().dbsize() == 0 and not Job.objects.exists()


def test_a_value_sealed_for_one_job_does_not_open_for_another(
    settings: Any, valkey_server: ValkeyProcess
) -> None:
    sealed_settings(settings, valkey_server.url, [NEW])
    ring = sealing.keyring()
    token = ring.seal('{"a":1}', "JOB0one", "result")
    assert ring.open(token, "JOB0one", "result") == '{"a":1}'
    for job_id, field in (("JOB0two", "result"), ("JOB0one", "progress")):
        with pytest.raises(sealing.SealError, match=kid(NEW)):
            ring.open(token, job_id, field)


def test_a_minted_id_taken_already_is_minted_again_with_its_args_sealed_for_the_new_one(
    settings: Any, valkey_server: ValkeyProcess
) -> None:
    from jobqueue.spec import JobSpec, prepare

    sealed_settings(settings, valkey_server.url, [NEW])
    queue = Queue("vault")
    taken = jobs.confide.using(queue="vault").enqueue("first")
    payload = {"handler": jobs.confide.name, "args": [SECRET]}
    job = prepare(JobSpec(payload, job_id=taken.id), queue.options)._replace(minted=True)
    [ref] = queue.enqueue_prepared([job])
    assert ref.id != taken.id
    leases = {lease.job_id: lease for lease in queue.dequeue(count=2)}
    assert sealing.open_payload(leases[ref.id].payload, ref.id) == ([SECRET], {})
    assert sealing.open_payload(leases[taken.id].payload, taken.id) == (["first"], {})


def test_a_django_task_on_a_sealed_queue_answers_plain(settings: Any, valkey_server: ValkeyProcess) -> None:
    from tests.inprocess import burst
    from tests.jobapp.django_tasks import multiply

    sealed_settings(settings, valkey_server.url, [NEW])
    settings.TASKS = {"default": {"BACKEND": "jobqueue.tasks.ValkeyBackend", "QUEUES": ["vault"]}}
    enqueued = multiply.using(queue_name="vault").enqueue(1234567, 89)
    assert enqueued.args == [1234567, 89]
    assert "1234567" not in valkey_dump(client())
    burst("vault")  # (in this process: its TASKS setting names the queue)
    done = multiply.get_result(enqueued.id)
    assert done.args == [1234567, 89] and done.return_value == 1234567 * 89
    assert str(1234567 * 89) not in valkey_dump(client())


def test_a_sealed_error_cut_to_fit_a_slot_or_the_history_says_where_it_is_whole(
    settings: Any, valkey_server: ValkeyProcess
) -> None:
    sealed_settings(settings, valkey_server.url, [NEW])
    token = sealing.keyring().seal("Traceback: " + SECRET * 100, "JOB0member", "error")
    for cut in (token[-1000:], token[:500]):  # (a flow's slot keeps the tail, the history the head)
        slot = sealing.open_slot({"error": cut, "state": "dead", "job": "JOB0member"})
        assert "cut short" in slot["error"] and "JOB0member" in slot["error"]
    short = sealing.keyring().seal(f"ValueError: {SECRET}", "JOB0member", "error")
    slot = sealing.open_slot({"error": short, "state": "dead", "job": "JOB0member"})
    assert slot["error"] == f"ValueError: {SECRET}"


def test_a_sealed_checkpoint_opens_for_the_next_attempt(settings: Any, valkey_server: ValkeyProcess) -> None:
    from jobqueue import JobContext

    sealed_settings(settings, valkey_server.url, [NEW])
    queue = Queue("vault")
    ref = jobs.confide.using(queue="vault", max_attempts=2).enqueue(SECRET)
    [lease] = queue.dequeue(count=1)
    assert JobContext(lease).save_checkpoint({"page": SECRET})
    assert queue.release(lease)
    assert SECRET not in valkey_dump(client())
    [again] = queue.dequeue(count=1)
    assert again.job_id == ref.id and JobContext(again).checkpoint == {"page": SECRET}


def test_a_sealed_queue_refuses_a_payload_that_is_no_dict(
    settings: Any, valkey_server: ValkeyProcess
) -> None:
    from jobqueue.exceptions import InvalidOption

    sealed_settings(settings, valkey_server.url, [NEW])
    with pytest.raises(InvalidOption, match="must be a dict"):
        Queue("vault").enqueue([SECRET])
    assert client().dbsize() == 0


def test_reseal_moves_a_result_a_chain_handed_its_next_step(
    settings: Any, valkey_server: ValkeyProcess
) -> None:
    from jobqueue import chain
    from jobqueue.worker.executor import execute, resolve

    sealed_settings(settings, valkey_server.url, [OLD])
    queue = Queue("vault")
    chain(jobs.mul.using(queue="vault").s(SECRET, 2), jobs.confide.using(queue="vault").s()).enqueue()
    [first] = queue.dequeue(count=1)
    outcome = execute(first)
    assert outcome.ok and queue.ack_encoded([(first, outcome.result)])[0].state == "succeeded"
    sealed_settings(settings, valkey_server.url, [NEW, OLD])
    report = _reseal()
    assert report.resealed >= 2 and not report.left  # (its result, and the next step's args)
    sealed_settings(settings, valkey_server.url, [NEW])
    [second] = queue.dequeue(count=1)
    _, args, _ = resolve(second)  # type: ignore[misc]
    assert args == [SECRET * 2]


def test_a_sealed_jobs_mirror_row_opens_for_get_job_and_result(
    settings: Any, valkey_server: ValkeyProcess
) -> None:
    env = sealed_settings(settings, valkey_server.url, [NEW])
    done = jobs.confide.using(queue="vault").enqueue(SECRET)
    failed = jobs.confide.using(queue="vault").enqueue(SECRET, fail=True)
    assert run_burst(valkey_server.url, "--queues", "vault", env=env) == 0
    wait_for(lambda: Job.objects.filter(pk__in=[done.id, failed.id], progress__isnull=False).count() == 2)
    redis.Redis.from_url(valkey_server.url).flushall()  # (the rows' retention ended)
    info = get_job(done.id, "vault")
    assert info is not None and info.source == "mirror" and info.payload["args"] == [SECRET]
    assert info.progress == {"at": SECRET} and not info.corrupt
    assert done.result(1) == {"echo": SECRET.upper(), "checkpoint": {"seen": SECRET}}
    with pytest.raises(JobFailed, match=f"cannot use {SECRET}"):
        failed.result(1)
