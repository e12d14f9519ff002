"""Any field of any row may be corrupt: the job is buried with a reason naming the field (or,
for a field no transition relies on, runs), the jobs behind it run, nothing crashes, and
get_job, the mirror and the console show the row with its bad bytes replaced."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from jobqueue import Queue
from jobqueue.history.mirror import Mirror
from jobqueue.models import Job
from tests.jobapp import jobs
from tests.servers import wait_past
from tests.workers import run_burst

pytestmark = pytest.mark.django_db(transaction=True)

NOT_UTF8 = b"\xff\xfe{\xc3"
ROW_FIELDS = ("state", "attempts", "uncharged", "payload", "priority", "lane", "max_attempts",
              "backoff_ms", "lease_ms", "unique_key", "enqueued_at", "run_after", "queue", "shard",
              "checkpoint")
GOVERNING = {"state", "attempts", "uncharged", "payload", "priority", "lane", "max_attempts",
             "backoff_ms", "lease_ms", "checkpoint"}
"""Fields some transition relies on: corrupt, the job cannot run and goes dead naming it."""


def corrupt_jobs(queue: Queue, value: bytes | str) -> dict[str, str]:
    """One pending job per row field, that field overwritten with `value`: field -> job id."""
    raw = queue.client  # corrupt through the same connection the queue uses
    spoiled = {}
    for field in ROW_FIELDS:
        ref = queue.enqueue({"handler": "tests.jobapp.jobs.add", "args": [1, 2], "kwargs": {}},
                            unique_key=f"u-{field}")
        raw.hset(queue.shard(0).job(ref.id), field, value)
        spoiled[field] = ref.id
    return spoiled


def run_like_a_worker(queue: Queue) -> None:
    """Claim until nothing is ready; bury rows whose payload is bad, ack the rest."""
    while leases := queue.dequeue(count=10, lease=30, worker="t"):
        for lease in leases:
            if lease.problem:
                queue.nack(lease, lease.problem, fatal=True)
            else:
                queue.ack(lease, 3)


@pytest.mark.parametrize("value", [NOT_UTF8, "x"], ids=["not-utf8", "not-a-number"])
def test_a_corrupt_field_buries_its_job_by_name_and_the_rest_run(queue: Queue, value: Any) -> None:
    spoiled = corrupt_jobs(queue, value)
    behind = [queue.enqueue({"handler": "h", "args": [], "kwargs": {}}).id for _ in range(5)]
    run_like_a_worker(queue)
    assert all(queue.get(job_id).state == "succeeded" for job_id in behind)  # type: ignore[union-attr]
    for field, job_id in spoiled.items():
        info = queue.get(job_id)
        assert info is not None, field
        if field in GOVERNING and not (field == "lane" and value == "x"):  # "x" is a fine lane
            assert info.state == "dead" and f"corrupt field {field}" in info.last_error, field
        else:
            assert info.state == "succeeded", field
    counts = queue.counts()
    assert counts["pending"] == counts["active"] == counts["scheduled"] == 0
    assert queue.client.zcard(queue.shard(0).key("waiting")) == 0


def test_the_mirror_records_corrupt_rows_once_each_with_bad_bytes_replaced(queue: Queue) -> None:
    spoiled = corrupt_jobs(queue, NOT_UTF8)
    run_like_a_worker(queue)
    Mirror([queue], consumer="t").step()
    rows = {row.id: row for row in Job.objects.all()}
    assert set(rows) == set(spoiled.values())
    assert rows[spoiled["payload"]].payload == "\ufffd\ufffd{\ufffd"
    assert rows[spoiled["lane"]].lane == "\ufffd\ufffd{\ufffd"
    assert all(row.queue == "default" for row in rows.values())  # from the stream, not the row
    assert "corrupt field(s) in the row: unique_key" in rows[spoiled["unique_key"]].last_error


def test_active_scheduled_and_dead_rows_with_corrupt_counts_do_not_stop_maintenance(queue: Queue) -> None:
    running = queue.enqueue("r")
    [lease] = queue.dequeue(count=1, lease=0.001, worker="t")
    later = queue.enqueue("s", delay=0.001)
    key = queue.shard(0).job
    queue.client.hset(key(running.id), "attempts", NOT_UTF8)
    queue.client.hset(key(later.id), "state", "nonsense")
    shard = queue.shard(0)
    wait_past(queue.client, shard.key("active"), shard.key("schedule"))  # lease over, job due
    assert queue.reap() == 1 and queue.promote() == 1
    assert queue.ack(lease) is False and queue.dequeue(count=5, worker="t") == []
    assert {queue.get(i).state for i in (running.id, later.id)} == {"dead"}  # type: ignore[union-attr]
    assert "corrupt field attempts" in queue.get(running.id).last_error  # type: ignore[union-attr]
    assert "corrupt field state" in queue.get(later.id).last_error  # type: ignore[union-attr]
    with pytest.raises(Exception, match="attempts is corrupt"):
        queue.retry(running.id)


def test_get_job_and_the_console_show_a_corrupt_row(admin_client: Client) -> None:
    queue = Queue("default")
    ref = queue.enqueue({"handler": "x", "args": ["<b>"], "kwargs": {}})
    queue.client.hset(queue.shard(0).job(ref.id), "lane", b"<i>\xff")
    queue.client.hset(queue.shard(0).job(ref.id), "enqueued_at", "yesterday")
    info = queue.get(ref.id)
    assert info and info.lane == "<i>\ufffd" and set(info.corrupt) == {"lane", "enqueued_at"}
    page = admin_client.get(f"/admin/jobqueue/job/live/jobs/default/{ref.id}/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "&lt;i&gt;\ufffd" in html and "<i>" not in html and "&lt;b&gt;" in html
    assert "corrupt fields" in html and "lane, enqueued_at" in html


@pytest.mark.slow
@pytest.mark.parametrize("where", ["standalone", "cluster"])
def test_the_real_worker_survives_every_corrupt_field(where: str, request: pytest.FixtureRequest,
                                                      settings: Any) -> None:
    if where == "cluster":
        cluster = request.getfixturevalue("valkey_cluster")
        settings.JOBQUEUE = {"URL": cluster.url, "QUEUES": {"default": {"shards": 3}}}
        Queue("default").client.flushall(target_nodes="primaries")
    url = settings.JOBQUEUE["URL"]
    queue = Queue("default")
    spoiled = {}
    for field in ROW_FIELDS:
        ref = jobs.add.using(lane="same").enqueue(1, 2)  # one lane: every job sits behind the last
        queue.client.hset(queue.shard(queue.locate(ref.id) or 0).job(ref.id), field, NOT_UTF8)
        spoiled[field] = ref.id
    fine = jobs.add.using(lane="same").enqueue_many([(i, 1) for i in range(20)])
    assert run_burst(url, "--concurrency", "4") == 0
    rows = {row.id: row for row in Job.objects.all()}
    assert len(rows) == len(ROW_FIELDS) + 20
    assert all(rows[r.id].state == "succeeded" and rows[r.id].result == r_i + 1
               for r_i, r in enumerate(fine))
    for field, job_id in spoiled.items():
        expected = "dead" if field in GOVERNING else "succeeded"
        assert rows[job_id].state == expected, field
        if expected == "dead":
            assert f"corrupt field {field}" in rows[job_id].last_error
