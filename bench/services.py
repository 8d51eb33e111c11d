"""The services a benchmark needs, set up before Django starts.

- `ensure_database()`: DATABASE_URL's PostgreSQL database, created when missing (a
  fresh machine has the server but not the benchmark's database).
- `start_redis()`: REDIS_URL when set, else a throwaway redis-server on a free port.
- `PrivateRedis`: a redis-server of the benchmark's own that can be restarted empty.
- `create_database()`: a fresh database next to DATABASE_URL's (PostgreSQL, the local
  one when DATABASE_URL is not set) or a temporary SQLite file, with its dropper.
- `QuietHandler`: the base of a benchmark's downstream site on 127.0.0.1.
- `SlowPages`: such a site whose every page answers after a given time, counting fetches.
- `SessionProcess`: a process of the stack under test in its own session, logging to a
  file, with the memory and CPU of its whole session (main process and children).
- `wait_until()`: poll a predicate until it holds or a bound passes.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Collection
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import redis

from config import devservices

ROOT = Path(__file__).resolve().parent.parent

LOCAL_POSTGRES = "postgres://postgres@127.0.0.1:5432/postgres"


def _server_connection(url: str):
    """An autocommit connection to the `postgres` database of `url`'s server."""
    return psycopg.connect(urlunsplit(urlsplit(url)._replace(path="/postgres")), autocommit=True)


def ensure_database(url: str | None = None) -> None:
    """Create DATABASE_URL's PostgreSQL database when it does not exist yet."""
    url = url or os.environ.get("DATABASE_URL", "")
    name = urlsplit(url).path.lstrip("/")
    if not url.startswith(("postgres://", "postgresql://")) or not name:
        return
    with _server_connection(url) as connection:
        exists = connection.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name])
        if not exists.fetchone():
            connection.execute(f'CREATE DATABASE "{name}"')
            print(f"created database {name}")


def folder_until_exit(prefix: str) -> Path:
    """A new temporary folder, removed when the bench exits (after it has stopped the
    servers that wrote there; a persistent server's file is kept across its restarts)."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def start_redis():
    """(process or None, url): REDIS_URL if set, else a redis-server of our own."""
    url = os.environ.get("REDIS_URL")
    if url:
        return None, url
    port = devservices.free_port()
    process = devservices.start_redis(port, folder_until_exit("plumb-bench-redis-"))
    return process, f"redis://127.0.0.1:{port}/0"


class PrivateRedis:
    """A redis-server on a free port, never persisted: `restart_empty()` stops it and starts
    it again with nothing in it, as a Redis that lost its data (a crash, a new host) does.
    `persistent=True`: an append-only file written at every command, so a stop (SIGTERM,
    which is SHUTDOWN) and a start keep every write.

    A broker set-up for the soak: `stack_env()` is what the stack's processes are given to
    reach it (a Sentinel set-up gives its own; bench/soak.py `--sentinel`).
    """

    def __init__(self, *, persistent: bool = False):
        self.port = devservices.free_port()
        self.data_dir = folder_until_exit("plumb-bench-redis-")
        self.process: subprocess.Popen | None = None
        self.extra_args = ("--appendonly", "yes", "--appendfsync", "always") if persistent else ()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stack_env(self) -> dict[str, str]:
        return {"REDIS_URL": self.url}

    def pids(self) -> dict[str, int]:
        return {"redis-server": self.process.pid} if self.process else {}

    def start(self) -> PrivateRedis:
        self.process = devservices.start_redis(self.port, self.data_dir, extra_args=self.extra_args)
        return self

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)
            self.process = None

    def restart_empty(self, down_seconds: float) -> None:
        self.stop()
        time.sleep(down_seconds)
        self.start()


class SentinelRedis:
    """The soak's broker behind Sentinel (`bench/soak.py --sentinel`): a primary, a replica
    and three sentinels on 127.0.0.1 (config.devservices.SentinelGroup), with the same
    faults as PrivateRedis plus a failover."""

    def __init__(self):
        self.group = devservices.SentinelGroup(folder_until_exit("plumb-bench-sentinel-"))

    def stack_env(self) -> dict[str, str]:
        return self.group.env()

    def pids(self) -> dict[str, int]:
        return {
            f"redis-server:{port}": process.pid
            for port, process in self.group.processes.items()
            if process.poll() is None
        }

    def start(self) -> SentinelRedis:
        self.group.start()
        return self

    def stop(self) -> None:
        for process in self.group.processes.values():
            if process.poll() is None:
                process.terminate()
                process.wait(timeout=10)

    def restart_empty(self, down_seconds: float) -> None:
        """Every server of the group goes away and comes back empty (no persistence)."""
        self.stop()
        time.sleep(down_seconds)
        self.start()

    def fail_over(self) -> None:
        """The master dies (SIGKILL); the sentinels promote the replica; the old master
        comes back as a replica, so the next round can fail over again."""
        self.group.failover(kill=True)
        self.group.restart_killed()


def create_database(*, sqlite_fallback: bool = True):
    """(url, drop): a new, empty database; call `drop()` when done."""
    url = os.environ.get("DATABASE_URL")
    if url is None and devservices.postgres_answers(LOCAL_POSTGRES):
        url = LOCAL_POSTGRES
    if url is None or not url.startswith(("postgres://", "postgresql://")):
        if not sqlite_fallback:
            raise SystemExit("this benchmark needs PostgreSQL: set DATABASE_URL=postgres://...")
        folder = Path(tempfile.mkdtemp(prefix="plumb-bench-db-"))
        drop = partial(shutil.rmtree, folder, ignore_errors=True)
        return f"sqlite:///{folder / 'bench.sqlite3'}", drop

    name = f"plumb_bench_{uuid.uuid4().hex[:8]}"
    with _server_connection(url) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')

    def drop():
        with _server_connection(url) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    return urlunsplit(urlsplit(url)._replace(path=f"/{name}")), drop


class QuietHandler(BaseHTTPRequestHandler):
    """A downstream's request handler: no access log, and a client that gave up is no error."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):
        pass

    def send_html(self, status: int, body: bytes) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client timed out first: that is what a slow downstream is for


