"""Concurrency 1, measured in what does not move with the machine's load: Valkey commands per job
(INFO commandstats: client calls and the calls scripts make), Valkey CPU per job (INFO cpu) and the
worker's CPU per job (its rusage), each the marginal cost of a job: a `runworker --burst
--concurrency 1` run over N jobs minus one over none (start-up and stop cancel out).

    .venv/bin/python bench/c1.py [--jobs 20000] [--handler anoop] [--rounds 2] [--mirror]
                                 [--roots ../other-checkout,.]   # checkouts, alternating, each round

`--latency S`: instead, an idle worker per checkout and the raw floor, each on its own Valkey,
their jobs taking turns every 10 ms, S jobs each: p50 / p90 ms from enqueue to handler start, and
per job and system its Valkey's calls by command (usec per call), Valkey's CPU, its worker's and
its sender's CPU (schedstat of their threads alive at the end).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _common import ROOT, prepare_database, valkey

HERE = Path(__file__).resolve().parent
PY = sys.executable
DATABASE_URL = "mysql://root@127.0.0.1:3306/jqbench_c1"
SCRIPT_INNER = {"hmget", "hset", "hget", "hdel", "hincrby", "zadd", "zrem", "zpopmin", "zcard",
                "lmove", "llen", "lindex", "lrem", "rpush", "lpush", "xadd", "pexpire", "del",
                "exists", "sadd", "srem", "zscore", "incr", "incrby", "expire", "hgetall",
                "zrangebyscore", "zrange", "lpos", "hrandfield", "hsetex", "publish", "time",
                "set", "get", "unlink", "hexists", "hlen", "scard", "smembers", "xtrim"}


def env(url: str, root: Path, mirror: bool) -> dict[str, str]:
    return {**os.environ, "BENCH_URL": url, "VALKEY_URL": url,
            "PYTHONPATH": f"{HERE}:{root}", "DJANGO_SETTINGS_MODULE": "bench_settings",
            **({"DATABASE_URL": DATABASE_URL} if mirror else {})}


def snapshot(client) -> tuple[dict[str, tuple[int, int]], float]:  # type: ignore[no-untyped-def]
    stats = client.info("commandstats")
    cpu = client.info("cpu")
    calls = {name.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"]))
             for name, v in stats.items()}
    return calls, float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def mariadb_cpu() -> float:
    """CPU seconds the MariaDB server has used (0 when it is not running here)."""
    found = subprocess.run(["pidof", "mariadbd"], capture_output=True, text=True).stdout.split()
    if not found:
        return 0.0
    fields = Path(f"/proc/{found[0]}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_run(url: str, root: Path, n: int, handler: str, mirror: bool) -> dict[str, object]:
    import redis

    client = redis.Redis.from_url(url, decode_responses=True)
    client.flushall()
    if n:
        subprocess.run([PY, "jq_enqueue.py", str(n), "bulk", handler], env=env(url, root, mirror),
                       cwd=HERE, check=True, capture_output=True)
    client.config_resetstat()
    calls0, cpu0 = snapshot(client)
    db0 = mariadb_cpu()
    started = time.perf_counter()
    argv = [PY, str(root / "manage.py"), "runworker", "--burst", "--workers", "1",
            "--concurrency", "1", "--log-level", "WARNING", *([] if mirror else ["--no-mirror"])]
    proc = subprocess.Popen(argv, env=env(url, root, mirror), cwd=HERE)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - started
    assert proc.returncode == 0, proc.returncode
    calls1, cpu1 = snapshot(client)
    db = mariadb_cpu() - db0
    calls = {k: (v[0] - calls0.get(k, (0, 0))[0], v[1] - calls0.get(k, (0, 0))[1])
             for k, v in calls1.items()}
    calls.pop("info", None)
    calls.pop("config|resetstat", None)
    return {"wall": wall, "worker_cpu": usage.ru_utime + usage.ru_stime, "worker_sys": usage.ru_stime,
            "valkey_cpu": cpu1 - cpu0, "db_cpu": db, "calls": calls}


def marginal(big: dict, small: dict, n: int) -> dict[str, object]:  # type: ignore[type-arg]
    names = set(big["calls"]) | set(small["calls"])
    per = {k: ((big["calls"].get(k, (0, 0))[0] - small["calls"].get(k, (0, 0))[0]) / n,
               (big["calls"].get(k, (0, 0))[1] - small["calls"].get(k, (0, 0))[1]) / n)
           for k in names}
    per = {k: v for k, v in per.items() if abs(v[0]) >= 0.005}
    inner = sum(v[0] for k, v in per.items() if k in SCRIPT_INNER)
    return {"worker_us": (big["worker_cpu"] - small["worker_cpu"]) / n * 1e6,
            "worker_sys_us": (big["worker_sys"] - small["worker_sys"]) / n * 1e6,
            "valkey_us": (big["valkey_cpu"] - small["valkey_cpu"]) / n * 1e6,
            "db_us": (big["db_cpu"] - small["db_cpu"]) / n * 1e6,
            "rate": n / (big["wall"] - small["wall"]),
            "client_calls": sum(v[0] for v in per.values()) - inner, "script_calls": inner,
            "cmd_usec": sum(v[1] for v in per.values()), "per": per}


def throughput(args: argparse.Namespace, roots: list[Path]) -> None:
    results: dict[Path, list[dict]] = {root: [] for root in roots}  # type: ignore[type-arg]
    with valkey() as url:
        for _ in range(args.rounds):
            for root in roots:
                small = one_run(url, root, 0, args.handler, args.mirror)
                big = one_run(url, root, args.jobs, args.handler, args.mirror)
                m = marginal(big, small, args.jobs)
                results[root].append(m)
                print(f"{root!s:<16} worker {m['worker_us']:6.1f} µs/job  valkey "
                      f"{m['valkey_us']:6.1f} µs/job (commands {m['cmd_usec']:5.1f})  MariaDB "
                      f"{m['db_us']:5.1f} µs/job  client "
                      f"calls {m['client_calls']:5.2f}/job  script calls {m['script_calls']:5.2f}"
                      f"/job  {m['rate']:7,.0f} jobs/s (wall, load-dependent)", flush=True)
    for root, runs in results.items():
        print(f"\n{root}: per job, last round")
        for name, (count, usec) in sorted(runs[-1]["per"].items(), key=lambda kv: -kv[1][0]):
            print(f"  {name:<22} {count:6.2f} calls  {usec:6.1f} µs")


def tree_cpu(pid: int) -> float:
    """CPU seconds of a process and its descendants (those alive now; their threads alive now,
    from schedstat: nanoseconds, where rusage counts 10 ms ticks)."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
    todo, total = [pid], 0
    while todo:
        current = todo.pop()
        for task in Path(f"/proc/{current}/task").glob("*/schedstat"):
            with contextlib.suppress(OSError):
                total += int(task.read_text().split()[0])
        todo.extend(child for child, parent in parents.items() if parent == current)
    return total / 1e9


