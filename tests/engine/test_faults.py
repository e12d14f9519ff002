"""Faults meeting features: a reply lost to a stalled Valkey, a worker killed while its idle offer
stood, an outage that outlasts the connection layer's patience. Each fault is a real one: a long
script holds the server, a SIGKILL, a port nobody listens on."""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import pytest
import redis

from jobqueue import Queue, chain, conf, ids
from jobqueue.engine import wire
from jobqueue.engine.scripts import caller
from jobqueue.engine.store import READ_SLACK
from jobqueue.history import outbox
from jobqueue.keys import ShardKeys, placement_hash
from jobqueue.models import Job
from jobqueue.spec import JobSpec
from jobqueue.worker.waiters import IDLE_WAIT
from tests.jobapp import jobs
from tests.servers import ValkeyProcess
from tests.workers import start_worker, wait_for


@pytest.fixture
def slow_server() -> Iterator[ValkeyProcess]:
    """A Valkey of this test's own that takes DEBUG SLEEP: a server that stalls whole, reading
    nothing until it wakes (then it runs what was sent meanwhile, even to a client gone)."""
    server = ValkeyProcess("--enable-debug-command", "local").start()
    yield server
    server.cleanup()


@contextmanager
def stalled(url: str, seconds: float) -> Iterator[None]:
    """Valkey asleep for `seconds` (DEBUG SLEEP from another client): the block is entered once
    a PING with a short timeout gets no answer."""
    other = redis.Redis.from_url(url, socket_timeout=30)
    thread = threading.Thread(target=other.execute_command, args=("DEBUG", "SLEEP", seconds),
                              daemon=True)
    thread.start()
    probe = redis.Redis.from_url(url, socket_timeout=0.05)

    def asleep() -> bool:
        try:
            probe.ping()
        except redis.TimeoutError:
            return True
        return False

    try:
        wait_for(asleep, timeout=10, every=0.001)
        yield
    finally:
        thread.join()
        other.close()
        probe.close()


def impatient(url: str) -> Any:
    """A client that gives up on a reply after 0.25 s (the lost reply of these tests)."""
    return redis.Redis.from_url(url, socket_timeout=0.25, **conf.CLIENT_OPTIONS)


def test_a_claim_whose_reply_is_lost_hands_its_jobs_back_uncharged(
        slow_server: ValkeyProcess) -> None:
    queue = Queue("default", client=impatient(slow_server.url))
    assert queue.dequeue(worker="w1") == []  # (the claim script is loaded: EVALSHA finds it)
    ref = queue.enqueue("once", max_attempts=1, lease=30)
    with stalled(slow_server.url, 0.8), pytest.raises(redis.TimeoutError):
        queue.dequeue(count=1, worker="w1")  # the claim runs after the stall: its reply is lost
    [lease] = queue.dequeue(count=1, worker="w1")  # the lost claim's job came back, uncharged
    assert lease.job_id == ref.id and queue.ack(lease, "done")
    info = queue.get(ref.id)
    assert info is not None and info.state == "succeeded"


def test_a_claim_on_a_connection_the_server_closed_reconnects_before_it_sends(
        valkey_server: ValkeyProcess) -> None:
    # The server closes a claim's kept connection (CLIENT KILL here; its idle `timeout`, or a
    # proxy, the same): nothing was sent on it yet, so the next claim reconnects and goes,
    # rather than fail as a claim whose reply was lost.
    client = redis.Redis.from_url(valkey_server.url, **conf.CLIENT_OPTIONS)
    queue = Queue("default", client=client)
    assert queue.dequeue(worker="w1") == []  # (its connection is kept for the next claim)
    ref = jobs.add.enqueue(1, 2)
    admin = redis.Redis.from_url(valkey_server.url)
    for seen in admin.client_list():
        if seen["cmd"] != "client|list":
            admin.client_kill_filter(_id=seen["id"])
    [lease] = queue.dequeue(count=1, worker="w1")
    assert lease.job_id == ref.id and queue.ack(lease, "3")
    before = admin.info("stats")["total_connections_received"]
    assert wire.call_once(client, ("PING",)) == "PONG"  # (a live one: no new connection)
    assert admin.info("stats")["total_connections_received"] == before
    admin.close()


