"""Celery's canvas of bridged tasks runs as jobqueue flows: a Celery project's own `chain`,
`group`, `chord`, `link`, `link_error` and `expires` give what Celery would, through a real
worker serving the bridged tasks (no broker, no result backend); what cannot be mapped is
refused by name, with nothing stored."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from celery import Celery, chain, chord, group
from celery.result import AsyncResult, GroupResult
from django.db import transaction

from jobqueue import Queue, flows, get_job
from jobqueue.exceptions import InvalidOption, JobFailed
from tests.jobapp.celery_tasks import add, echo, fails, sees_its_error, sees_the_task_id, shout, tsum
from tests.servers import ValkeyProcess
from tests.workers import start_worker, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def worker(valkey_server: ValkeyProcess, tmp_path: Path) -> Iterator[Path]:
    log = tmp_path / "worker.log"
    proc = start_worker(valkey_server.url, "--concurrency", "4", log=log)
    yield log
    proc.terminate()
    proc.wait(60)


def by_task(flow: str, task: Any) -> list[Any]:
    """The flow's jobs of one Celery task, in the flow's order, once each has ended."""
    wait_for(
        lambda: all(
            info.state not in ("pending", "waiting", "active", "scheduled") for info in flows.members(flow)
        )
    )
    return [info for info in flows.members(flow) if info.payload["handler"] == f"celery:{task.name}"]


@pytest.mark.slow
def test_chain_group_and_chord_give_the_results_celery_would(worker: Path) -> None:
    chained = chain(add.s(2, 2), add.s(4), add.s(8)).apply_async()
    assert isinstance(chained, AsyncResult) and chained.get(timeout=60) == 16
    assert chained.parent.get(timeout=60) == 8 and chained.parent.parent.get(timeout=60) == 4
    assert chained.ready() and chained.successful() and chained.state == "SUCCESS"
    assert get_job(chained.id).flow == chained.id  # (the last step's id is the flow's)
    assert (add.s(1, 1) | add.s(2) | add.s(3))().get(timeout=60) == 7  # (the pipe builds a chain)

    tens = group(add.s(i, i) for i in range(10)).apply_async()
    assert isinstance(tens, GroupResult) and len(tens.results) == 10
    assert tens.get(timeout=60) == [i * 2 for i in range(10)]  # (in order)
    assert tens.ready() and tens.successful() and tens.completed_count() == 10
    assert {info.id for info in flows.members(tens.id)} == {r.id for r in tens.results}

    summed = chord([add.s(i, i) for i in range(10)])(tsum.s())
    assert summed.get(timeout=60) == 90
    assert summed.parent.get(timeout=60) == [i * 2 for i in range(10)]
    assert chord([add.s(1, 2), add.s(3, 4)], tsum.s()).apply_async().get(timeout=60) == 10
    # a group in a chain hands its list on, as Celery's group | task chord does
    assert chain(add.s(1, 1), group(add.s(1), add.s(2)), tsum.s()).delay().get(timeout=60) == 7
    fanned = chain(add.s(1, 1), group(add.s(10), add.s(20))).apply_async()
    assert isinstance(fanned, GroupResult) and fanned.get(timeout=60) == [12, 22]


@pytest.mark.slow
def test_partial_arguments_and_immutable_signatures_keep_celerys_meaning(worker: Path) -> None:
    # the previous result is the first argument; partial args are prepended to a step's own
    assert chain(echo.s("a"), echo.s("b")).apply_async(("x",)).get(timeout=60) == [["x", "a"], "b"]
    assert chain(echo.s(), echo.s()).delay(1, 2).get(timeout=60) == [[1, 2]]
    # .si(): no parent result, no partial args
    assert chain(add.s(1, 1), add.si(5, 5), add.s(1)).apply_async().get(timeout=60) == 11
    assert chain(echo.si("alone"), echo.s("b")).apply_async(("x",)).get(timeout=60) == [["alone"], "b"]
    assert group(echo.s("a"), echo.si("b"))("x").get(timeout=60) == [["x", "a"], ["b"]]
    # a chord's callback gets the header's list first; partial args go to the header
    assert chord([echo.s(1), echo.s(2)], echo.s("end")).apply_async(("p",)).get(timeout=60) == [
        [["p", 1], ["p", 2]],
        "end",
    ]
    assert chord([add.s(1, 1)], echo.si("done"))().get(timeout=60) == ["done"]


@pytest.mark.slow
def test_link_calls_back_with_the_result_and_link_error_runs_when_the_task_fails(worker: Path) -> None:
    linked = add.apply_async((2, 2), link=add.s(10))
    assert linked.get(timeout=60) == 4  # (the task's own result: the callback is a side job)
    [callback] = by_task(linked.id, add)[1:]
    assert callback.result == 14

    called_back = chord([add.s(1, 1), add.s(2, 2)], tsum.s()).apply_async(link=add.s(100))
    assert called_back.get(timeout=60) == 6  # (a chord's link: on its callback)
    assert [info.result for info in by_task(called_back.id, add)][-1] == 106

    failed = fails.apply_async(("boom",), link=add.s(1), link_error=sees_its_error.s())
    with pytest.raises(JobFailed, match="boom"):
        failed.get(timeout=60)
    assert failed.state == "FAILURE" and not failed.successful()
    [errback] = by_task(failed.id, sees_its_error)
    seen = errback.result
    assert (seen["id"], seen["task"], seen["args"]) == (failed.id, fails.name, ["boom"])
    assert seen["exc"] == "JobFailed" and "ValueError: boom" in seen["message"] + seen["traceback"]
    [never] = by_task(failed.id, add)
    assert never.state == "cancelled"  # (a link never runs after a failure)

    # on a signature in a chain: once, for the task that failed (the steps after it never run)
    chained = chain(add.s(1, 1), fails.s(), add.s(1)).on_error(sees_its_error.s()).apply_async()
    with pytest.raises(JobFailed):
        chained.get(timeout=60)
    called = [info.result for info in by_task(chained.id, sees_its_error) if info.result]
    assert len(called) == 1 and called[0]["task"] == fails.name and called[0]["args"] == [2]

    # an errback of one argument gets the task's id; an immutable one only its own arguments
    one = fails.apply_async(("x",), link_error=[sees_the_task_id.s(), echo.si("note")])
    with pytest.raises(JobFailed):
        one.get(timeout=60)
    assert [info.result for info in by_task(one.id, sees_the_task_id)] == [one.id]
    assert [info.result for info in by_task(one.id, echo)] == [["note"]]

    # a task that succeeds does not call its errback
    fine = add.s(1, 1).set(link_error=sees_its_error.s()).delay()
    assert fine.get(timeout=60) == 2
    assert [info.result for info in by_task(fine.id, sees_its_error)] == [None]

    # a chord's callback errback: a header task's failure, as Celery's ChordError
    broken = chord([add.s(1, 1), fails.s("header")], tsum.s().on_error(sees_its_error.s()))()
    with pytest.raises(JobFailed, match="cancelled"):
        broken.get(timeout=60)
    [chord_error] = [info.result for info in by_task(broken.id, sees_its_error)]
    assert chord_error["exc"] == "ChordError" and chord_error["id"] == broken.id
    assert "ValueError: header" in chord_error["traceback"]


def test_expires_as_seconds_timedelta_or_datetime_is_the_jobs_expiry(valkey_server: ValkeyProcess) -> None:
    soon = datetime.now(UTC) + timedelta(seconds=1)
    as_seconds = chain(shout.s("a"), shout.s()).apply_async(expires=1)
    as_delta = group(shout.s("b"), shout.s("c")).apply_async(expires=timedelta(seconds=1))
    as_date = shout.s("d").set(expires=soon, link=shout.s()).delay()
    firsts = [
        get_job(flows.members(as_seconds.id)[0].id),
        *(get_job(r.id) for r in as_delta.results),
        get_job(as_date.id),
    ]
    for info in firsts:  # (a canvas's expires goes to the jobs that start it, as Celery sends it)
        assert info is not None and info.expires_at is not None
        assert abs(info.expires_at - soon).total_seconds() < 0.5
    assert get_job(as_seconds.id).expires_at is None  # (its second step: none of its own)
    latest = max(info.expires_at for info in firsts if info and info.expires_at)
    wait_for(lambda: datetime.now(UTC) > latest + timedelta(milliseconds=20))  # (all expired)
    proc = start_worker(valkey_server.url)
    try:
        for result in (as_seconds, as_date, *as_delta.results):
            with pytest.raises(JobFailed, match=r"ended (expired|cancelled)"):
                result.get(timeout=60)
        assert {get_job(r.id).state for r in as_delta.results} == {"expired"}
        assert as_delta.ready() and not as_delta.successful()
        assert get_job(as_date.id).state == "expired" and as_date.state == "REVOKED"
    finally:
        proc.terminate()
        proc.wait(60)


def test_a_canvas_queue_and_priority_go_to_each_task_that_sets_none() -> None:
    routed = chain(shout.s("a"), shout.s().set(priority=3)).apply_async(queue="reports", priority=7)
    jobs = flows.members(routed.id, queue="reports")
    assert [info.priority for info in jobs] == [7, 3] and routed.job_queue == "reports"
    assert jobs[0].payload == {"handler": f"celery:{shout.name}", "args": ["a"]}
    fanned = group(shout.s("b"), shout.s("c")).set(queue="reports", soft_time_limit=5).delay()
    assert [get_job(r.id, "reports").payload["soft_time_limit"] for r in fanned.results] == [5, 5]


def test_results_lead_back_through_their_parents_as_celerys_do() -> None:
    """A chain's result's `parent` is the step before (and so on back to its first, whose
    parent is None); a chord's callback's is its header's GroupResult; a group's, the step
    before it; a link's result is no parent."""
    three = chain(shout.s("a"), echo.s(), echo.s().set(link=echo.s())).delay()
    ids = [info.id for info in flows.members(three.id)]
    assert [three.id, three.parent.id, three.parent.parent.id] == ids[2::-1]
    assert three.parent.parent.parent is None and isinstance(three.parent, AsyncResult)

    summed = chain(echo.s("a"), chord([echo.s("b"), echo.s("c")], echo.s())).delay()
    header = summed.parent
    assert isinstance(header, GroupResult) and header.parent.parent is None
    first, *members, callback = flows.members(summed.id)
    assert [r.id for r in header.results] == [m.id for m in members] and callback.id == summed.id
    assert header.parent.id == first.id

    fanned = chain(echo.s("a"), group(chain(echo.s("b"), echo.s()), echo.s("c"))).delay()
    assert isinstance(fanned, GroupResult) and fanned.parent.parent is None
    ends = fanned.results
    assert ends[0].parent is not None and ends[0].parent.parent is None and ends[1].parent is None
    assert fanned.parent.id == flows.members(fanned.id)[0].id and fanned.id != fanned.parent.id

    nested = chain(echo.s("a"), group(group(echo.s("b"), echo.s("c")), echo.s("d"))).delay()
    first, *rest = flows.members(nested.id)
    assert [r.id for r in nested.results] == [info.id for info in rest]  # (one flat list)
    assert nested.parent.id == first.id


