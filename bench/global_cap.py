"""What a global cap that does not bind costs a claim: a worker's steady state (claim `--batch`
jobs, their successes riding the next claim) on 1 and 16 shards, the queue without a cap, then
with `global_concurrency` far above what runs. Rounds alternate off / on (and which goes
first); each figure is the
median of `--rounds`. Server time is INFO commandstats' usec over every command, per job.

    .venv/bin/python bench/global_cap.py [--jobs 20000] [--batch 8] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics

from _common import django_setup, valkey

CAP = 100_000
"""Far above what one claimer holds: the cap never binds."""


def server_usec(client: object) -> int:
    stats = client.info("commandstats")  # type: ignore[attr-defined]
    return sum(int(v["usec"]) for v in stats.values())


def one_round(shards: int, capped: bool, jobs: int, batch: int) -> tuple[float, float, int]:
    """(jobs/s wall, server µs per job, server calls per claim) for one drain."""
    import time

    from django.conf import settings

    from jobqueue import Queue, conf
    from jobqueue.spec import JobSpec

    options = {"shards": shards, **({"global_concurrency": CAP} if capped else {})}
    settings.JOBQUEUE = {**settings.JOBQUEUE, "QUEUES": {"default": {}, "b": options}}
    conf.reset()
    queue = Queue("b")
    client = queue.client
    client.flushall()
    queue.enqueue_many([JobSpec({"handler": "bench.noop", "args": []}) for _ in range(jobs)])
    client.config_resetstat()
    acks: list = []
    claims = 0
    started = time.perf_counter()
    while True:
        _, leases = queue.ack_and_dequeue(acks, count=batch, worker="bench")
        claims += 1
        if not leases:
            break
        acks = [(lease, "null") for lease in leases]
    wall = time.perf_counter() - started
    calls = sum(int(v["calls"]) for v in client.info("commandstats").values())
    return jobs / wall, server_usec(client) / jobs, round(calls / claims, 2)


def interleaved(shards: int, jobs: int, batch: int) -> tuple[float, float, float, float]:
    """(jobs/s without a cap, with a non-binding one, then the client's CPU µs per job for
    each), the two queues' claims taking turns on one server, each claim timed on its own: the
    machine's drift falls on both alike."""
    import time

    from django.conf import settings

    from jobqueue import Queue, conf
    from jobqueue.spec import JobSpec

    settings.JOBQUEUE = {**settings.JOBQUEUE, "QUEUES": {
        "default": {}, "off": {"shards": shards},
        "on": {"shards": shards, "global_concurrency": CAP}}}
    conf.reset()
    queues = [Queue("off"), Queue("on")]
    queues[0].client.flushall()
    for queue in queues:
        queue.enqueue_many([JobSpec({"handler": "bench.noop", "args": []}) for _ in range(jobs)])
    spent, cpu, acks, left = [0.0, 0.0], [0.0, 0.0], [[], []], [True, True]
    turn = 0
    while any(left):
        turn += 1
        for i in ((0, 1) if turn % 2 else (1, 0)):  # (each goes first every other turn)
            queue = queues[i]
            if not left[i]:
                continue
            started, used = time.perf_counter(), time.process_time()
            _, leases = queue.ack_and_dequeue(acks[i], count=batch, worker="bench")
            spent[i] += time.perf_counter() - started
            cpu[i] += time.process_time() - used
            acks[i] = [(lease, "null") for lease in leases]
            left[i] = bool(leases)
    return jobs / spent[0], jobs / spent[1], cpu[0] / jobs * 1e6, cpu[1] / jobs * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with valkey() as url:
        django_setup(url)
        one_round(1, True, 2000, args.batch)  # warm-up: scripts loaded, connections open
        print(f"claim {args.batch} + acks riding the next claim, {args.jobs} jobs, "
              f"median of {args.rounds} rounds")
        print(f"{'shards':>6} {'cap':>13} {'jobs/s':>9} {'server µs/job':>14} {'calls/claim':>12}")
        for shards in (1, 16):
            results: dict[bool, list[tuple[float, float, int]]] = {False: [], True: []}
            for n in range(args.rounds):  # (each mode goes first in every other round)
                for capped in ((False, True) if n % 2 == 0 else (True, False)):
                    results[capped].append(one_round(shards, capped, args.jobs, args.batch))
            base = None
            for capped in (False, True):
                wall = statistics.median(r[0] for r in results[capped])
                usec = statistics.median(r[1] for r in results[capped])
                calls = statistics.median(r[2] for r in results[capped])
                note = "" if base is None else (f"  wall {base[0] / wall:.3f}×, "
                                                f"server {usec / base[1]:.3f}×")
                base = base or (wall, usec)
                print(f"{shards:>6} {'non-binding' if capped else 'off':>13} {wall:>9,.0f} "
                      f"{usec:>14.2f} {calls:>12.2f}{note}")
        print("\ninterleaved (claims of both queues taking turns; each claim timed):")
        for shards in (1, 16):
            pairs = [interleaved(shards, args.jobs, args.batch) for _ in range(args.rounds)]
            off = statistics.median(p[0] for p in pairs)
            on = statistics.median(p[1] for p in pairs)
            ratio = statistics.median(p[0] / p[1] for p in pairs)
            cpu_off = statistics.median(p[2] for p in pairs)
            cpu_on = statistics.median(p[3] for p in pairs)
            print(f"{shards:>6} shards: off {off:,.0f} jobs/s, non-binding cap {on:,.0f} jobs/s, "
                  f"wall cost {ratio:.3f}× (median of the rounds' ratios); client CPU "
                  f"{cpu_off:.1f} → {cpu_on:.1f} µs/job ({cpu_on / cpu_off:.3f}×)")


if __name__ == "__main__":
    main()
