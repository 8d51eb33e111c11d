#!/usr/bin/env python
"""Does /healthz still answer while clients trickle request headers at the web server?

    .venv/bin/python bench/slow_clients.py [--clients 50] [--seconds 20] [--server NAME ...]

For each server command (by default: gunicorn's sync workers as `make run` started them
before, and the command `make run` starts now, `devstack...runstack.web_command`), it
starts the server on a free port of 127.0.0.1 against a private Redis and an SQLite file,
opens `--clients` sockets that each send a request line and then one header byte every
0.5 s (never finishing), and meanwhile GETs /healthz every 0.25 s with a 5 s timeout. It
prints, per server: probes answered within 1 s, the slowest answer, the probes that
timed out, how many trickling sockets the server had closed by the end, and (measured
first, without tricklers) how many /healthz a second 4 back-to-back callers get.
Only loopback traffic; every loop is bounded by --seconds.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
os.environ.setdefault("DEBUG", "true")

import django  # noqa: E402

django.setup()

from config.devservices import free_port, start_redis  # noqa: E402
from devstack.management.commands.runstack import web_command  # noqa: E402

BIN = Path(sys.executable).parent


def servers(port: int) -> dict[str, str]:
    bind = f"127.0.0.1:{port}"
    return {
        "gunicorn sync x2 (before)": (
            f"{BIN / 'gunicorn'} config.wsgi:application --bind {bind} --workers 2"
            " --no-control-socket"
        ),
        "gunicorn gthread x2, 8 threads": (
            f"{BIN / 'gunicorn'} config.wsgi:application --bind {bind} --workers 2"
            " --worker-class gthread --threads 8 --no-control-socket"
        ),
        "make run's web (now)": web_command("127.0.0.1", port, workers=2),
    }


def trickle(port: int, stop: threading.Event, closed: list[int]) -> None:
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    except OSError:
        closed.append(1)
        return
    try:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        while not stop.wait(0.5):
            sock.sendall(b"a")
    except OSError:
        closed.append(1)  # the server closed it: a send fails (reset or broken pipe)
    finally:
        sock.close()


def probe(port: int) -> float | None:
    """Seconds /healthz took to answer in full, or None after 5 s."""
    started = time.monotonic()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.settimeout(max(0.01, 5 - (time.monotonic() - started)))
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
    except OSError:
        return None
    if not answer.startswith(b"HTTP/1.1 200"):
        return None
    return time.monotonic() - started


def wait_until_up(port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if probe(port) is not None:
            return
        time.sleep(0.2)
    raise SystemExit(f"the server on {port} never answered /healthz")


def rate(port: int, seconds: float = 5.0, callers: int = 4) -> float:
    """/healthz answers a second with `callers` clients asking back to back (no trickler)."""
    count = [0] * callers
    deadline = time.monotonic() + seconds

    def caller(n: int) -> None:
        while time.monotonic() < deadline:
            if probe(port) is not None:
                count[n] += 1

    threads = [threading.Thread(target=caller, args=(n,)) for n in range(callers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(count) / seconds


def measure(name: str, command: str, port: int, env: dict, clients: int, seconds: float) -> None:
    server = subprocess.Popen(
        command.split(), cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    stop = threading.Event()
    closed: list[int] = []
    try:
        wait_until_up(port)
        unloaded = rate(port)
        threads = [
            threading.Thread(target=trickle, args=(port, stop, closed), daemon=True)
            for _ in range(clients)
        ]
        for thread in threads:
            thread.start()
        time.sleep(1)  # every trickler connected and sending
        latencies: list[float | None] = []
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            latencies.append(probe(port))
            time.sleep(0.25)
        stop.set()
        for thread in threads:
            thread.join(timeout=5)
    finally:
        server.terminate()
        server.wait(timeout=20)
    answered = [x for x in latencies if x is not None]
    within = sum(1 for x in answered if x <= 1.0)
    print(
        f"{name:28} probes {len(latencies):3}  within 1 s {within:3} ({within / len(latencies):.0%})"
        f"  timed out {len(latencies) - len(answered):3}"
        f"  slowest {max(answered) if answered else float('nan'):.3f} s"
        f"  tricklers closed by the server {len(closed)}/{clients}"
        f"  | no tricklers: {unloaded:.0f} /healthz a second (4 callers)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--server", action="append", help="only these (names as printed)")
    args = parser.parse_args()
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
        }
        try:
            print(f"{args.clients} trickling clients, {args.seconds:.0f} s of probes per server")
            for name, command in servers(0).items():
                if args.server and not any(wanted in name for wanted in args.server):
                    continue
                port = free_port()
                command = servers(port)[name]
                measure(name, command, port, env, args.clients, args.seconds)
        finally:
            redis.terminate()
            redis.wait(timeout=10)


if __name__ == "__main__":
    main()
