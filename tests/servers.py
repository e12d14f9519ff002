"""Real servers for the tests: valkey-server processes (standalone and cluster) on loopback."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

from jobqueue.embedded import free_port, server_args, wait_until_up


def server_ms(client: Any) -> int:
    """The server's clock, in ms: the one the scripts read (lease deadlines, due times)."""
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def wait_past(client: Any, *zsets: str) -> None:
    """Until the server clock passes the last score in the sorted sets (lease deadlines, due
    times): the scripts read that clock."""
    from .workers import wait_for

    last = max((score for key in zsets for _, score in client.zrange(key, 0, -1, withscores=True)),
               default=0)
    wait_for(lambda: server_ms(client) > last, every=0.01)


def flush_all(client: Any) -> None:
    """Empty every key of a standalone server, or of every primary of a cluster."""
    if isinstance(client, redis.RedisCluster):
        client.flushall(target_nodes=redis.RedisCluster.PRIMARIES)
    else:
        client.flushall()


def ping_until_up(client: redis.Redis, timeout: float = 10.0) -> None:
    """PING through `client` until it answers (ConnectionError after `timeout` s), then close it."""
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                client.ping()
                return
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
    finally:
        client.close()


class ValkeyProcess:
    """One valkey-server child process that a test may stop, kill and start again."""

    def __init__(self, *extra: str, port: int | None = None, appendonly: bool = True) -> None:
        self.port = port or free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="jq-valkey-"))
        self.extra = [*extra, "--appendonly", "yes" if appendonly else "no",
                      "--appendfsync", "always" if appendonly else "no"]
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> ValkeyProcess:
        with open(self.dir / "valkey.log", "ab") as log:
            self.proc = subprocess.Popen(server_args(self.port, self.dir, *self.extra),
                                         stdout=log, stderr=subprocess.STDOUT)
        try:
            self._wait_until_up()
        except Exception:
            self.stop(kill=True)  # a server that never answered is not left behind
            raise
        return self

    def _wait_until_up(self) -> None:
        if "--requirepass" in self.extra:  # PING wants the password: ask with it
            password = self.extra[self.extra.index("--requirepass") + 1]
            ping_until_up(redis.Redis(port=self.port, password=password))
        else:
            wait_until_up(self.port)

    def stop(self, kill: bool = False) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill() if kill else self.proc.terminate()
            self.proc.wait(10)

    def cleanup(self) -> None:
        self.stop(kill=True)
        shutil.rmtree(self.dir, ignore_errors=True)