def test_a_canvas_in_a_transaction_is_written_at_its_commit_and_not_on_rollback() -> None:
    with transaction.atomic():
        committed = chain(shout.s("a"), shout.s()).delay()
        assert get_job(committed.id) is None
    assert [info.state for info in flows.members(committed.id)] == ["pending", "waiting"]
    with contextlib.suppress(RuntimeError), transaction.atomic():
        rolled_back = group(shout.s("b"), shout.s("c")).delay()
        raise RuntimeError("roll back")
    assert flows.members(rolled_back.id) == [] and Queue("default").counts()["pending"] == 1


@pytest.fixture
def plain_app() -> Iterator[Celery]:
    """A Celery app whose tasks are Celery's own (not bridged), run eagerly (no broker)."""
    app = Celery("plain", set_as_current=False)
    app.conf.task_always_eager = True
    yield app
    app.close()


def frozen(canvas: Any) -> Any:
    canvas.freeze()  # (its tasks get Celery's UUIDs as ids)
    return canvas


def test_what_cannot_be_mapped_is_refused_by_name_and_nothing_is_stored(plain_app: Celery) -> None:
    @plain_app.task(name="plain.double")
    def double(x: int) -> int:
        return x * 2

    refused: list[tuple[Any, str]] = [
        (lambda: add.chunks([(1, 1)] * 4, 2).apply_async(), "chunks"),
        (lambda: add.starmap([(1, 1)]).apply_async(), "xstarmap"),
        (lambda: add.map([1]).apply_async(), "xmap"),
        (lambda: group(add.s(1, 1), add.s(2, 2)).apply_async(link=add.s(1)), "link on a group"),
        (lambda: chain(add.s(1, 1), group(add.s(1), add.s(2))).set(link=add.s(1)).delay(), "link on a group"),
        (lambda: chain(add.s(1, 1), add.s(1)).apply_async(task_id="JOB01234567890"), "chain's task_id"),
        (lambda: chain(add.s(1, 1), double.s()).delay(), "plain.double"),
        (
            lambda: chain(add.s(1, 1), add.s(1).set(link_error=group(shout.s("x")))).delay(),
            "link_error takes a task",
        ),
        (lambda: chord([add.s(1, 1)]).apply_async(), "needs a callback"),
        (lambda: chord([add.s(1, 1)], tsum.s())("not a signature"), "takes Celery signatures"),
        (lambda: frozen(chain(add.s(1, 1), add.s(1))).delay(), r"chain's task_id \(given, or set by"),
        (lambda: chain(add.s(1, 1), add.s(1).set(queue="x", colour="red")).delay(), "colour"),
        (lambda: chain(add.s(1, 1), add.s(1).set(link=fails.s().set(chord=1))).delay(), "chord"),
    ]
    for call, name in refused:
        with pytest.raises(InvalidOption, match=name):
            call()
    with pytest.raises(InvalidOption, match="countdown on a task that waits"):
        chain(add.s(1, 1), add.s(1).set(countdown=5)).delay()
    assert Queue("default").counts() == Queue("default").counts() | {"pending": 0, "waiting": 0}
    assert Queue("x").counts()["pending"] == 0
    # a canvas of Celery's own tasks is Celery's, untouched
    assert chain(double.s(2), double.s()).apply_async().get() == 8


