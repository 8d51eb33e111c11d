#!/usr/bin/env python
"""What do stalled request bodies cost the web process `make run` starts?

    .venv/bin/python bench/stalled_bodies.py [--clients 500] [--hold 15] [--declared 1040000]

It starts the web exactly as `make run` does (`runstack.web_command`, `WEB_CONCURRENCY`
workers, `DEBUG=false`) on a free port of 127.0.0.1, against a private Redis and a migrated
SQLite file. Then, per scenario, it opens `--clients` sockets that each declare a
`POST /api/audits` body, send most of it, and stall:

- "the finding": the security review's, 1,039,000 bytes of a declared 1,040,000
  (`--declared`);
- "at the cap": the worst a client can still do, a body of exactly `API_MAX_BODY_BYTES`
  (the web's cap) declared, all but one byte of it sent.

It samples the web workers' RSS (summed over the workers) before, every 50 ms from the
first socket to the last one's close (the peak, and the median while they stall), and 5 s
after the client closed every socket; `--rounds` repeats the scenarios, so memory that is never
given back shows as growth from one round to the next. While the sockets stall it sends a
`GET /healthz` and a `POST /api/audits` every 0.5 s (each on a new connection), counting
those that answered within 1 s. For each stalled socket it records when the server answered
it (its status) or closed it. It raises its own file-descriptor limit (RLIMIT_NOFILE,
inherited by the server) to what `--clients` needs. Only loopback traffic; every loop is
bounded by `--hold`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import selectors
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx2
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
os.environ.setdefault("DEBUG", "true")

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402

from config.devservices import free_port, start_redis  # noqa: E402
from devstack.management.commands.runstack import web_command  # noqa: E402

SUBMISSION = b'{"url": "https://example.org/"}'


def raise_fd_limit(clients: int) -> int:
    """The bench holds `clients` sockets and the server as many again: raise the soft limit
    (the server inherits it) or stop with what to do."""
    needed = 2 * clients + 512
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            raise SystemExit(
                f"{clients} clients need {needed} file descriptors; the hard limit is {hard}"
            )
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
    return max(soft, needed)


def worker_rss(master: psutil.Process) -> list[int]:
    """RSS in bytes of each web worker (the gunicorn master's children)."""
    sizes = []
    for worker in master.children():
        with contextlib.suppress(psutil.NoSuchProcess):  # a worker restarting
            sizes.append(worker.memory_info().rss)
    return sizes


def mib(size: float) -> str:
    return f"{size / 2**20:.0f} MiB"


class Stalled:
    """One socket that sends a request's headers and most of its declared body, then stalls."""

    def __init__(self, port: int, declared: int, sent: int):
        self.port, self.declared, self.sent = port, declared, sent
        self.sock: socket.socket | None = None
        self.refused_while_sending = False
        self.answer = b""
        self.ended_after: float | None = None  # seconds after the stall began

    def open(self) -> None:
        headers = (
            f"POST /api/audits HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {self.declared}\r\n\r\n"
        ).encode()
        try:
            self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=10)
            self.sock.sendall(headers)
            self.sock.sendall(b"x" * self.sent)
        except OSError:
            # The server answered and closed before taking the whole part: a refusal.
            self.refused_while_sending = True
        if self.sock is not None:
            self.sock.setblocking(False)

    def status(self) -> str:
        if self.answer.startswith(b"HTTP/1.1 "):
            return self.answer[9:12].decode()
        return "closed" if self.ended_after is not None else "open"

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()


def watch(stalled: list[Stalled], started: float, stop: threading.Event) -> None:
    """Record when the server answers or closes each stalled socket."""
    selector = selectors.DefaultSelector()
    for client in stalled:
        if client.sock is not None:
            selector.register(client.sock, selectors.EVENT_READ, client)
    while not stop.is_set() and selector.get_map():
        for key, _ in selector.select(timeout=0.1):
            client = key.data
            try:
                chunk = client.sock.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                chunk = b""
            client.answer += chunk
            if not chunk:
                client.ended_after = time.monotonic() - started
                selector.unregister(client.sock)
            elif client.ended_after is None and b"\r\n\r\n" in client.answer:
                client.ended_after = time.monotonic() - started
    selector.close()


def probe(base: str) -> tuple[float | None, float | None]:
    """Seconds a /healthz and a submission took (None: failed or over 5 s)."""
    results = []
    for method, path, body in (("GET", "/healthz", None), ("POST", "/api/audits", SUBMISSION)):
        started = time.monotonic()
        try:
            response = httpx2.request(
                method, base + path, content=body, timeout=5,
                headers={"Content-Type": "application/json"} if body else None,
            )  # fmt: skip
            ok = response.status_code == (200 if method == "GET" else 202)
        except httpx2.HTTPError:
            ok = False
        results.append(time.monotonic() - started if ok else None)
    return results[0], results[1]


class RssSamples(threading.Thread):
    """The workers' RSS summed, every 50 ms, by phase ("sending", then "stalled")."""

    def __init__(self, master: psutil.Process):
        super().__init__(daemon=True)
        self.master, self.stop = master, threading.Event()
        self.phase, self.samples = "sending", {"sending": [], "stalled": []}

    def run(self) -> None:
        while not self.stop.wait(0.05):
            self.samples[self.phase].append(sum(worker_rss(self.master)))


