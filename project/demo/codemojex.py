"""codemojex, the worked example: players guess a secret word; each guess is a job on the
player's own lane of queue "cm", so the queue serves the players in turn and one keyboard masher
cannot starve the others. The page at /codemojex/ shows the game and each lane's service.

Every ROUND seconds the players' loop closes a round with a chord (a flow: one `tally` job per
player, then `crown` with their results), and a periodic job (`scoreboard`, every few seconds:
JOBQUEUE["SCHEDULE"] in project/settings.py) keeps the board's snapshot, so the console's flow
and periodic jobs pages have something at work."""

from __future__ import annotations

import random
import time
from typing import Any

from jobqueue import Queue, chord, job
from jobqueue.conf import get_client

WORDS = ("queue", "lease", "fence", "shard", "valve", "relay", "token", "lanes", "retry", "mirror")
SECRET = "fence"
STATS = "codemojex:stats"
"""HASH: served:<player> -> guesses scored, best:<player> -> best score, solved:<player> -> 1."""
PLAYERS = ("ada", "bob", "cyd", "dee")
FLOODER = "masher"
ROUND = 10.0
"""Seconds between two rounds' chords."""


def score(word: str) -> int:
    """Wordle-ish: 2 points per letter in its place, 1 per letter elsewhere in the secret."""
    return sum(2 if a == b else 1 if a in SECRET else 0 for a, b in zip(word, SECRET, strict=False))


@job(queue="cm")
def guess(player: str, word: str) -> dict[str, Any]:
    """Score one guess (a little work, so a flood builds a backlog) and keep the player's stats."""
    time.sleep(0.1)  # the demo's worker (2 processes x 4 threads) scores ~80 guesses a second
    points = score(word)
    client = get_client()
    client.hincrby(STATS, f"served:{player}", 1)
    best = int(client.hget(STATS, f"best:{player}") or 0)
    if points > best:
        client.hset(STATS, f"best:{player}", points)
    if word == SECRET:
        client.hset(STATS, f"solved:{player}", 1)
    return {"player": player, "word": word, "score": points}


def play(seconds: float | None = None) -> None:
    """The players: four who guess once a second, and one who floods 100 guesses a second,
    more than the demo's worker can score: the flooder's lane grows, the others' do not."""
    rng = random.Random()
    started = last_round = time.monotonic()
    while seconds is None or time.monotonic() - started < seconds:
        for player in PLAYERS:
            guess.using(lane=player).enqueue(player, rng.choice(WORDS))
        guess.using(lane=FLOODER).enqueue_many([(FLOODER, rng.choice(WORDS)) for _ in range(100)])
        if time.monotonic() - last_round >= ROUND:
            new_round()
            last_round = time.monotonic()
        time.sleep(1.0)


def new_round() -> str:
    """Close a round: a chord of one `tally` per player, then `crown` with all their tallies;
    the flow's id (the console's flow page draws it)."""
    flow = chord([tally.s(player) for player in (*PLAYERS, FLOODER)], crown.s()).enqueue()
    get_client().hset(STATS, "round_flow", flow.id)
    return flow.id


@job(queue="cm")
def tally(player: str) -> dict[str, Any]:
    """One player's standing at the end of a round."""
    stats = get_client().hgetall(STATS)
    return {"player": player, "best": int(stats.get(f"best:{player}", 0)),
            "served": int(stats.get(f"served:{player}", 0))}


@job(queue="cm")
def crown(tallies: list[dict[str, Any]]) -> str:
    """The round's leader: the best score, then the fewest guesses."""
    leader = max(tallies, key=lambda row: (row["best"], -row["served"]))["player"]
    client = get_client()
    client.hset(STATS, "leader", leader)
    client.hincrby(STATS, "rounds", 1)
    return leader


@job(queue="cm")
def scoreboard() -> list[dict[str, Any]]:
    """The periodic job: the board's snapshot, kept for the page (and as the job's result)."""
    rows = board()
    client = get_client()
    client.hset(STATS, "snapshot_at", f"{time.time():.0f}")
    client.hincrby(STATS, "snapshots", 1)
    return rows


def rounds() -> dict[str, str]:
    """The rounds so far: how many, the last leader, the last round's flow id, how many
    snapshots the periodic job took."""
    stats = get_client().hgetall(STATS)
    return {key: stats.get(key, "") for key in ("rounds", "leader", "round_flow", "snapshots")}


def board() -> list[dict[str, Any]]:
    """Each player's row: guesses scored, guesses waiting in their lane, best score, solved."""
    stats = get_client().hgetall(STATS)
    queue = Queue("cm")
    rows = []
    for player in (*PLAYERS, FLOODER):
        waiting = sum(queue.client.zcard(queue.shard(i).lane(player))
                      for i in range(queue.claim_shards()))
        rows.append({"player": player, "served": int(stats.get(f"served:{player}", 0)),
                     "waiting": waiting, "best": int(stats.get(f"best:{player}", 0)),
                     "solved": stats.get(f"solved:{player}") == "1"})
    return rows
