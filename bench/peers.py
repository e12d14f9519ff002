"""jobqueue and its peers on one Valkey, in one run, each at its best: a table and ratios.

Every system runs the same job: INCR one counter with redis-py (BullMQ: with ioredis).
Each processing rate is given twice: from the workers' spawn to the last finished job (what a
deploy, an autoscaled pod or a `--burst` run pays) and steady (first finished job to the last);
"start" is spawn to the first finished job, for one process and for two. CPU per job counts
every worker process from start to stop. "raw" is the floor: redis-py LPUSH/BRPOP with no queue
semantics at all. Latency (enqueue to start on an idle worker at
concurrency 1) is measured for jobqueue and the raw floor side by side, their jobs taking turns.

    .venv/bin/pip install -r bench/requirements.txt && (cd bench/node && npm install)
    python3.12 -m venv bench/.venv-bullmq && bench/.venv-bullmq/bin/pip install bullmq
    (bench/.venv-deploy and bench/.venv-vtasks: `_common.DEPLOYED`; a run missing one prints how)
    .venv/bin/python bench/peers.py [--jobs 20000] [--only jobqueue,bullmq,vtasks,raw] [--rounds 3]

`--baseline PATH` adds peer jq-base: jobqueue as another checkout has it (say, `git worktree
add --detach ../base HEAD~3`), measured in the same run, so a change is judged before and after
against the same minutes of the machine.

With --rounds, the systems take turns (one whole measurement each, round after round) and the
table gives each number's median: the machine's speed drifts over minutes, and one system
measured alone in a slow stretch would lose by it. Each round starts one system later than the
one before: the first system of a round was measured slower in all three rounds of one run (the
same code 22 % below its copy measured second).

jobqueue runs as deployed, its mirror on: each finished job is written to MariaDB
(`--database`, created and migrated here; `--no-mirror` turns the mirror off, as the peers
keep no history). The workers of jobqueue, django-vtasks and BullMQ for Python run from venvs
of their own holding what each one's deploy has (made from the checkout's root;
`_common.DEPLOYED` says how and why): jobqueue's with its runtime requirements (the
code from the checkout), django-vtasks' with its package, BullMQ for Python's with `bullmq`; the
raw floor's worker uses jobqueue's (redis-py). Celery's, RQ's, Dramatiq's and Huey's still run
from the development venv. Enqueues from this process (jobqueue's, the raw floor's) run in the
development venv too; jq-base's, django-vtasks' and BullMQ for Python's enqueue from
processes of their own, from their venvs. An enqueue rate is timed inside its process: its
start-up is not in it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from _common import ROOT, compile_checkout, deployed_python, prepare_database, valkey

HERE = Path(__file__).resolve().parent
PY = sys.executable
NODE = ["node", str(HERE / "node" / "peer.js")]
BULLMQ_PY = [str(HERE / ".venv-bullmq" / "bin" / "python"), str(HERE / "bullmq_py.py")]
DATABASE_URL = "mysql://root@127.0.0.1:3306/jqbench"
MIRROR = True
"""Whether jobqueue's workers mirror finished jobs into DATABASE_URL (`--no-mirror`: off)."""


def env(url: str, root: Path = ROOT, **extra: str) -> dict[str, str]:
    """A subprocess's environment: the bench's settings, and the code of checkout `root`."""
    database = {"DATABASE_URL": DATABASE_URL} if MIRROR else {}
    return {**os.environ, "BENCH_URL": url, "VALKEY_URL": url, "PYTHONPATH": f"{HERE}:{root}",
            "DJANGO_SETTINGS_MODULE": "bench_settings", **database, **extra}


@dataclass
class Config:
    """One way to run a system's workers: a command, started `procs` times."""

    label: str
    argv: list[str]
    procs: int = 1
    extra_env: dict[str, str] = field(default_factory=dict)
    root: Path = ROOT
    """The checkout whose code the workers run (another one for `--baseline`)."""


class Peer:
    """One system under test: how it enqueues, and its worker configurations by role:
    "one" (its best in one process), "best" (its best on this machine), "c1" (concurrency 1)."""

    name = ""
    bulk = False
    venv: str | None = None
    """The venv (`_common.DEPLOYED`) its workers run from; None: the development venv's Python."""

    def __init__(self, url: str) -> None:
        self.url = url

    def enqueue(self, n: int, single: bool) -> float:
        """Enqueue n jobs; seconds it took."""
        raise NotImplementedError

    def configs(self) -> dict[str, Config]:
        raise NotImplementedError

    def reset(self) -> None:
        """Before each processing run: forget what an earlier run left (beyond Valkey)."""

    def subprocess_seconds(self, argv: list[str]) -> float:
        done = subprocess.run(argv, env=env(self.url), cwd=HERE, check=True, capture_output=True,
                              text=True)
        return float(json.loads(done.stdout.strip().splitlines()[-1])["seconds"])


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


