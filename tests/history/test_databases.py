"""The history's bulk upsert on each database (MariaDB/MySQL, PostgreSQL, SQLite: the run's
DATABASE_URL picks it, see tests/settings.py): ids that differ only in case, replays, the outbox
columns of a durable row, and text a database refuses as it is (NUL characters)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction

from jobqueue import Queue
from jobqueue.history.mirror import Mirror, upsert
from jobqueue.models import Job, insert_jobs
from jobqueue.records import EncodedJSON
from tests.jobapp import jobs

pytestmark = pytest.mark.django_db(transaction=True)


def event(job_id: str, state: str = "succeeded", **fields: str) -> dict[str, str]:
    """A terminal event as the scripts write it to a shard's `done` stream."""
    now = str(int(datetime.now(UTC).timestamp() * 1000))
    return {"id": job_id, "state": state, "attempts": "1", "payload": '{"handler": "h"}',
            "enqueued_at": now, "started_at": now, "finished_at": now, **fields}


def test_ids_that_differ_only_in_case_are_two_rows_and_a_replay_rewrites_one() -> None:
    lower, upper = "JOB0000000000a", "JOB0000000000A"
    assert upsert([event(lower, result='"first"'), event(upper, result='"other"')], "default") == 2
    upsert([event(lower, "dead", last_error="boom"), event(lower, result='"again"')], "default")
    rows = {row.id: row for row in Job.objects.filter(id__in=(lower, upper))}
    assert set(rows) == {lower, upper}
    assert rows[lower].result == "again" and rows[lower].state == "succeeded"
    assert rows[upper].result == "other"
    assert Job.objects.filter(pk=lower).count() == 1 and not Job.objects.filter(pk="job0000000000a")


def test_the_mirror_keeps_a_durable_rows_outbox_columns(settings: Any) -> None:
    settings.JOBQUEUE = {**settings.JOBQUEUE, "QUEUES": {"default": {}, "durable": {"durable": True}}}
    ref = jobs.add.using(queue="durable").enqueue(1, 2)
    before = Job.objects.get(pk=ref.id)
    upsert([event(ref.id, result="3")], "durable")
    row = Job.objects.get(pk=ref.id)
    assert row.state == "succeeded" and row.result == 3
    assert row.durable and row.run_after == before.run_after and row.enqueued_at is not None


def test_text_with_nul_characters_and_any_unicode_is_mirrored() -> None:
    """PostgreSQL refuses NUL in text and `\\u0000` in jsonb, which MySQL and SQLite store: a
    handler's error or result holding one must not stop the mirror (its batch would fail for
    ever), so those characters are replaced there and everything else is kept."""
    queue = Queue("default")
    ref = jobs.add.using(lane="tenant-7").enqueue("a\x00b", "ü")
    [lease] = queue.dequeue(count=1, worker="w")
    queue.nack(lease, "Traceback: bad\x00byte 🚀", fatal=True)
    other = jobs.add.enqueue(1, 1)
    [lease] = queue.dequeue(count=1, worker="w")
    queue.ack(lease, {"text": "nul\x00here", "emoji": "🎉"})
    assert Mirror([queue], consumer="t").step() == 2
    dead, done = Job.objects.get(pk=ref.id), Job.objects.get(pk=other.id)
    nul = "\ufffd" if connection.vendor == "postgresql" else "\x00"
    assert dead.state == "dead" and dead.last_error == f"Traceback: bad{nul}byte 🚀"
    assert dead.lane == "tenant-7" and dead.payload["args"] == [f"a{nul}b", "ü"]
    assert done.result == {"text": f"nul{nul}here", "emoji": "🎉"}
    assert Mirror([queue], consumer="t").backlog() == 0


def test_a_batch_inside_the_callers_transaction_rolls_back_with_it() -> None:
    rows = [{**{f.attname: None for f in Job._meta.concrete_fields}, "id": f"JOB0000000000{i}",
             "queue": "default", "shard": 0, "lane": "", "state": "pending", "priority": 0,
             "attempts": 0, "max_attempts": 0, "last_error": "", "unique_key": "", "worker": "",
             "mirrored_at": datetime.now(UTC), "durable": True, "relayed": False}
            for i in range(3)]
    with pytest.raises(RuntimeError), transaction.atomic():
        assert insert_jobs(rows) == 3
        assert Job.objects.count() == 3
        raise RuntimeError("rollback")
    assert not Job.objects.exists()