def test_a_claim_across_shards_keeps_what_earlier_shards_leased_when_a_later_reply_is_lost(
        slow_server: ValkeyProcess) -> None:
    """A claim for more jobs than one shard holds goes on to the next shard; when that shard's
    reply is lost (here: a claim of many jobs outlasting the client's patience), the leases the
    earlier shards gave are returned, not dropped; the lost claim's jobs come back uncharged."""
    setup = Queue("default", client=conf.client_for_url(slow_server.url), shards=2)
    lanes = {placement_hash(lane) % 2: lane for lane in ("a", "b", "c", "d", "e", "f")}
    setup.enqueue_many([JobSpec(i, lane=lanes[1]) for i in range(40_000)])
    done, second = (setup.enqueue(name, lane=lanes[0]).id for name in ("done", "second"))
    [held] = setup.ack_and_dequeue([], 1, worker="w1", only=0)[1]  # (claim.lua loaded)
    setup.lost_claims.recover(setup.client, "default")  # (nothing lost yet)
    client = redis.Redis.from_url(slow_server.url, socket_timeout=0.02, **conf.CLIENT_OPTIONS)
    queue = Queue("default", client=client, shards=2)
    # It starts on shard 0, where its success rides, leases `second`, then asks shard 1 for the
    # rest: 40,000 leases take the server longer than the client waits.
    answers, leases = queue.ack_and_dequeue([(held, '"ok"')], 50_000, worker="w1")
    assert held.job_id == done and answers == [1]
    assert [lease.job_id for lease in leases] == [second] and setup.ack(leases[0], "ok")
    assert queue.lost_claims.lost  # (the shard 1 claim: its jobs come back at the next claim)
    queue.lost_claims.recover(setup.client, "default")
    counts = setup.counts()
    assert (counts["pending"], counts["active"], counts["succeeded"]) == (40_000, 0, 2)


def test_a_job_handed_to_a_worker_killed_while_its_offer_stood_costs_no_run(
        valkey_server: ValkeyProcess) -> None:
    worker = start_worker(valkey_server.url, "--queues", "default", "--concurrency", "1")
    client = redis.Redis.from_url(valkey_server.url, decode_responses=True)
    idle = ShardKeys("default", 0).key("idle")
    try:
        wait_for(lambda: client.hlen(idle) > 0)  # idle, offering itself for hand-offs
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait()
    ref = jobs.add.using(max_attempts=1, lease=0.2).enqueue(1, 2)
    queue = Queue("default")
    info = queue.get(ref.id)
    assert info is not None and info.state == "active"  # handed to the dead worker
    wait_for(lambda: queue.reap() > 0)
    info = queue.get(ref.id)
    assert info is not None and info.state == "pending", info  # not `dead`: it never ran
    [lease] = queue.dequeue(worker="w2")
    assert queue.nack(lease, "a real run fails") == "dead"  # its one run is still its to spend


def test_a_job_handed_over_in_a_wait_whose_reply_is_lost_goes_back_uncharged(
        slow_server: ValkeyProcess) -> None:
    # The hand-off pops the job in the idle worker's BLPOP, then the server stalls (DEBUG SLEEP
    # pipelined after the enqueue, so it runs before the reply goes out) longer than the worker
    # waits for the reply: the reply is lost, the job leased to the worker by its offer. The
    # waiter hands it back uncharged before its next wait, so its one run is still its own
    # (else its lease lapses and the reaper counts a run nobody made: dead, never run; a lease
    # shorter than the stall would lapse first, as a lost claim's does).
    client = conf.client_for_url(slow_server.url)
    queue = Queue("default", client=client)
    assert queue.enqueue("loads the script") and queue.dequeue(count=5)
    client.delete(queue.shard(0).key("wake"))  # (its token: the worker's first wait offers)
    worker = start_worker(slow_server.url, "--queues", "default", "--concurrency", "1")
    shard = queue.shard(0)
    job_id = ids.new_id()
    try:
        wait_for(lambda: client.hlen(shard.key("idle")) > 0)
        sender = redis.Redis.from_url(slow_server.url, socket_timeout=60, decode_responses=True)
        with sender.pipeline(transaction=False) as pipe:
            pipe.execute_command(*caller.head("enqueue", shard), "", 1, job_id,
                                 json.dumps({"args": [1, 2], "handler": "tests.jobapp.jobs.add"}),
                                 "0", "", "1", "", "20000", "0", "", "0", "0", "0")
            pipe.execute_command("DEBUG", "SLEEP", IDLE_WAIT + READ_SLACK + 1)
            assert pipe.execute()[0][1:] == [job_id, "new"]
        sender.close()
        wait_for(lambda: (info := queue.get(job_id)) is not None
                 and info.state in ("succeeded", "dead"), timeout=60)
        info = queue.get(job_id)
        assert info is not None and (info.state, info.attempts, info.result) == (
            "succeeded", 2, 3), info  # (attempt 1: handed over, lost, given back uncharged)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(30)