class JobQueuePeer(Peer):
    """jobqueue with the job as an `async def` handler on the worker's event loop, as BullMQ's
    runs on Node's (its fastest here); `jq-sync` runs the plain function on runner threads."""

    name, bulk, venv = "jobqueue", True, "deploy"
    handler = "atick"
    best_concurrency = 64
    """Per process with --workers 2: measured best of 16/32/64/128/256 (async jobs are tasks,
    so more of them cost little; threads for plain ones do best at 32)."""
    one_concurrency = 128
    """In one process: measured best of 32/64/128/192/256 (64 and 128 close; 32 a fifth slower)."""

    best_options: tuple[str, ...] = ()
    """More runworker options for the "best" configuration."""
    root = ROOT
    """The checkout whose code runs (another one for `--baseline`)."""
    separate = False
    """Enqueue from a process of its own (with `--baseline`, both checkouts do, alike)."""

    def enqueue(self, n: int, single: bool) -> float:
        if self.separate:
            argv = [deployed_python(self.venv), "jq_enqueue.py", str(n), "single" if single else "bulk",
                    self.handler]
            done = subprocess.run(argv, env=env(self.url, self.root), cwd=HERE, check=True,
                                  capture_output=True, text=True)
            return float(json.loads(done.stdout.strip().splitlines()[-1])["seconds"])
        from benchapp import jobs

        tick = getattr(jobs, self.handler)
        if single:
            return timed(lambda: [tick.enqueue() for _ in range(n)])
        return timed(lambda: tick.enqueue_many([() for _ in range(n)]))

    def configs(self) -> dict[str, Config]:
        def run(workers: int, concurrency: int, *options: str) -> list[str]:
            return [deployed_python(self.venv), str(self.root / "manage.py"), "runworker",
                    "--workers", str(workers),
                    "--concurrency", str(concurrency), *options, "--log-level", "WARNING",
                    *([] if MIRROR else ["--no-mirror"])]

        shown = "".join(f" {option}" for option in self.best_options)
        return {"one": Config(f"1 proc, c={self.one_concurrency}", run(1, self.one_concurrency),
                              root=self.root),
                "best": Config(f"--workers 2, c={self.best_concurrency}{shown}",
                               run(2, self.best_concurrency, *self.best_options), root=self.root),
                "c1": Config("c=1", run(1, 1), root=self.root)}

    def reset(self) -> None:
        if MIRROR:  # (an upsert into a table of earlier runs' rows costs more)
            from django.db import connection

            from jobqueue.models import Job

            with connection.cursor() as cursor:
                cursor.execute(f"TRUNCATE TABLE {connection.ops.quote_name(Job._meta.db_table)}")


class JobQueueSyncPeer(JobQueuePeer):
    name, handler = "jq-sync", "tick"
    best_concurrency = one_concurrency = 32
    best_options = ("--prefetch", "96")
    """Runner threads starve less with a deeper prefetch (bench/RESULTS.md, "Plain `def` handlers
    on runner threads"): `--workers 2`, 10,000 jobs, four alternating rounds, 4,614 jobs/s from
    spawn (median) against 4,293 with the default (= concurrency) and 4,478 at c=16 prefetch 64."""


class BaselinePeer(JobQueuePeer):
    """jobqueue as another checkout has it (`--baseline PATH`, e.g. a worktree of the commit
    before a change), measured in the same run as this checkout's (one process cannot import
    two versions of the package, so both enqueue from processes of their own)."""

    name, separate = "jq-base", True


class BullMQPeer(Peer):
    name, bulk = "bullmq", True

    def enqueue(self, n: int, single: bool) -> float:
        return self.subprocess_seconds([*NODE, "enqueue", str(n), *(["single"] if single else [])])

    def configs(self) -> dict[str, Config]:
        return {"one": Config("1 proc, c=50", [*NODE, "work", "50"]),
                "best": Config("2 procs, c=50", [*NODE, "work", "50"], procs=2),
                "c1": Config("c=1", [*NODE, "work", "1"])}