class SlowPages(ThreadingHTTPServer):
    """A downstream on 127.0.0.1 whose every page (robots.txt too) answers after `seconds`;
    `fetches` counts the requests per path."""

    daemon_threads = True
    request_queue_size = 1024

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.fetches: Counter[str] = Counter()
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", devservices.free_port()), _SlowPageHandler)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def handle_error(self, request, client_address):
        # A client that dropped its kept-alive connection (a worker cut off mid-run) is no error.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _SlowPageHandler(QuietHandler):
    def do_GET(self):
        with self.server.lock:
            self.server.fetches[self.path] += 1
        time.sleep(self.server.seconds)
        self.send_html(200, b"<html><head><title>A page</title></head><body>ok</body></html>")


class Interrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM: the run ends through every `finally`, so nothing is left behind."""

    def __init__(self, signum: int):
        super().__init__(f"signal {signum}")
        self.signum = signum


def stop_on_signals() -> None:
    """SIGINT and SIGTERM raise Interrupted, once: a second signal does not cut the cleanup
    the first one started short."""

    def handler(signum, frame):
        for each in (signal.SIGINT, signal.SIGTERM):
            signal.signal(each, signal.SIG_IGN)
        raise Interrupted(signum)

    for each in (signal.SIGINT, signal.SIGTERM):
        signal.signal(each, handler)


def wait_until(predicate, timeout: float, what: str, *, fail: bool = True) -> bool:
    """Poll `predicate` every half second until it holds (True) or `timeout` passes:
    SystemExit then, or False with `fail=False`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.5)
    if fail:
        raise SystemExit(f"timed out after {timeout:g} s waiting for {what}")
    return False


