"""A private PostgreSQL primary and streaming replica on 127.0.0.1, for fault tests and the soak.

    cluster = PgCluster().start()          # a primary, and a replica made by `pg_basebackup -R`
    cluster.database_url("plumb")          # postgres://postgres@127.0.0.1:P1,127.0.0.1:P2/plumb?target_session_attrs=read-write
    cluster.primary.restart()              # a restart (pg_ctl restart -m fast)
    cluster.fail_over()                    # the primary dies (-m immediate), the replica is promoted
    cluster.close()                        # every server stopped, the data removed

The servers run as the `postgres` OS user (PostgreSQL refuses root): when this runs as
root, through `runuser -u postgres`. Data directories and unix sockets live in one
temporary directory owned by that user; ports are free ones. The binaries are
PostgreSQL 15's (`PG_BIN`), the version the machines and CI install.

The replica is synchronous (`synchronous_standby_names='*'` on the primary): a commit
returns once the replica has flushed it, so a promotion after the primary dies has
every transaction a client saw commit. With asynchronous streaming, the last commits
before the crash may not have reached the replica yet, and an audit accepted with 202
would be missing after the promotion (docs/operations.md, "PostgreSQL failover").
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

from config import devservices

PG_BIN = Path("/usr/lib/postgresql/15/bin")
OS_USER = "postgres"


def _as_postgres(argv: list[str], *, check: bool = True) -> subprocess.CompletedProcess:
    if os.geteuid() == 0:
        argv = ["runuser", "-u", OS_USER, "--", *argv]
    return subprocess.run(argv, check=check, capture_output=True, text=True)


class PgServer:
    """One server: its data directory, port and log; started and stopped with pg_ctl."""

    def __init__(self, name: str, root: Path, *, extra_settings: dict[str, str] | None = None):
        self.name, self.root = name, root
        self.data_dir = root / name
        self.log = root / f"{name}.log"
        self.port = devservices.free_port()
        # Given on the command line, not in postgresql.conf: pg_basebackup copies that
        # file, and a promoted replica must not wait for a standby of its own.
        self.extra_settings = dict(extra_settings or {})

    def _options(self) -> str:
        settings = {
            "port": str(self.port),
            "listen_addresses": "127.0.0.1",
            "unix_socket_directories": str(self.root),
            **self.extra_settings,
        }
        return " ".join(f"-c {key}={value}" for key, value in settings.items())

    def start(self, timeout: int = 60) -> PgServer:
        _as_postgres([str(PG_BIN / "pg_ctl"), "start", "-D", str(self.data_dir), "-l", str(self.log),
                      "-w", "-t", str(timeout), "-o", self._options()])  # fmt: skip
        return self

    def stop(self, mode: str = "fast") -> None:
        """`fast`: a clean shutdown; `immediate`: as if the process died (crash recovery next)."""
        _as_postgres([str(PG_BIN / "pg_ctl"), "stop", "-D", str(self.data_dir), "-m", mode, "-w"])

    def restart(self, timeout: int = 60) -> None:
        _as_postgres([str(PG_BIN / "pg_ctl"), "restart", "-D", str(self.data_dir), "-m", "fast",
                      "-l", str(self.log), "-w", "-t", str(timeout), "-o", self._options()])  # fmt: skip

    def promote(self) -> None:
        _as_postgres([str(PG_BIN / "pg_ctl"), "promote", "-D", str(self.data_dir), "-w"])

    def running(self) -> bool:
        status = _as_postgres(
            [str(PG_BIN / "pg_ctl"), "status", "-D", str(self.data_dir)], check=False
        )
        return status.returncode == 0

    def url(self, dbname: str = "postgres") -> str:
        return f"postgres://{OS_USER}@127.0.0.1:{self.port}/{dbname}"

    def connect(self, dbname: str = "postgres") -> psycopg.Connection:
        return psycopg.connect(self.url(dbname), autocommit=True, connect_timeout=5)


class PgCluster:
    """A primary and one synchronous streaming replica (or the primary alone: `replica=False`)."""

    def __init__(self, *, replica: bool = True):
        self.with_replica = replica
        self.root = Path(tempfile.mkdtemp(prefix="plumb-pgcluster-"))
        if os.geteuid() == 0:
            account = pwd.getpwnam(OS_USER)
            os.chown(self.root, account.pw_uid, account.pw_gid)
        # Small: two servers share a 2-core machine with the stack under test.
        tuning = {"shared_buffers": "32MB", "max_connections": "200", "fsync": "on"}
        sync = {"synchronous_standby_names": "'*'"} if replica else {}
        self.primary = PgServer("primary", self.root, extra_settings={**tuning, **sync})
        self.replica = PgServer("replica", self.root, extra_settings=tuning) if replica else None
        self.servers = [server for server in (self.primary, self.replica) if server]

    def start(self) -> PgCluster:
        """Initialise and start the primary (and its replica, in sync); a cluster that does
        not get there is closed before raising (its caller has nothing to close)."""
        try:
            return self._start()
        except BaseException:
            self.close()
            raise

    def _start(self) -> PgCluster:
        _as_postgres([str(PG_BIN / "initdb"), "-D", str(self.primary.data_dir), "-U", OS_USER,
                      "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync"])  # fmt: skip
        self.primary.start()
        if self.replica is not None:
            # -R writes primary_conninfo and standby.signal: the copy starts as a streaming replica.
            _as_postgres([str(PG_BIN / "pg_basebackup"), "-h", "127.0.0.1", "-p", str(self.primary.port),
                          "-U", OS_USER, "-D", str(self.replica.data_dir), "-R", "-X", "stream",
                          "-c", "fast", "--no-sync"])  # fmt: skip
            self.replica.start()
            self.wait_for_sync_replica()
        return self

    def wait_for_sync_replica(self, timeout: float = 60.0) -> None:
        """Until the primary reports its replica streaming synchronously."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.primary.connect() as connection:
                row = connection.execute(
                    "SELECT 1 FROM pg_stat_replication WHERE state = 'streaming' AND sync_state = 'sync'"
                ).fetchone()
            if row:
                return
            time.sleep(0.2)
        raise RuntimeError(f"the replica did not stream within {timeout:g} s; see {self.root}")

    def create_database(self, name: str) -> None:
        with self.primary.connect() as connection:
            connection.execute(f'CREATE DATABASE "{name}"')

    def database_url(self, dbname: str) -> str:
        """A libpq multi-host URL: whichever server accepts writes, the primary or the promoted replica."""
        hosts = ",".join(f"127.0.0.1:{server.port}" for server in self.servers)
        return f"postgres://{OS_USER}@{hosts}/{dbname}?target_session_attrs=read-write"

    def fail_over(self) -> None:
        """The primary dies (no clean shutdown) and the replica is promoted in its place."""
        self.primary.stop("immediate")
        self.replica.promote()

    def close(self) -> None:
        for server in self.servers:
            if server.data_dir.exists() and server.running():
                with contextlib.suppress(subprocess.CalledProcessError):
                    server.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)
