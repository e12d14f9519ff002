"""codemojex, the worked example: players guess a secret word; each guess is a job on the
player's own lane of queue "cm", so the queue serves the players in turn and one keyboard masher
cannot starve the others. The page at /codemojex/ shows the game and each lane's service."""

from __future__ import annotations

import random
import time
from typing import Any

from jobqueue import Queue, job
from jobqueue.conf import get_client

WORDS = ("queue", "lease", "fence", "shard", "valve", "relay", "token", "lanes", "retry", "mirror")
SECRET = "fence"
STATS = "codemojex:stats"
"""HASH: served:<player> -> guesses scored, best:<player> -> best score, solved:<player> -> 1."""
PLAYERS = ("ada", "bob", "cyd", "dee")
FLOODER = "masher"


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
    started = time.monotonic()
    while seconds is None or time.monotonic() - started < seconds:
        for player in PLAYERS:
            guess.using(lane=player).enqueue(player, rng.choice(WORDS))
        guess.using(lane=FLOODER).enqueue_many([(FLOODER, rng.choice(WORDS)) for _ in range(100)])
        time.sleep(1.0)


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