def row(job_id: str, **columns: Any) -> dict[str, Any]:
    """A `Job` row as `insert_jobs` takes it: every column."""
    return {**{f.attname: None for f in Job._meta.concrete_fields}, "id": job_id,
            "queue": "default", "shard": 0, "lane": "", "state": "succeeded", "priority": 0,
            "attempts": 1, "max_attempts": 3, "last_error": "", "unique_key": "", "worker": "",
            "mirrored_at": datetime.now(UTC), "durable": False, "relayed": True, **columns}


AWKWARD = ["it's", 'say "hi"', "back\\slash", "\\'", "\\", "''", "%s %(x)s %%", "tab\tnew\nline\r",
           "ctrl-z \x1a", "ünï 中文 🚀", "", "NULL", "); DROP TABLE jobqueue_job; --"]


def test_awkward_text_json_and_datetimes_come_back_exactly() -> None:
    nul = "\ufffd" if connection.vendor == "postgresql" else "\x00"
    when = datetime(2026, 3, 4, 5, 6, 7, 891011, tzinfo=UTC)
    rows = [row(f"JOB00000000{i:03d}", lane=text[:128], last_error=f"{text} nul\x00", worker=text,
                unique_key=text, payload={"args": [text, i, -1.5, None, True], text: [text]},
                result=text, history=[{"error": text}], progress=EncodedJSON('{"p": "\\"%s\\""}'),
                priority=-100 + i, attempts=2**31 - 1, enqueued_at=when, started_at=when,
                finished_at=when.replace(microsecond=i))
            for i, text in enumerate(AWKWARD)]
    assert insert_jobs(rows) == len(AWKWARD)
    for i, text in enumerate(AWKWARD):
        got = Job.objects.get(pk=f"JOB00000000{i:03d}")
        assert (got.lane, got.worker, got.unique_key) == (text, text, text)
        assert got.last_error == f"{text} nul{nul}"
        assert got.payload == {"args": [text, i, -1.5, None, True], text: [text]}
        assert got.result == text and got.history == [{"error": text}]
        assert got.progress == {"p": '"%s"'}
        assert (got.priority, got.attempts, got.durable, got.relayed) == (-100 + i, 2**31 - 1,
                                                                          False, True)
        assert got.enqueued_at == when and got.finished_at == when.replace(microsecond=i)
        assert got.run_after is None and got.flow is None


def test_a_batch_longer_than_one_statement_is_written_whole_or_not_at_all() -> None:
    big = "x" * 20_000
    rows = [row(f"JOB0000000{i:04d}", last_error=big) for i in range(60)]  # > 1 MB in all
    assert insert_jobs(rows[:50]) == 50
    assert Job.objects.count() == 50 and {j.last_error for j in Job.objects.all()} == {big}
    Job.objects.filter(pk__in=[r["id"] for r in rows[:40]]).delete()
    with pytest.raises(IntegrityError):  # the last rows are there already: the INSERT fails
        insert_jobs(rows)
    assert Job.objects.count() == 10
    assert insert_jobs(rows, update=["last_error"]) == 60 and Job.objects.count() == 60


@pytest.mark.skipif(connection.vendor != "mysql", reason="MySQL's driver quoting")
def test_mysqlclient_quotes_a_batch_itself_into_one_statement() -> None:
    from django.test.utils import CaptureQueriesContext

    from jobqueue.models import _quotes_values

    mysqlclient = _quotes_values(connection)  # (opens the connection)
    assert mysqlclient == type(connection.connection).__module__.startswith("MySQLdb")
    with CaptureQueriesContext(connection) as queries:
        assert insert_jobs([row(f"JOB0000000000{i}", last_error="it's") for i in range(3)]) == 3
    inserts = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("INSERT")]
    assert len(inserts) == 1 and ("it''s" in inserts[0] or "it\\'s" in inserts[0]) == mysqlclient