def test_an_outage_leaves_the_fast_path_its_room(settings: Any) -> None:
    down = ValkeyProcess()  # never started: nothing listens on its port
    client = redis.Redis.from_url(down.url, **conf.CLIENT_OPTIONS)
    room = wire._Borrowed.of(client).room
    for _ in range(room + 2):
        with pytest.raises(redis.ConnectionError):
            wire.call(client, ("PING",))
    assert wire._Borrowed.of(client).room == room  # nothing lent, nothing lost


# -- durable queues: a resize, a restore, an expiry ---------------------------------------------

@pytest.fixture
def durable(settings: Any) -> Queue:
    settings.JOBQUEUE = {**settings.JOBQUEUE, "QUEUES": {"default": {}, "durable": {"durable": True}}}
    return Queue("durable")


@pytest.mark.django_db(transaction=True)
def test_a_resend_or_a_restore_after_a_resize_writes_no_durable_job_twice(durable: Queue) -> None:
    refs = jobs.add.using(queue="durable").enqueue_many([(i, i) for i in range(8)])
    durable.resize(3)  # (the jobs stay on shard 0; their ids now place most of them elsewhere)
    assert outbox.resend([durable], grace=0) == 0  # the push reached Valkey: nothing to send
    assert durable.counts()["pending"] == 8
    assert outbox.restore([durable]) == 0  # Valkey still holds them all
    assert durable.counts()["pending"] == 8
    leases = durable.dequeue(count=20, worker="w")
    assert sorted(lease.job_id for lease in leases) == sorted(ref.id for ref in refs)


@pytest.mark.django_db(transaction=True)
def test_a_resend_leaves_a_durable_job_that_started_before_its_expiry_to_valkey(
        durable: Queue) -> None:
    ref = jobs.add.using(queue="durable", expires=0.3).enqueue(1, 2)
    [lease] = durable.dequeue(worker="w")  # started in time
    row = Job.objects.get(pk=ref.id)
    wait_for(lambda: row.expires_at is not None and row.expires_at < datetime.now(UTC))
    outbox.resend([durable], grace=0)
    assert Job.objects.get(pk=ref.id).state == "pending"  # not `expired`: Valkey runs it
    assert durable.ack(lease, 3)


@pytest.mark.django_db(transaction=True)
def test_a_restored_durable_job_never_repeats_a_fencing_token(durable: Queue,
                                                              valkey_server: ValkeyProcess) -> None:
    ref = jobs.add.using(queue="durable").enqueue(1, 2)
    [before] = durable.dequeue(worker="a")  # running when Valkey loses its data
    redis.Redis.from_url(valkey_server.url).flushall()
    assert outbox.restore([durable]) == 1
    [after] = durable.dequeue(worker="b")
    assert after.job_id == ref.id and after.token != before.token
    assert not durable.ack(before, "late")  # the run before the loss is fenced off
    assert durable.ack(after, 3)
    info = durable.get(ref.id)
    assert info is not None and info.state == "succeeded" and info.result == 3


@pytest.mark.django_db(transaction=True)
def test_a_restored_durable_flow_job_never_repeats_a_fencing_token(
        durable: Queue, valkey_server: ValkeyProcess) -> None:
    first = jobs.add.using(queue="durable").s(1, 2)
    last = chain(first, jobs.mul.using(queue="durable").s(10)).enqueue()
    [before] = durable.dequeue(worker="a")  # the flow's first job runs when Valkey loses its data
    redis.Redis.from_url(valkey_server.url).flushall()
    assert outbox.restore([durable]) == 2
    [after] = durable.dequeue(worker="b")
    assert after.job_id == before.job_id and after.token != before.token
    assert not durable.ack(before, "late")  # the run before the loss is fenced off
    assert durable.ack(after, 3)
    [then] = durable.dequeue(worker="b")
    assert then.job_id == last.id and then.payload["args"] == [3, 10]


