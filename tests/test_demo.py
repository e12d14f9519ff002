"""The demo's worked example, codemojex: a flooding player waits in their own lane while the
others are served, and the page shows it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from jobqueue import Queue, get_job
from jobqueue.embedded import free_port
from project.demo import codemojex

from .servers import ValkeyProcess
from .workers import ROOT, run_burst, start_worker, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_flooding_player_waits_in_their_lane_and_the_page_shows_it(
        client: Client, settings: Any, valkey_server: ValkeyProcess) -> None:
    settings.JOBQUEUE = {**settings.JOBQUEUE, "QUEUES": {"cm": {}}}
    for player in codemojex.PLAYERS:
        codemojex.guess.using(lane=player).enqueue(player, "fence")
    codemojex.guess.using(lane=codemojex.FLOODER).enqueue_many(
        [(codemojex.FLOODER, "queue")] * 40)
    # Single claims, as a worker at concurrency 1: each player's guess is scored before the
    # flooder's second one, whatever the flooder's 40 in the queue.
    queue = Queue("cm")
    leases = [lease for _ in range(8) for lease in queue.dequeue(count=1, worker="w")]
    served = [lease.payload["args"][0] for lease in leases]
    assert sorted(served[:5]) == sorted([*codemojex.PLAYERS, codemojex.FLOODER])
    queue.release_many(leases)  # the worker below scores them
    assert codemojex.score("fence") == 10 and codemojex.score("queue") == 3
    page = client.get("/codemojex/").content.decode()
    assert 'data-player="masher"' in page and "waiting in lane" in page
    assert run_burst(valkey_server.url, "--queues", "cm", "--lease", "5") == 0
    rows = {row["player"]: row for row in codemojex.board()}
    assert rows["ada"]["solved"] and rows["masher"]["waiting"] == 0


def test_a_round_closes_with_a_chord_the_console_draws(client: Client, settings: Any,
                                                       valkey_server: ValkeyProcess) -> None:
    settings.JOBQUEUE = {**settings.JOBQUEUE, "QUEUES": {"cm": {}}}
    User.objects.create_superuser("admin", "admin@example.com", "admin")
    client.login(username="admin", password="admin")
    codemojex.guess.using(lane="ada").enqueue("ada", "fence")
    flow_id = codemojex.new_round()
    assert run_burst(valkey_server.url, "--queues", "cm") == 0
    assert codemojex.rounds()["rounds"] == "1" and codemojex.rounds()["round_flow"] == flow_id
    assert get_job(flow_id).state == "succeeded"  # type: ignore[union-attr]
    page = client.get(f"/admin/jobqueue/job/live/flows/cm/{flow_id}/").content.decode()
    assert page.count('class="jq-node') == 6 and page.count('data-state="succeeded"') == 6
    assert f"/flows/cm/{flow_id}/" in client.get("/codemojex/").content.decode()


def test_the_scoreboard_is_a_periodic_job_a_worker_fires(valkey_server: ValkeyProcess,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from project import settings as demo

    beat = {name: {**entry, "every": 1} for name, entry in demo.JOBQUEUE["SCHEDULE"].items()}
    assert beat["scoreboard"]["job"] == "project.demo.codemojex.scoreboard"
    monkeypatch.setenv("JOBQUEUE_TEST_SCHEDULE", json.dumps(beat))
    monkeypatch.setenv("JOBQUEUE_TEST_QUEUES", json.dumps({"cm": {}}))
    worker = start_worker(valkey_server.url, "--queues", "cm")
    try:
        wait_for(lambda: int(codemojex.rounds()["snapshots"] or 0) >= 2, timeout=60)
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(20) == 0


def _session_pids(sid: int) -> set[int]:
    """The processes of session `sid` (everything `./dev.sh demo` started but daemons)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:  # gone meanwhile
                continue
            if int(fields[3]) == sid and fields[0] != "Z":
                found.add(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


@pytest.mark.slow
def test_ctrl_c_on_the_demo_stops_every_process_it_started() -> None:
    """SIGINT to the demo's process group, as a terminal's Ctrl-C sends it, while it serves: the
    server (and runserver's serving child), the worker, the players and the embedded
    valkey-server are all gone within seconds."""
    pidfile = ROOT / "var" / "valkey" / "valkey.pid"
    if pidfile.exists() and _alive(int(pidfile.read_text())):
        pytest.skip("a demo's valkey-server already runs in var/valkey: the demo would keep it")
    port = free_port()
    env = {key: value for key, value in os.environ.items()
           if key not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "VALKEY_URL")}
    demo = subprocess.Popen(["./dev.sh", "demo"], cwd=ROOT, env={**env, "DEMO_PORT": str(port)},
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    valkey = None
    try:
        wait_for(lambda: _answers(f"http://127.0.0.1:{port}/admin/login/"), timeout=180, every=0.2)
        started = _session_pids(demo.pid)
        valkey = int(pidfile.read_text())
        assert len(started) >= 5 and _alive(valkey)  # dev.sh, worker, players, runserver ×2
        os.killpg(demo.pid, signal.SIGINT)
        assert demo.wait(15) == 130
        wait_for(lambda: not any(_alive(pid) for pid in started) and not _alive(valkey), timeout=5)
        assert not _session_pids(demo.pid)
    finally:
        for pid in _session_pids(demo.pid) | ({valkey} if valkey and _alive(valkey) else set()):
            os.kill(pid, signal.SIGKILL)  # a failed test leaves nothing behind
        demo.wait(10)