class ValkeyCluster:
    """`size` primaries in cluster mode, each with `replicas` replicas; each node's bus on a free
    port of its own. `kill_primary` SIGKILLs a primary so that its replica takes over."""

    def __init__(self, size: int = 3, replicas: int = 0, node_timeout_ms: int = 2000,
                 appendonly: bool = False) -> None:
        self.size = size
        count = size * (1 + replicas)
        ports: list[int] = []
        while len(ports) < 2 * count:  # a client port and a bus port per node, all distinct
            if (port := free_port()) not in ports:
                ports.append(port)
        self.nodes = [ValkeyProcess("--cluster-enabled", "yes", "--cluster-port", str(ports[2 * i + 1]),
                                    "--cluster-node-timeout", str(node_timeout_ms),
                                    "--repl-diskless-sync-delay", "0", port=ports[2 * i],
                                    appendonly=appendonly)
                      for i in range(count)]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.nodes[0].port}/0?cluster=true"

    def start(self) -> ValkeyCluster:
        for node in self.nodes:
            node.extra += ["--cluster-config-file", str(node.dir / "nodes.conf")]
            node.start()
        clients = [redis.Redis(port=n.port, decode_responses=True) for n in self.nodes]
        share = 16384 // self.size
        for i, client in enumerate(clients[: self.size]):
            last = 16383 if i == self.size - 1 else (i + 1) * share - 1
            client.execute_command("CLUSTER", "ADDSLOTSRANGE", i * share, last)
        first = self.nodes[0]
        bus = first.extra[first.extra.index("--cluster-port") + 1]
        for client in clients[1:]:
            client.execute_command("CLUSTER", "MEET", "127.0.0.1", first.port, bus)
        self._until(lambda: all(self._ok(c, len(clients)) for c in clients), "converge")
        for i, client in enumerate(clients[self.size :]):  # replica i follows primary i mod size
            primary = clients[i % self.size].execute_command("CLUSTER", "MYID")
            self._until(lambda c=client, p=primary: self._knows(c, p), "gossip")
            client.execute_command("CLUSTER", "REPLICATE", primary)
        for client in clients[self.size :]:
            self._until(lambda c=client: c.info("replication").get("master_link_status") == "up",
                        "replicate")
        for client in clients:
            client.close()
        return self

    @staticmethod
    def _until(condition: Any, what: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise RuntimeError(f"Valkey cluster did not {what}")
            time.sleep(0.1)

    @staticmethod
    def _ok(client: redis.Redis, size: int) -> bool:
        info = client.execute_command("CLUSTER", "INFO")
        text = info if isinstance(info, str) else info.decode()
        return "cluster_state:ok" in text and f"cluster_known_nodes:{size}" in text

    @staticmethod
    def _knows(client: redis.Redis, node_id: str) -> bool:
        return node_id in str(client.execute_command("CLUSTER", "NODES"))

    def kill_primary(self, index: int) -> ValkeyProcess:
        """SIGKILL primary `index` and wait until a replica serves its slots."""
        victim, heir = self.nodes[index], self.nodes[self.size + index]
        victim.stop(kill=True)
        client = redis.Redis(port=heir.port, decode_responses=True)
        try:
            self._until(lambda: client.info("replication")["role"] == "master"
                        and self._ok(client, len(self.nodes)), "fail over")
        finally:
            client.close()
        return victim

    def cleanup(self) -> None:
        for node in self.nodes:
            node.cleanup()


class MariaDBProcess:
    """A private mariadbd with its own datadir and port, that a test may stop and start.

    Never the machine's server: outage tests stop this one. Grant tables are skipped: it only
    listens on loopback and lives for one test.
    """

    def __init__(self) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="jq-mariadb-"))
        subprocess.run(["mariadb-install-db", "--no-defaults", f"--datadir={self.dir / 'data'}",
                        "--user=root"], check=True, capture_output=True)
        self.proc: subprocess.Popen[bytes] | None = None

    def url(self, database: str) -> str:
        return f"mysql://root@127.0.0.1:{self.port}/{database}"

    def start(self) -> MariaDBProcess:
        with open(self.dir / "mariadb.log", "ab") as log:
            self.proc = subprocess.Popen(
                ["mariadbd", "--no-defaults", f"--datadir={self.dir / 'data'}", "--user=root",
                 f"--port={self.port}", "--bind-address=127.0.0.1", f"--socket={self.dir / 'sock'}",
                 "--skip-grant-tables", "--innodb-buffer-pool-size=32M", "--skip-log-bin"],
                stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not self._answers():
            if time.monotonic() > deadline:
                raise RuntimeError(f"private mariadbd did not start: see {self.dir / 'mariadb.log'}")
            time.sleep(0.1)
        return self

    def _answers(self) -> bool:
        import MySQLdb

        try:
            MySQLdb.connect(host="127.0.0.1", port=self.port, user="root").close()
            return True
        except MySQLdb.OperationalError:
            return False

    def query(self, sql: str, database: str | None = None) -> tuple:
        import MySQLdb

        conn = MySQLdb.connect(host="127.0.0.1", port=self.port, user="root",
                               **({"database": database} if database else {}))
        try:
            cursor = conn.cursor()
            cursor.execute(sql)
            conn.commit()
            return tuple(cursor.fetchall())
        finally:
            conn.close()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)

    def cleanup(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


class TLSProxy:
    """Debian's stunnel in front of a Valkey (the bundled valkey-server has no TLS): a
    self-signed certificate for 127.0.0.1, `ca` is the file a client must trust."""

    def __init__(self, target_port: int) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="jq-tls-"))
        self.ca = self.dir / "cert.pem"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                        "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                        "-keyout", str(self.dir / "key.pem"), "-out", str(self.ca)],
                       check=True, capture_output=True)
        (self.dir / "stunnel.conf").write_text(
            f"foreground = yes\npid =\n[valkey]\naccept = 127.0.0.1:{self.port}\n"
            f"connect = 127.0.0.1:{target_port}\ncert = {self.ca}\nkey = {self.dir / 'key.pem'}\n")
        self.proc: subprocess.Popen[bytes] | None = None

    def url(self, **query: str) -> str:
        args = "&".join(f"{k}={v}" for k, v in query.items())
        return f"rediss://127.0.0.1:{self.port}/0" + (f"?{args}" if args else "")

    def start(self) -> TLSProxy:
        with open(self.dir / "stunnel.log", "ab") as log:
            self.proc = subprocess.Popen([shutil.which("stunnel4") or "stunnel",
                                          str(self.dir / "stunnel.conf")],
                                         stdout=log, stderr=subprocess.STDOUT)
        try:
            ping_until_up(redis.Redis.from_url(self.url(ssl_ca_certs=str(self.ca))))
        except redis.ConnectionError:
            self.cleanup()
            raise
        return self

    def cleanup(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)