@contextmanager
def row_locked(job_id: str) -> Iterator[tuple[Callable[[], bool], threading.Event]]:
    """The durable row of `job_id` locked by another connection: a durable retry, which writes
    it first, waits inside its transaction (before its Valkey call) until the block ends or the
    event given is set. Gives a function saying whether a writer waits for the lock, and that
    event."""
    from django.db import connection, transaction

    if connection.vendor not in ("mysql", "postgresql"):
        pytest.skip("needs a database whose row locks make a writer wait")
    locked, go = threading.Event(), threading.Event()

    def hold() -> None:
        with transaction.atomic():
            Job.objects.select_for_update().get(pk=job_id)
            locked.set()
            go.wait(30)
        connection.close()

    waiting = ("SELECT COUNT(*) FROM information_schema.innodb_trx WHERE trx_state = 'LOCK WAIT'"
               if connection.vendor == "mysql" else
               "SELECT COUNT(*) FROM pg_locks WHERE NOT granted")

    def blocked() -> bool:
        with connection.cursor() as cursor:
            cursor.execute(waiting)
            return bool(cursor.fetchone()[0])

    holder = threading.Thread(target=hold)
    holder.start()
    locked.wait(30)
    try:
        yield blocked, go
    finally:
        go.set()
        holder.join()