def latency_costs(clients: dict, pids: dict, before: dict | None, n: int) -> dict:  # type: ignore[type-arg]
    """Per system: Valkey's calls and usec by command, Valkey's CPU, its worker's and sender's
    CPU; with `before`, printed per job since then."""
    now = {name: (snapshot(client), [tree_cpu(pid) for pid in pids[name]])
           for name, client in clients.items()}
    if before is None:
        return now
    for name, ((calls, vcpu), cpu) in now.items():
        (calls0, vcpu0), cpu0 = before[name]
        per = {k: ((v[0] - calls0.get(k, (0, 0))[0]) / n, v[1] - calls0.get(k, (0, 0))[1])
               for k, v in calls.items() if k not in ("info", "llen", "lrange")}
        shown = "  ".join(f"{k} {c:.2f}×{u / max(c * n, 1):.1f}µs" for k, (c, u) in
                          sorted(per.items(), key=lambda kv: -kv[1][0]) if c >= 0.05)
        worker, *sender = ((b - a) / n * 1e6 for a, b in zip(cpu0, cpu, strict=True))
        print(f"{name:<16} valkey {(vcpu - vcpu0) / n * 1e6:6.1f} µs/job  worker {worker:6.1f} "
              f"µs/job{f'  sender {sender[0]:6.1f} µs/job' if sender else ''}  calls/job: {shown}")
    return now