def rss_kib(pid: int) -> int:
    """Resident memory of one process, 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _stat_fields(path: str) -> list[str] | None:
    """The fields of a `/proc/.../stat` file after the command's name (field 3 on: state,
    parent, ..., utime at [11], stime [12], reaped children's [13] and [14]); None once the
    process is gone."""
    try:
        with open(path) as stat:
            return stat.read().rpartition(")")[2].split()
    except OSError:
        return None


def cpu_seconds(pids: list[int]) -> float:
    """CPU time (user + system) of the processes, those still alive."""
    ticks = 0
    for pid in pids:
        fields = _stat_fields(f"/proc/{pid}/stat")
        if fields is not None:
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def thread_cpu_seconds(pid: int, tid: int) -> float:
    """CPU time (user + system) of one thread of a live process; 0 once it is gone."""
    fields = _stat_fields(f"/proc/{pid}/task/{tid}/stat")
    if fields is None:
        return 0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def family_cpu_seconds(pid: int, *, leaving_out: Collection[int] = ()) -> float:
    """CPU time (user + system) of a process and every process under it, live or reaped (a
    reaped one's is counted in its parent's: a PostgreSQL backend that exited in its
    postmaster's, a killed tree builder in its fork server's), but for the live families
    of `leaving_out`."""
    fields = _stat_fields(f"/proc/{pid}/stat")
    own = 0 if fields is None else sum(int(value) for value in fields[11:15])
    return own / os.sysconf("SC_CLK_TCK") + sum(
        family_cpu_seconds(child, leaving_out=leaving_out)
        for child in children_of(pid)
        if child not in leaving_out
    )


def children_of(pid: int) -> list[int]:
    """The live processes whose parent is `pid`."""
    children = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat_fields(f"/proc/{entry}/stat")
            if fields is not None and int(fields[1]) == pid:
                children.append(int(entry))
    return children


def redis_server_pid(url: str) -> int:
    """The process id of the Redis server at `url` (INFO server)."""
    return int(redis.Redis.from_url(url).info("server")["process_id"])


def postgres_server_pid(url: str) -> int | None:
    """The process id of the postmaster of the PostgreSQL server at `url`: the parent of
    the backend that answers, read on this machine (None when no process has its id)."""
    with psycopg.connect(url) as connection:
        (backend,) = connection.execute("SELECT pg_backend_pid()").fetchone()
        fields = _stat_fields(f"/proc/{backend}/stat")
    return None if fields is None else int(fields[1])


def pids_named(name: str) -> list[int]:
    """Every process whose command name is `name` (`postgres`: the server and its backends)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/comm") as comm:
                    if comm.read().strip() == name:
                        found.append(int(entry))
            except OSError:
                continue
    return found


def machine_busy_seconds() -> float:
    """CPU-seconds the whole machine has spent busy (every core, every process) since boot."""
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle and iowait
    return (sum(fields) - idle) / os.sysconf("SC_CLK_TCK")


class SessionProcess:
    """A process in its own session, so a signal to it reaches its children (a worker's
    pool, gunicorn's workers), logging to `logs`/`name`.log. `start()` again after a
    kill, as a supervisor would."""

    def __init__(
        self, name: str, command: list[str] | str, env: dict, logs: Path, cwd: Path = ROOT
    ):
        self.name, self.env, self.logs, self.cwd = name, env, logs, cwd
        self.argv = shlex.split(command) if isinstance(command, str) else command
        self.popen: subprocess.Popen | None = None

    def start(self) -> SessionProcess:
        with (self.logs / f"{self.name}.log").open("a") as log:
            self.popen = subprocess.Popen(
                self.argv, cwd=self.cwd, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        return self

    def pids(self) -> list[int]:
        """Every live process of this one's session, and every process under one of them
        in a session of its own (an audits worker's tree builders: config.tree_children)."""
        parents, found = {}, []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                fields = _stat_fields(f"/proc/{entry}/stat")
                try:
                    session = os.getsid(int(entry))
                except OSError:
                    continue
                if fields is not None:
                    parents.setdefault(int(fields[1]), []).append(int(entry))
                if session == self.popen.pid:
                    found.append(int(entry))
        seen, stack = set(found), list(found)
        while stack:
            for child in parents.get(stack.pop(), []):
                if child not in seen:
                    seen.add(child)
                    stack.append(child)
        return sorted(seen)

    def rss_bytes(self) -> int:
        return sum(rss_kib(pid) for pid in self.pids()) * 1024

    def cpu_seconds(self) -> float:
        """CPU time (user + system) of every live process of the session (`pids`)."""
        return cpu_seconds(self.pids())

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait()

    def stop(self) -> None:
        try:
            os.killpg(self.popen.pid, signal.SIGTERM)
            self.popen.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.kill()
        except ProcessLookupError:
            pass
