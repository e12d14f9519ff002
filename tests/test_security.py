"""Security rules checked over the whole package and the console: no pickle or eval anywhere,
no user data in script text, every action wants its own permission, POST and CSRF; Valkey
credentials (a password, an ACL user) come from the URL and never show in an error."""

from __future__ import annotations

import asyncio
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import redis
from django.contrib.auth.models import Permission, User
from django.test import Client

from jobqueue import Queue
from jobqueue.conf import get_client, loop_factory
from jobqueue.engine import lanes, wire
from jobqueue.engine.scripts import TRANSITIONS, source
from jobqueue.models import Job
from jobqueue.operations import schedule
from jobqueue.worker.waitline import WaitLine
from tests.jobapp import jobs

from .servers import TLSProxy, ValkeyProcess
from .workers import manage, run_burst

PACKAGE = Path(__file__).resolve().parent.parent / "jobqueue"


def test_the_package_never_pickles_evaluates_or_execs() -> None:
    forbidden = re.compile(r"\b(pickle|marshal|shelve|eval|exec)\b\s*[.(]|import (pickle|marshal|shelve)")
    offenders = [f"{path.relative_to(PACKAGE)}:{n}: {line.strip()}"
                 for path in PACKAGE.rglob("*.py") if "migrations" not in path.parts
                 for n, line in enumerate(path.read_text().splitlines(), 1) if forbidden.search(line)]
    assert offenders == []


@pytest.mark.parametrize("name", sorted(TRANSITIONS))
def test_scripts_are_fixed_text_and_never_build_code(name: str) -> None:
    text = source(name).text
    assert "loadstring" not in text and "dofile" not in text and "setfenv" not in text
    assert source(name).text is source(name).text  # read once; nothing is formatted into it