def scenario(name: str, base: str, port: int, master: psutil.Process, args, declared: int,
             sent: int) -> None:  # fmt: skip
    time.sleep(2)
    before = worker_rss(master)
    sampler = RssSamples(master)
    sampler.start()
    stalled = [Stalled(port, declared, sent) for _ in range(args.clients)]
    with ThreadPoolExecutor(max_workers=32) as pool:
        list(pool.map(Stalled.open, stalled))
    sampler.phase = "stalled"
    started = time.monotonic()
    stop = threading.Event()
    watcher = threading.Thread(target=watch, args=(stalled, started, stop), daemon=True)
    watcher.start()
    probes: list[tuple[float | None, float | None]] = []
    while time.monotonic() - started < args.hold:
        probes.append(probe(base))
        time.sleep(0.5)
    stop.set()
    watcher.join(timeout=5)
    for client in stalled:
        client.close()
    sampler.stop.set()
    sampler.join()
    time.sleep(5)
    after = worker_rss(master)

    def within(values):
        return sum(1 for v in values if v is not None and v <= 1.0)

    healthz = [p[0] for p in probes]
    submissions = [p[1] for p in probes]
    statuses: dict[str, int] = {}
    for client in stalled:
        key = "refused while sending" if client.refused_while_sending else client.status()
        statuses[key] = statuses.get(key, 0) + 1
    ended = sorted(c.ended_after for c in stalled if c.ended_after is not None)
    print(f"\n{name}: {args.clients} sockets, {sent:,} bytes sent of {declared:,} declared, "
          f"held {args.hold:.0f} s")  # fmt: skip
    peak = max(sampler.samples["sending"] + sampler.samples["stalled"])
    held = statistics.median(sampler.samples["stalled"])
    print(f"  web workers' RSS  before {mib(sum(before))}  peak {mib(peak)}"
          f"  median while stalled {mib(held)}  5 s after close {mib(sum(after))}"
          f"  (largest worker: before {mib(max(before))}, after {mib(max(after))})")  # fmt: skip
    print(f"  stalled sockets by outcome: {statuses}"
          + (f"; the server ended them {ended[0]:.1f}-{ended[-1]:.1f} s after the last was opened"
             if ended else ""))  # fmt: skip
    print(
        f"  while they stalled: /healthz within 1 s {within(healthz)}/{len(probes)}"
        f" (slowest {max((v for v in healthz if v), default=float('nan')):.2f} s),"
        f" submissions (202) within 1 s {within(submissions)}/{len(probes)}"
        f" (slowest {max((v for v in submissions if v), default=float('nan')):.2f} s)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--clients", type=int, default=500)
    parser.add_argument("--hold", type=float, default=15.0, help="seconds the sockets stall")
    parser.add_argument("--declared", type=int, default=1_040_000)
    parser.add_argument("--scenario", action="append", help="only these (names as printed)")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each scenario, in turn")
    args = parser.parse_args()
    limit = raise_fd_limit(args.clients)
    with tempfile.TemporaryDirectory() as tmp:
        redis_port = free_port()
        redis = start_redis(redis_port, Path(tmp) / "redis")
        env = {
            **os.environ,
            "DEBUG": "false",
            "SECRET_KEY": "bench-" + "k" * 60,
            "DATABASE_URL": f"sqlite:///{tmp}/bench.sqlite3",
            "REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
            "PLUMB_VAR_DIR": tmp,
            # The probes submit every 0.5 s from one address: not what this measures.
            "AUDIT_SUBMIT_BURST": "10000",
        }
        subprocess.run([sys.executable, "manage.py", "migrate", "--verbosity", "0"], cwd=ROOT,
                       env=env, check=True)  # fmt: skip
        port = free_port()
        command = web_command("127.0.0.1", port, workers=settings.WEB_CONCURRENCY)
        server = subprocess.Popen(
            command.split(), cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while probe(base)[0] is None:
                if time.monotonic() > deadline:
                    raise SystemExit("the web never answered /healthz")
                time.sleep(0.3)
            for _ in range(20):
                probe(base)  # warm: each worker has served both paths
            master = psutil.Process(server.pid)
            cap = settings.API_MAX_BODY_BYTES
            # None with config/ of a commit before the deadline (how main was measured).
            body_timeout = getattr(settings, "WEB_BODY_READ_TIMEOUT_SECONDS", None)
            print(f"web: {settings.WEB_CONCURRENCY} workers, API_MAX_BODY_BYTES {cap:,},"
                  f" WEB_BODY_READ_TIMEOUT_SECONDS {body_timeout}, file descriptors {limit}")  # fmt: skip
            scenarios = {
                "the finding": (args.declared, args.declared - 1000),
                "at the cap": (cap, cap - 1),
            }
            for round_ in range(1, args.rounds + 1):
                for name, (declared, sent) in scenarios.items():
                    if not args.scenario or any(wanted in name for wanted in args.scenario):
                        label = f"{name} (round {round_})" if args.rounds > 1 else name
                        scenario(label, base, port, master, args, declared, sent)
        finally:
            server.terminate()
            server.wait(timeout=30)
            redis.terminate()
            redis.wait(timeout=10)


if __name__ == "__main__":
    main()