def in_thread(call: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    """`call` started on a thread of its own (with a database connection of its own, closed
    after); the list gets its result or its exception."""
    from django.db import connection

    out: list[object] = []

    def run() -> None:
        try:
            out.append(call())
        except Exception as exc:  # noqa: BLE001 - handed to the test
            out.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


@pytest.mark.django_db(transaction=True)
def test_a_durable_retry_whose_reply_is_lost_stays_retried_in_the_database(
        slow_server: ValkeyProcess, settings: Any) -> None:
    settings.JOBQUEUE = {"URL": slow_server.url,
                         "QUEUES": {"default": {}, "durable": {"durable": True}}}
    conf.reset()
    ref = jobs.add.using(queue="durable", max_attempts=1).enqueue(1, 2)
    queue = Queue("durable", client=impatient(slow_server.url))
    [lease] = queue.dequeue(worker="w")
    queue.nack(lease, "boom")
    Job.objects.filter(pk=ref.id).update(state="dead")  # (as the mirror writes it)
    with row_locked(ref.id) as (blocked, unlock):
        thread, out = in_thread(lambda: queue.retry(ref.id))
        wait_for(blocked, every=0.2)  # the retry waits in its transaction, its Valkey call to
        # come (InnoDB refreshes what it says of its transactions at most every 0.1 s)
        with stalled(slow_server.url, 0.6):  # (less than its three sends' 0.25 s timeouts)
            unlock.set()  # its call goes out while Valkey sleeps: the reply is lost
    thread.join()
    assert out == ["pending"]  # sent again, answered as its first call: not an error
    assert queue.get(ref.id).state == "pending"  # type: ignore[union-attr]
    assert Job.objects.get(pk=ref.id).state == "pending"  # not rolled back to `dead`


@pytest.mark.django_db(transaction=True)
def test_an_operator_retry_racing_a_settling_resize_leaves_no_job_on_a_retired_shard(
        durable: Queue) -> None:
    from jobqueue.engine import layouts

    durable.resize(2)
    refs = jobs.always_fails.using(queue="durable", max_attempts=1).enqueue_many(
        [("x",)] * 12)
    on_one = next(ref.id for ref in refs if durable.locate(ref.id) == 1)
    while leases := durable.dequeue(count=20, worker="w"):
        for lease in leases:
            durable.nack(lease, "boom")
    durable.resize(1)  # shard 1 drains; it holds only dead jobs: it may retire at once
    with row_locked(on_one) as (blocked, _):
        thread, out = in_thread(lambda: durable.retry(on_one))
        wait_for(blocked, every=0.2)  # the retry is inside its transaction, its Valkey call
        # still to come (InnoDB refreshes what it says of its transactions at most every 0.1 s)
        assert layouts.settle(durable.client, "durable", durable.configured) is not None
        assert durable.claim_shards() == 1  # shard 1 retired
    thread.join()
    assert out == ["pending"]
    [lease] = durable.dequeue(count=5, worker="w2")  # claimed from its shard again
    assert lease.job_id == on_one and durable.claim_shards() == 2


@contextmanager
def impatient_database() -> Iterator[None]:
    """This connection gives up on a row lock after a second (a lock wait timeout)."""
    from django.db import connection

    if connection.vendor not in ("mysql", "postgresql"):
        pytest.skip("needs a database whose row locks make a writer wait")
    short, back = (("SET SESSION innodb_lock_wait_timeout = 1",
                    "SET SESSION innodb_lock_wait_timeout = DEFAULT")
                   if connection.vendor == "mysql" else
                   ("SET lock_timeout = '1s'", "SET lock_timeout = DEFAULT"))
    with connection.cursor() as cursor:
        cursor.execute(short)
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(back)


@pytest.mark.django_db(transaction=True)
def test_a_mirror_batch_written_late_does_not_overwrite_a_newer_outcome(durable: Queue) -> None:
    from django.db import DatabaseError

    from jobqueue.history.mirror import Mirror

    ref = jobs.add.using(queue="durable", max_attempts=1).enqueue(1, 2)
    [lease] = durable.dequeue(worker="w")
    durable.nack(lease, "boom")  # its `dead` event waits in the stream
    first, second = Mirror([durable], "first"), Mirror([durable], "second")
    with row_locked(ref.id), impatient_database(), pytest.raises(DatabaseError):
        first.step()  # the batch holding `dead` fails (a lock wait timeout); it stays pending
    assert Job.objects.get(pk=ref.id).state == "pending"
    assert durable.retry(ref.id) == "pending"  # an operator's retry, and a run that succeeds
    [again] = durable.dequeue(worker="w")
    assert durable.ack(again, 3)
    assert second.step() == 1  # another worker's mirror writes `succeeded`
    assert Job.objects.get(pk=ref.id).state == "succeeded"
    first.step()  # the failed batch, written again at last
    row = Job.objects.get(pk=ref.id)
    assert (row.state, row.result, row.attempts) == ("succeeded", 3, 2)


@pytest.mark.django_db(transaction=True)
def test_a_job_retried_from_its_mirror_row_is_mirrored_again_when_it_succeeds() -> None:
    from jobqueue.console import actions
    from jobqueue.history.mirror import Mirror

    queue = Queue("default")
    ref = jobs.add.using(max_attempts=2, backoff=0).enqueue(1, 2)
    for _ in range(2):
        [lease] = queue.dequeue(worker="w")
        queue.nack(lease, "boom")
    mirror = Mirror([queue], "m")
    mirror.step()
    queue.client.delete(queue.shard(0).job(ref.id))  # its retention passed: only the row holds it
    actions.retry_job(queue, ref.id)
    [lease] = queue.dequeue(worker="w")
    assert lease.token == 3 and queue.ack(lease, 3)  # its tokens go on from the row's
    mirror.step()
    row = Job.objects.get(pk=ref.id)
    assert (row.state, row.result, row.attempts) == ("succeeded", 3, 3)


@pytest.mark.django_db(transaction=True)
def test_a_cancel_event_written_late_does_not_overwrite_the_dependents_coming_back() -> None:
    """A dependent a member's failure cancelled comes back to wait (a retry of that member):
    its `waiting` event carries when (`revived_at`, Valkey's clock), so the cancel's event, in a
    batch written again after it, is older and changes nothing; a newer finish still does."""
    from jobqueue.history.mirror import upsert

    job_id = ids.new_id()
    base = {"id": job_id, "payload": '{"handler":"tests.jobapp.jobs.add"}', "attempts": "0"}
    cancelled = {**base, "state": "cancelled", "finished_at": "1000000000000"}
    revived = {**base, "state": "waiting", "revived_at": "1000000005000"}
    upsert([cancelled], "default")
    upsert([revived], "default")
    assert Job.objects.get(pk=job_id).state == "waiting"
    upsert([cancelled], "default")  # the cancel's batch, written again late
    assert Job.objects.get(pk=job_id).state == "waiting"
    upsert([{**base, "state": "succeeded", "attempts": "1", "finished_at": "1000000009000"}],
           "default")
    assert Job.objects.get(pk=job_id).state == "succeeded"