def _operator(*codenames: str) -> Client:
    user = User.objects.create_user("op", "op@example.com", "pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    return client


ACTIONS = [  # (permission, how to reach the action for a job id)
    ("retry_job", lambda job_id: f"/admin/jobqueue/job/live/jobs/default/{job_id}/retry/"),
    ("reprioritize_job", lambda job_id: f"/admin/jobqueue/job/live/jobs/default/{job_id}/reprioritize/"),
    ("cancel_job", lambda job_id: f"/admin/jobqueue/job/live/jobs/default/{job_id}/cancel/"),
    ("pause_queue", lambda job_id: "/admin/jobqueue/job/live/queues/default/pause/"),
    ("run_schedule", lambda job_id: "/admin/jobqueue/job/live/schedules/beat/pause/"),
    ("resize_queue", lambda job_id: "/admin/jobqueue/job/live/queues/default/resize/"),
    ("set_lane_concurrency",
     lambda job_id: "/admin/jobqueue/job/live/queues/default/set_lane_concurrency/"),
]


TOKEN = "t" * 32


def _post(client: Client, path: str, *, csrf: bool) -> int:
    client.cookies["csrftoken"] = TOKEN
    headers = {"HTTP_X_CSRFTOKEN": TOKEN} if csrf else {}
    data = {"priority": "5", "count": "2", "confirm": "yes",  # cancel asks to confirm first
            "lane": "acme", "cap": "3"}
    return client.post(path, data, **headers).status_code  # type: ignore[arg-type]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("permission", "url"), ACTIONS, ids=[a[0] for a in ACTIONS])
def test_each_action_needs_its_permission_post_and_csrf(permission: str, url: object,
                                                        settings: Any) -> None:
    settings.JOBQUEUE = {**settings.JOBQUEUE,
                         "SCHEDULE": {"beat": {"job": "tests.jobapp.jobs.noop", "every": 60}}}
    job_id = jobs.add.using(delay=60).enqueue(1, 1).id  # scheduled: every action applies
    path = url(job_id)  # type: ignore[operator]
    others = [codename for codename, _ in ACTIONS if codename != permission]
    assert _post(_operator("view_job", *others), path, csrf=True) == 403  # every other right
    User.objects.all().delete()
    allowed = _operator("view_job", permission)
    assert allowed.get(path).status_code == 405  # GET never acts
    assert _post(allowed, path, csrf=False) == 403  # no CSRF token: refused
    info = Queue("default").get(job_id)
    assert info and info.state == "scheduled" and info.priority == 0
    assert not Queue("default").is_paused() and Queue("default").layout(fresh=True).live == 1
    assert _post(allowed, path, csrf=True) == 302  # all three: it acts
    after = Queue("default").get(job_id)
    acted = {"retry_job": after and after.state == "scheduled",  # not retryable: refused politely
             "reprioritize_job": after and after.priority == 5,
             "cancel_job": after and after.state == "cancelled",
             "pause_queue": Queue("default").is_paused(),
             "run_schedule": schedule.state(get_client()).get("beat", {}).get("paused"),
             "resize_queue": Queue("default").layout(fresh=True).live == 2,
             "set_lane_concurrency": lanes.live_caps(get_client(), "default") == {"acme": 3}}
    assert acted[permission]


@pytest.mark.django_db(transaction=True)
def test_a_wrong_password_or_no_server_is_one_clear_line_without_the_secret() -> None:
    guarded = ValkeyProcess("--requirepass", "s3cret-pass").start()
    try:
        for url in (f"redis://:wrong-guess@127.0.0.1:{guarded.port}/0",
                    ValkeyProcess().url):  # the second one: nothing listens there
            done = manage("jobqueue", "stats", url=url)
            assert done.returncode == 1 and "cannot use Valkey" in done.stderr
            assert "Traceback" not in done.stderr and "wrong-guess" not in done.stderr
            assert len(done.stderr.strip().splitlines()) == 1
        worker = manage("runworker", "--workers", "1", "--burst",
                        url=f"redis://:wrong-guess@127.0.0.1:{guarded.port}/0")
        assert worker.returncode == 1 and "refused the credentials" in worker.stderr
        assert "Traceback" not in worker.stderr and "wrong-guess" not in worker.stderr
    finally:
        guarded.cleanup()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_an_acl_user_in_the_url_runs_everything(settings: Any) -> None:
    server = ValkeyProcess().start()
    try:
        admin = redis.Redis(port=server.port)
        admin.execute_command("ACL", "SETUSER", "jq", "on", ">jq-secret", "~*", "&*", "+@all")
        admin.execute_command("ACL", "SETUSER", "default", "off")  # only the ACL user gets in
        url = f"redis://jq:jq-secret@127.0.0.1:{server.port}/0"
        settings.JOBQUEUE = {**settings.JOBQUEUE, "URL": url}
        ref = jobs.add.enqueue(20, 22)
        assert "default" in manage("jobqueue", "stats", url=url).stdout
        assert run_burst(url) == 0
        assert Job.objects.get(pk=ref.id).result == 42
        wrong = manage("jobqueue", "stats", url=url.replace("jq-secret", "nope"))
        assert wrong.returncode == 1 and "nope" not in wrong.stderr and "jq-secret" not in wrong.stderr
    finally:
        server.cleanup()


def _through_twin(client: Any, *commands: tuple[Any, ...]) -> list[Any]:
    """Send commands the way a worker's event loop waits: on a `WaitLine` that the asyncio
    twin of `client`'s connections opened, on a loop of the worker's kind."""
    async def go() -> list[Any]:
        line = await WaitLine.open(wire.async_twin(client))
        assert line is not None
        try:
            return await line.call(list(commands), lambda replies: replies, 5)
        finally:
            line.close()

    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(go())


def test_the_event_loops_connections_carry_the_acl_user_and_database() -> None:
    server = ValkeyProcess().start()
    try:
        admin = redis.Redis(port=server.port)
        admin.execute_command("ACL", "SETUSER", "jq", "on", ">jq-secret", "~*", "&*", "+@all")
        admin.execute_command("ACL", "SETUSER", "default", "off")
        client = redis.Redis.from_url(f"redis://jq:jq-secret@127.0.0.1:{server.port}/3",
                                      decode_responses=True)
        assert _through_twin(client, ("SET", "k", "v"), ("ACL", "WHOAMI")) == ["OK", "jq"]
        assert client.get("k") == "v"  # (database 3)
        custom = redis.ConnectionPool(connection_class=_Custom, port=server.port)
        assert wire.async_twin(redis.Redis(connection_pool=custom)) is None
    finally:
        server.cleanup()


class _Custom(redis.Connection):
    """A connection class an application made: it has no asyncio twin."""


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(not (shutil.which("stunnel4") or shutil.which("stunnel")),
                    reason="needs Debian's stunnel4 (apt-get install stunnel4)")
def test_tls_with_rediss_runs_everything_and_an_untrusted_certificate_is_one_clear_line(
        settings: Any, valkey_server: ValkeyProcess) -> None:
    proxy = TLSProxy(valkey_server.port).start()
    try:
        url = proxy.url(ssl_ca_certs=str(proxy.ca))
        settings.JOBQUEUE = {**settings.JOBQUEUE, "URL": url}
        ref = jobs.add.enqueue(40, 2)
        assert "default" in manage("jobqueue", "stats", url=url).stdout
        assert run_burst(url) == 0
        assert Job.objects.get(pk=ref.id).result == 42
        assert _through_twin(get_client(), ("PING",)) == ["PONG"]  # (an event loop's waits)

        untrusted = proxy.url()  # the system's CAs do not know the self-signed certificate
        done = manage("jobqueue", "stats", url=untrusted)
        assert done.returncode == 1 and "cannot use Valkey" in done.stderr
        assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
        worker = manage("runworker", "--workers", "1", "--burst", url=untrusted)
        assert worker.returncode == 1 and "TLS" in worker.stderr, worker.stderr
        assert "Traceback" not in worker.stderr
    finally:
        proxy.cleanup()
