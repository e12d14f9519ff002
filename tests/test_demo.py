"""The demo's worked example, codemojex: a flooding player waits in their own lane while the
others are served, and the page shows it."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from jobqueue import Queue
from project.demo import codemojex

from .servers import ValkeyProcess
from .workers import run_burst

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