@pytest.mark.slow
def test_a_chord_over_two_queues_runs_once_flows_may_span_queues(
    settings: Any, valkey_server: ValkeyProcess
) -> None:
    settings.JOBQUEUE = {"URL": valkey_server.url, "QUEUES": {"default": {}, "isolated": {}}}
    proc = start_worker(valkey_server.url, "--queues", "default,isolated", "--concurrency", "2")
    try:
        across = chord([add.s(1, 1).set(queue="isolated"), add.s(2, 2)], tsum.s())()
        assert across.get(timeout=60) == 6
        failed = fails.apply_async(("there",), queue="isolated", link_error=sees_its_error.s())
        with pytest.raises(JobFailed):
            failed.get(timeout=60)
        [errback] = [info for info in flows.members(failed.id, "isolated") if info.queue == "default"]
        wait_for(lambda: get_job(errback.id).state == "succeeded")
        assert get_job(errback.id).result["args"] == ["there"]  # (it read the job on its queue)
    finally:
        proc.terminate()
        proc.wait(60)


def test_a_chord_called_with_a_bridged_callback_on_a_plain_header_is_refused_by_name(
    plain_app: Celery,
) -> None:
    """`chord(header)(callback)`: the callback comes as an argument, after the chord was built;
    a bridged one on Celery's own header is a mixed canvas, refused before anything runs."""

    @plain_app.task(name="plain.triple")
    def triple(x: int) -> int:
        return x * 3

    with pytest.raises(InvalidOption, match=r"plain\.triple"):
        chord([triple.s(1), triple.s(2)])(tsum.s())
    assert Queue("default").counts()["pending"] == 0


def test_a_chord_header_task_that_expires_calls_the_callbacks_errback_with_a_chord_error(
    valkey_server: ValkeyProcess,
) -> None:
    """Celery revokes an expired header task, and a revoked header fails the chord
    (ChordError), which calls the callback's errbacks: `expires` on a chord member keeps that."""
    soon = datetime.now(UTC) + timedelta(seconds=0.5)
    late = chord([add.s(1, 1).set(expires=soon), add.s(2, 2)], tsum.s().on_error(sees_its_error.s()))()
    wait_for(lambda: datetime.now(UTC) > soon + timedelta(milliseconds=20))
    proc = start_worker(valkey_server.url)
    try:
        with pytest.raises(JobFailed, match="cancelled"):
            late.get(timeout=60)
        [chord_error] = [info.result for info in by_task(late.id, sees_its_error)]
        assert chord_error is not None and chord_error["exc"] == "ChordError"
        assert chord_error["id"] == late.id and "expired" in chord_error["message"]
    finally:
        proc.terminate()
        proc.wait(60)