def latency(args: argparse.Namespace, roots: list[Path]) -> None:
    import redis

    names = [str(root) for root in roots] + ["raw"]
    with valkey() as u0, valkey() as u1, valkey() as u2:
        urls = dict(zip(names, [u0, u1, u2], strict=False))
        procs, clients = [], {}
        for name in names:
            client = redis.Redis.from_url(urls[name])
            client.flushall()
            client.set("bench:done", 0)
            clients[name] = client
            argv = ([PY, "raw_worker.py"] if name == "raw" else
                    [PY, str(Path(name) / "manage.py"), "runworker", "--workers", "1", "--concurrency", "1",
                     "--log-level", "WARNING", *([] if args.mirror else ["--no-mirror"])])
            root = Path(name) if name != "raw" else ROOT
            procs.append(subprocess.Popen(argv, env=env(urls[name], root, args.mirror), cwd=HERE))
        senders = {}
        for name in names[:-1]:
            senders[name] = subprocess.Popen(
                [PY, "-c", SENDER, args.handler], env=env(urls[name], Path(name), args.mirror),
                cwd=HERE, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            assert senders[name].stdout.readline().strip() == "ready"  # type: ignore[union-attr]
        try:
            time.sleep(3)
            pids = {name: [proc.pid, *([senders[name].pid] if name in senders else [])]
                    for name, proc in zip(names, procs, strict=True)}
            before = latency_costs(clients, pids, None, args.latency)
            for i in range(args.latency):
                for name in names if i % 2 == 0 else names[::-1]:
                    if name == "raw":
                        clients[name].lpush("raw", repr(time.time()))
                    else:
                        senders[name].stdin.write("\n")  # type: ignore[union-attr]
                        senders[name].stdin.flush()  # type: ignore[union-attr]
                        senders[name].stdout.readline()  # type: ignore[union-attr]
                    time.sleep(0.01)
            deadline = time.monotonic() + 30
            key = {name: "bench:latency:raw" if name == "raw" else
                   f"bench:latency:{'jobqueue' if args.handler == 'astamp' else 'jq-sync'}"
                   for name in names}
            while any(clients[n].llen(key[n]) < args.latency for n in names):
                assert time.monotonic() < deadline
                time.sleep(0.05)
            latency_costs(clients, pids, before, args.latency)
            values = {n: sorted(float(v) * 1000 for v in clients[n].lrange(key[n], 0, -1))
                      for n in names}
        finally:
            for proc in [*procs, *senders.values()]:
                proc.terminate()
                proc.wait(30)
    raw50 = statistics.median(values["raw"])
    for name, v in values.items():
        p50 = statistics.median(v)
        print(f"{name:<16} p50 {p50:.3f} ms  p90 {v[int(0.9 * (len(v) - 1))]:.3f} ms  "
              f"÷ raw {p50 / raw50:.2f}×")


SENDER = """
import os, sys, time
import django
django.setup()
from benchapp import jobs
stamp = getattr(jobs, sys.argv[1])
print("ready", flush=True)
for _ in sys.stdin:
    stamp.enqueue(time.time())
    print("sent", flush=True)
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--handler", default="anoop")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--mirror", action="store_true")
    parser.add_argument("--roots", default=str(ROOT))
    parser.add_argument("--latency", type=int, default=0)
    args = parser.parse_args()
    roots = [Path(r).resolve() for r in args.roots.split(",")]
    if args.mirror:
        os.environ.update(DATABASE_URL=DATABASE_URL, DJANGO_SETTINGS_MODULE="bench_settings",
                          PYTHONPATH=f"{HERE}:{roots[0]}")
        prepare_database(DATABASE_URL, roots[0])
        for root in roots[1:]:  # (each root's migrations: a newer root's mirror writes its columns)
            subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=root, check=True,
                           env=dict(os.environ, PYTHONPATH=f"{HERE}:{root}"))
    if args.latency:
        if args.handler == "anoop":
            args.handler = "astamp"
        latency(args, roots)
    else:
        throughput(args, roots)
    json.dumps({})


if __name__ == "__main__":
    main()