class BullMQPyPeer(Peer):
    """BullMQ for Python (`bullmq` on PyPI), from its own venv (see the module's docstring)."""

    name, bulk = "bullmq-py", True
    concurrency = 10
    """Measured best in one process, 5,000 jobs, two rounds (jobs/s from spawn): c=1 1,602 /
    1,919, c=10 1,813 / 2,323, c=32 1,206 / 1,515, c=100 1,604 / 1,876, c=200 1,444 / 1,112."""

    def enqueue(self, n: int, single: bool) -> float:
        return self.subprocess_seconds([*BULLMQ_PY, "enqueue", str(n), *(["single"] if single else [])])

    def configs(self) -> dict[str, Config]:
        work = [*BULLMQ_PY, "work", str(self.concurrency)]
        return {"one": Config(f"1 proc, c={self.concurrency}", work),
                "best": Config(f"2 procs, c={self.concurrency}", work, procs=2),
                "c1": Config("c=1", [*BULLMQ_PY, "work", "1"])}


class VTasksPeer(Peer):
    name, venv = "vtasks", "vtasks"

    def enqueue(self, n: int, single: bool) -> float:
        return self.subprocess_seconds([deployed_python(self.venv), "vtasks_enqueue.py", str(n)])

    def configs(self) -> dict[str, Config]:
        argv = [deployed_python(self.venv), "-m", "django", "runworker", "--concurrency", "200"]
        settings = {"DJANGO_SETTINGS_MODULE": "vtasks_settings"}
        return {"one": Config("1 proc, c=200", argv, extra_env=settings),
                "best": Config("2 procs, c=200", argv, procs=2, extra_env=settings)}


class RawPeer(Peer):
    name, bulk, venv = "raw", True, "deploy"  # (redis-py, as jobqueue's deploy has it)

    def enqueue(self, n: int, single: bool) -> float:
        import redis

        client = redis.Redis.from_url(self.url)
        if single:
            return timed(lambda: [client.lpush("raw", "x") for _ in range(n)])

        def bulk() -> None:
            for start in range(0, n, 1000):
                client.lpush("raw", *["x"] * min(1000, n - start))

        return timed(bulk)

    def configs(self) -> dict[str, Config]:
        worker = [deployed_python(self.venv), "raw_worker.py"]
        return {"one": Config("1 proc", worker), "best": Config("2 procs", worker, procs=2)}


class CeleryPeer(Peer):
    name = "celery"

    def enqueue(self, n: int, single: bool) -> float:
        import peer_tasks

        task = peer_tasks.celery_app().tasks["tick"]
        return timed(lambda: [task.delay() for _ in range(n)])

    def configs(self) -> dict[str, Config]:
        return {"one": Config("threads, c=8", [
            PY, "-m", "celery", "-A", "peer_tasks", "worker", "-P", "threads", "-c", "8",
            "--without-heartbeat", "--without-gossip", "--without-mingle", "-l", "WARNING"],
            extra_env={"PEER": "celery"})}


class DramatiqPeer(Peer):
    name = "dramatiq"

    def enqueue(self, n: int, single: bool) -> float:
        import peer_tasks

        actor = peer_tasks.dramatiq_actor()
        return timed(lambda: [actor.send() for _ in range(n)])

    def configs(self) -> dict[str, Config]:
        return {"one": Config("1 proc, 8 threads", [
            PY, "-m", "dramatiq", "peer_tasks", "--processes", "1", "--threads", "8"],
            extra_env={"PEER": "dramatiq"})}


class HueyPeer(Peer):
    name = "huey"

    def enqueue(self, n: int, single: bool) -> float:
        import peer_tasks

        _, task = peer_tasks.huey_app()
        return timed(lambda: [task() for _ in range(n)])

    def configs(self) -> dict[str, Config]:
        return {"one": Config("8 threads", [
            PY, "-m", "huey.bin.huey_consumer", "peer_tasks.huey", "-w", "8", "-k", "thread", "-q"],
            extra_env={"PEER": "huey"})}


