"""Fuzzing every input surface: whatever comes in gets one clear error (a JobQueueError, or a
4xx page) and nothing else breaks — no TypeError from deep inside, no 500."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobqueue import Queue, ids
from jobqueue.conf import parse
from jobqueue.exceptions import JobQueueError
from jobqueue.keys import validate_lane, validate_queue
from jobqueue.spec import JobSpec

FUZZ = settings(max_examples=150, deadline=None, derandomize=True,
                suppress_health_check=list(HealthCheck))
anything = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(),
                     st.binary(), st.lists(st.integers(), max_size=3),
                     st.dictionaries(st.text(max_size=5), st.integers(), max_size=3))


@FUZZ
@given(st.text())
def test_any_text_decodes_to_an_id_or_is_refused_clearly(text: str) -> None:
    try:
        namespace, snowflake = ids.decode(text)
    except ValueError:
        return
    assert ids.encode(namespace, snowflake) == text


@FUZZ
@given(anything)
def test_any_name_is_a_valid_queue_and_lane_name_or_refused_clearly(value: Any) -> None:
    for validate in (validate_queue, validate_lane):
        with contextlib.suppress(JobQueueError):
            assert validate(value) == value


@FUZZ
@given(st.dictionaries(st.sampled_from(["lane", "priority", "delay", "max_attempts", "backoff",
                                        "lease", "unique_key", "job_id"]), anything, max_size=4),
       anything)
def test_any_enqueue_options_enqueue_or_are_refused_clearly(options: dict[str, Any],
                                                              payload: Any) -> None:
    queue = Queue("default")
    try:
        ref = queue.enqueue_many([JobSpec(payload, **options)])[0]
    except JobQueueError:
        return
    assert queue.get(ref.id) is not None


@FUZZ
@given(st.dictionaries(st.sampled_from(["URL", "QUEUES", "DEFAULTS", "RETENTION", "ON_COMMIT",
                                        "MAX_PAYLOAD", "NOPE"]), anything, max_size=3))
def test_any_settings_parse_or_are_refused_clearly(raw: dict[str, Any]) -> None:
    with contextlib.suppress(JobQueueError):
        parse(raw)


@pytest.mark.django_db(transaction=True)
@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(st.text(max_size=30), st.text(max_size=30))
def test_any_console_url_answers_without_a_server_error(queue: str, job_id: str) -> None:
    from django.contrib.auth.models import User

    user = User.objects.filter(username="root").first() or User.objects.create_superuser(
        "root", "root@example.com", "pw")
    client = Client()
    client.force_login(user)
    from urllib.parse import quote

    for url in (f"/admin/jobqueue/job/live/find/?id={quote(job_id)}",
                f"/admin/jobqueue/job/live/jobs/{quote(queue, safe='')}/{quote(job_id, safe='')}/",
                f"/admin/jobqueue/job/live/queues/{quote(queue, safe='')}/"):
        assert client.get(url).status_code < 500, url


RUNWORKER_OPTIONS = ["--queues", "--workers", "--concurrency", "--prefetch", "--lease", "--grace",
                     "--name", "--log-level", "--burst", "--processes", "--no-mirror", "--nope"]


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(RUNWORKER_OPTIONS), st.text(max_size=12)), max_size=4))
def test_any_runworker_command_line_gives_a_config_or_one_clear_error(pairs: list[tuple[str, str]]) -> None:
    from django.core.management.base import CommandError

    from jobqueue.management.commands.runworker import Command

    command = Command()
    parser = command.create_parser("manage.py", "runworker")
    argv = [token for option, value in pairs
            for token in ((option,) if option in ("--burst", "--processes", "--no-mirror")
                          else (option, value))]
    try:
        options = vars(parser.parse_args(argv))
        config = command.config(options)
    except CommandError as exc:
        assert str(exc).strip()  # argparse echoes the bad argument as given, newlines and all
        return
    assert config.concurrency >= 1 and (config.prefetch is None or config.prefetch >= 0)


@pytest.mark.django_db(transaction=True)
@FUZZ
@given(st.sampled_from(["stats", "restore", "resize", ""]),
       st.lists(st.sampled_from(["--queues", "--json", "--nope", "default", "", "a b", "-1"])
                | st.lists(st.text(max_size=8), max_size=3), max_size=4))
def test_any_jobqueue_command_line_runs_or_is_one_clear_error(action: str, rest: list[str]) -> None:
    from io import StringIO

    from django.core.management import call_command
    from django.core.management.base import CommandError

    argv = [action, *rest] if action else rest
    try:
        call_command("jobqueue", *argv, stdout=StringIO(), stderr=StringIO())
    except CommandError as exc:
        assert str(exc).strip()


@pytest.mark.django_db(transaction=True)
@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(st.sampled_from(["retry", "reprioritize", "cancel", "nope"]),
       st.dictionaries(st.sampled_from(["priority", "confirm", "next", "post"]),
                       st.text(max_size=20), max_size=4))
def test_any_console_form_post_answers_without_a_server_error(action: str,
                                                               form: dict[str, str]) -> None:
    from django.contrib.auth.models import User

    user = User.objects.filter(username="root").first() or User.objects.create_superuser(
        "root", "root@example.com", "pw")
    client = Client()
    client.force_login(user)
    ref = Queue("default").enqueue({"n": 1})
    for url in (f"/admin/jobqueue/job/live/jobs/default/{ref.id}/{action}/",
                "/admin/jobqueue/job/live/queues/default/pause/",
                "/admin/jobqueue/job/live/queues/default/resume/"):
        assert client.post(url, form).status_code < 500, url
    mirror = client.post("/admin/jobqueue/job/", {"action": "retry_selected", "_selected_action":
                                                  [form.get("priority", ""), ref.id], **form})
    assert mirror.status_code < 500
    assert Queue("default").get(ref.id) is not None  # the job is still there, whatever came in