class RQPeer(Peer):
    name, bulk = "rq", True

    def enqueue(self, n: int, single: bool) -> float:
        import peer_tasks
        from redis import Redis
        from rq import Queue

        queue = Queue("bench", connection=Redis.from_url(self.url))
        if single:
            return timed(lambda: [queue.enqueue(peer_tasks.tick) for _ in range(n)])
        return timed(lambda: [queue.enqueue_many([Queue.prepare_data(peer_tasks.tick)
                                                  for _ in range(min(1000, n - s))])
                              for s in range(0, n, 1000)])

    def configs(self) -> dict[str, Config]:
        return {"one": Config("SimpleWorker", [
            PY, "-m", "rq.cli", "worker", "-w", "rq.worker.SimpleWorker", "--url", self.url,
            "--logging_level", "WARNING", "bench"])}


PEERS = [JobQueuePeer, JobQueueSyncPeer, BullMQPeer, BullMQPyPeer, VTasksPeer, RawPeer, CeleryPeer,
         DramatiqPeer, HueyPeer, RQPeer]


def _cpu(info: dict[str, float]) -> float:
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def process(peer: Peer, config: Config, n: int) -> dict[str, float]:
    """Start the config's workers on n waiting jobs: the rates from spawn and steady, the
    start-up (spawn to the first finished job), worker and Valkey CPU per job."""
    import redis

    client = redis.Redis.from_url(peer.url)
    client.set("bench:done", 0)
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    valkey_before = _cpu(client.info("cpu"))
    spawned = time.perf_counter()
    procs = [subprocess.Popen(config.argv, env=env(peer.url, config.root, **config.extra_env),
                              cwd=HERE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for _ in range(config.procs)]
    try:
        deadline = time.monotonic() + 600
        while int(client.get("bench:done") or 0) < 1:
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise RuntimeError(f"{peer.name} {config.label}: worker never ran a job")
            time.sleep(0.001)
        first, done = time.perf_counter(), 1
        while done < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{peer.name}: {done}/{n} after 600 s")
            time.sleep(0.002)
            done = int(client.get("bench:done") or 0)
        last = time.perf_counter()
        valkey_cpu = _cpu(client.info("cpu")) - valkey_before
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    worker_cpu = (after.ru_utime + after.ru_stime) - (children_before.ru_utime + children_before.ru_stime)
    return {"rate": n / (last - spawned), "steady": (n - 1) / (last - first),
            "start": first - spawned, "worker_us": worker_cpu / n * 1e6,
            "valkey_us": valkey_cpu / n * 1e6}


def latency(peers: list[Peer], samples: int = 200, gap: float = 0.01) -> dict[str, tuple[float, float]]:
    """p50 and p99 ms from enqueue to start on an idle queue, per system: each one's
    concurrency-1 worker waits idle beside the others', and their jobs take turns, one every
    `gap` seconds (the first alternating), so every system is measured in the same minutes of a
    machine whose speed drifts. Each job pushes its latency onto `bench:latency:<system>`, read
    once all have run. Nothing polls meanwhile: an earlier version asked for each job's result
    every 0.2 ms, which kept Valkey and this process busy while the job ran (on two cores, a tax
    on the system whose job takes more work), so the queues were not idle."""
    import redis

    client = redis.Redis.from_url(peers[0].url)
    flush(client)
    client.set("bench:done", 0)
    procs, senders = [], {}
    for peer in peers:
        config = peer.configs().get("c1") or peer.configs()["one"]
        procs.append(subprocess.Popen(config.argv, env=env(peer.url, **config.extra_env), cwd=HERE,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        if isinstance(peer, JobQueuePeer):
            from benchapp import jobs

            stamp = jobs.astamp if peer.handler == "atick" else jobs.stamp
            senders[peer.name] = lambda stamp=stamp: stamp.enqueue(time.time())
        else:
            senders[peer.name] = lambda: client.lpush("raw", repr(time.time()))
    keys = {peer.name: f"bench:latency:{peer.name}" for peer in peers}
    try:
        time.sleep(3)  # started and idle
        for i in range(samples):
            for peer in peers if i % 2 == 0 else peers[::-1]:
                senders[peer.name]()
                time.sleep(gap)
        deadline = time.monotonic() + 30
        while any(client.llen(key) < samples for key in keys.values()):
            if time.monotonic() > deadline:
                raise RuntimeError("latency: some jobs never ran")
            time.sleep(0.05)
        values = {name: sorted(float(v) * 1000 for v in client.lrange(key, 0, -1))
                  for name, key in keys.items()}
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(30)
    return {name: (statistics.median(v), v[int(0.99 * (len(v) - 1))]) for name, v in values.items()}


def measure(peer: Peer, n: int) -> dict[str, object]:
    import redis

    client = redis.Redis.from_url(peer.url)
    out: dict[str, object] = {}
    # Memory per waiting job: after a first batch of the same jobs (and a few single enqueues,
    # so every system's measured path is as warm), flushed: what a first batch leaves behind a
    # flush (~30 bytes a job at 10,000 here, the scripts' cache among it) counts for nobody,
    # whichever system runs first. SYNC: a plain FLUSHALL frees in the background (Valkey's
    # default lazyfree-lazy-user-flush), and memory read meanwhile still holds what is being freed.
    peer.enqueue(n, single=not peer.bulk)
    peer.enqueue(100, single=True)
    flush(client)
    before = int(client.info("memory")["used_memory"])
    out["enqueue_single"] = n / peer.enqueue(n, single=True)
    out["bytes_per_job"] = (int(client.info("memory")["used_memory"]) - before) / n
    for role, config in peer.configs().items():
        flush(client)
        peer.reset()
        count = n // 4 if role == "c1" else n  # concurrency 1 is slow: fewer jobs
        seconds = peer.enqueue(count, single=not peer.bulk)
        if peer.bulk and "enqueue_bulk" not in out:
            out["enqueue_bulk"] = count / seconds
        out[role] = {"label": config.label, **process(peer, config, count)}
        run = out[role]
        print(f"  {peer.name:<9} {config.label:<32} {run['rate']:>9,.0f} jobs/s from spawn,"  # type: ignore[index]
              f" {run['steady']:>7,.0f} steady, start {run['start']:.2f} s", flush=True)  # type: ignore[index]
    return out


def flush(client: object) -> None:
    """Empty Valkey now, not in the background (see `measure`)."""
    client.execute_command("FLUSHALL", "SYNC")  # type: ignore[attr-defined]


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:5.2f}×" if a and b else "    —"


def _best(r: dict) -> dict:
    """A system's fastest processing configuration, counted from spawn."""
    return max((r[role] for role in ("one", "best") if role in r), key=lambda c: c["rate"])


RATIOS = [("best", "best"), ("best steady", "best:steady"), ("1 proc", "one"), ("c=1", "c1"),
          ("c=1 steady", "c1:steady"), ("enq 1", "enqueue_single"), ("enq bulk", "enqueue_bulk"),
          ("start 1", "one:start"), ("start 2", "best:start")]
"""The ratio table's columns: a heading, and `role[:field]` (field: the rate from spawn)."""


def _value(r: dict, key: str) -> float | None:
    role, _, field = key.partition(":")
    value = (_best(r) if r else None) if role == "best" and field != "start" else r.get(role)
    return value.get(field or "rate") if isinstance(value, dict) else value


def report(results: dict[str, dict], n: int) -> None:
    print(f"\n{n:,} no-op jobs, one valkey-server; rates in jobs/s from spawn (steady: first "
          "finished job to the last), start-up in s (spawn to first finished job), CPU in µs/job")
    print(f"  {'system':<9} {'best':>7} {'steady':>7} {'1 proc':>7} {'steady':>7} {'c=1':>6}"
          f" {'steady':>6} {'start 1':>7} {'start 2':>7} {'enq 1':>6} {'enq bulk':>8}"
          f" {'bytes':>5} {'worker':>6} {'valkey':>6}  best config")
    for name, r in results.items():
        best, c1, two = _best(r), r.get("c1", {}), r.get("best", {})
        print(f"  {name:<9} {best['rate']:>7,.0f} {best['steady']:>7,.0f} {r['one']['rate']:>7,.0f}"
              f" {r['one']['steady']:>7,.0f} {c1.get('rate', 0):>6,.0f} {c1.get('steady', 0):>6,.0f}"
              f" {r['one']['start']:>7.2f} {two.get('start', 0):>7.2f} {r['enqueue_single']:>6,.0f}"
              f" {r.get('enqueue_bulk', 0):>8,.0f} {r['bytes_per_job']:>5,.0f}"
              f" {best['worker_us']:>6,.0f} {best['valkey_us']:>6,.1f}  {best['label']}")
    mine_names = [name for name in ("jobqueue", "jq-base", "jq-sync") if name in results]
    for mine in mine_names:
        others = [p for p in ("jq-base", "bullmq", "bullmq-py", "vtasks", "raw")
                  if p in results and p != mine]
        if others:
            print(f"\n  {mine} ÷ {'':<{9 - len(mine)}} " + " ".join(f"{h:>11}" for h, _ in RATIOS)
                  + "   (start: time ÷ time, lower is better)")
        for peer in others:
            print(f"  {peer:<12} " + " ".join(
                f"{ratio(_value(results[mine], k), _value(results[peer], k)):>11}"
                for _, k in RATIOS))
    jq = results.get("jobqueue")
    if jq and "latency_ms" in jq:
        p50, p99 = jq["latency_ms"]
        line = (f"\n  latency enqueue → start, idle queue, c=1, side by side: jobqueue p50 {p50:.2f} ms,"
                f" p99 {p99:.2f} ms")
        if "latency_ms" in results.get("raw", {}):
            raw50, raw99 = results["raw"]["latency_ms"]
            line += f"; raw p50 {raw50:.2f}, p99 {raw99:.2f} (p50 ratio {p50 / raw50:.2f}×)"
        print(line)


def median_run(runs: list[dict]) -> dict:
    """One result from several rounds of a system: the median of every number, field by field
    (a configuration's label, and the latency's p50 and p99 pair, kept as they are)."""
    merged: dict = {}
    for key, first in runs[0].items():
        values = [run[key] for run in runs]
        if isinstance(first, dict):
            merged[key] = median_run(values)
        elif isinstance(first, (int, float)):
            merged[key] = statistics.median(values)
        elif key == "latency_ms":
            merged[key] = tuple(statistics.median(pair[i] for pair in values) for i in (0, 1))
        else:
            merged[key] = first
    return merged


def main() -> None:
    global MIRROR, DATABASE_URL
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--only", help="comma-separated peer names (default: all)")
    parser.add_argument("--baseline", type=Path,
                        help="another checkout of jobqueue (e.g. `git worktree add` of the commit "
                             "before a change): measured as peer jq-base in the same run")
    parser.add_argument("--no-mirror", action="store_true",
                        help="run jobqueue's workers with the mirror off (default: on, into --database)")
    parser.add_argument("--database", default="mysql://root@127.0.0.1:3306/jqbench",
                        help="where jobqueue's mirror writes (created and migrated here)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="measure every system this many times, taking turns (the machine's "
                             "speed drifts: a system measured in a slow minute alone would lose "
                             "by it), and report the medians")
    args = parser.parse_args()
    MIRROR, DATABASE_URL = not args.no_mirror, args.database
    if args.baseline:
        BaselinePeer.root = args.baseline.resolve()
        JobQueuePeer.separate = True
    chosen = [*PEERS]
    if args.baseline:
        chosen.insert(1, BaselinePeer)  # beside jobqueue: the two measured minutes apart at most
    peers = [p for p in chosen
             if not args.only or p.name in args.only.split(",") or p is BaselinePeer]
    for venv in {p.venv for p in peers if p.venv}:
        deployed_python(venv)  # (a missing venv stops the run now, not at its system's turn)
    runs: dict[str, list[dict]] = {p.name: [] for p in peers}
    compile_checkout()
    if args.baseline:
        compile_checkout(BaselinePeer.root)
    with valkey() as url:
        for key, value in env(url).items():
            os.environ.setdefault(key, value)
        os.environ["BENCH_URL"] = os.environ["VALKEY_URL"] = url
        sys.path[:0] = [str(HERE), str(ROOT)]
        if MIRROR and any(issubclass(p, JobQueuePeer) for p in peers):
            os.environ["DATABASE_URL"] = DATABASE_URL
            prepare_database(DATABASE_URL)
        import django

        django.setup()
        for number in range(args.rounds):
            if args.rounds > 1:
                print(f"round {number + 1} of {args.rounds}", flush=True)
            start = number % len(peers)  # (each round starts one system later: see above)
            for peer in peers[start:] + peers[:start]:
                runs[peer.name].append(measure(peer(url), args.jobs))
            timed_peers = [peer(url) for peer in peers if peer in (JobQueuePeer, RawPeer)]
            if timed_peers:
                for name, value in latency(timed_peers).items():
                    runs[name][-1]["latency_ms"] = value
            if args.rounds > 1:
                report({name: r[-1] for name, r in runs.items()}, args.jobs)
    if args.rounds > 1:
        print(f"\nmedians of {args.rounds} rounds, the systems taking turns:")
    results = {name: median_run(r) for name, r in runs.items()}
    report(results, args.jobs)
    print(json.dumps(runs if args.rounds > 1 else results))


if __name__ == "__main__":
    main()
