"""Runs `make run`'s processes in one terminal and keeps them running.

A process that exits is started again after a backoff (1 s, doubling to
RESTART_BACKOFF_MAX_SECONDS; back to 1 s once it has stayed up STABLE_SECONDS), so a
worker that dies in a Redis or database outage comes back without taking the web
and the other workers down with it (honcho stopped everything when any one exited).
Each line a process prints is prefixed with its name. SIGINT or SIGTERM stops them
all: SIGTERM first, SIGKILL after `stop_timeout` seconds.

DECISIONS.md ("make run restarts what exits") says why this is not supervisord.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TextIO

RESTART_BACKOFF_FIRST_SECONDS = 1.0
RESTART_BACKOFF_MAX_SECONDS = 30.0
# Up this long, a process is healthy again: its next exit restarts after the first backoff.
STABLE_SECONDS = 60.0


def restart_delay(failures: int) -> float:
    """Seconds before the `failures`-th restart in a row (1, 2, 4, ... capped)."""
    return min(RESTART_BACKOFF_MAX_SECONDS, RESTART_BACKOFF_FIRST_SECONDS * 2 ** (failures - 1))


@dataclass
class Program:
    name: str
    command: str
    env: dict | None = None
    process: subprocess.Popen | None = None
    started_at: float = 0.0
    failures: int = 0
    restart_at: float | None = None
    starts: list[float] = field(default_factory=list)


class Supervisor:
    def __init__(
        self,
        out: TextIO = sys.stdout,
        *,
        stop_timeout: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.out = out
        self.stop_timeout = stop_timeout
        self.clock = clock
        self.programs: dict[str, Program] = {}
        self._stopping = threading.Event()
        self._print_lock = threading.Lock()
        self._width = len("supervisor")

    def add(self, name: str, command: str, env: dict | None = None) -> Program:
        program = self.programs[name] = Program(name, command, env)
        self._width = max(self._width, len(name))
        return program

    def say(self, name: str, line: str) -> None:
        with self._print_lock:
            self.out.write(f"{time.strftime('%H:%M:%S')} {name:<{self._width}} | {line}\n")
            self.out.flush()

    def run(self, *, handle_signals: bool = True) -> int:
        """Start every program and keep them running until stop() or a signal."""
        if handle_signals:
            for signum in (signal.SIGINT, signal.SIGTERM):
                signal.signal(signum, lambda signum, frame: self.stop())
        for program in self.programs.values():
            self._start(program)
        while not self._stopping.wait(0.1):
            for program in self.programs.values():
                self._look_after(program)
        self._stop_all()
        return 0

    def stop(self) -> None:
        self._stopping.set()

    def _start(self, program: Program) -> None:
        program.process = subprocess.Popen(
            shlex.split(program.command),
            env=program.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            # Its own process group: a signal to the terminal's group reaches the
            # supervisor, which stops the programs in order.
            start_new_session=True,
        )
        program.started_at = self.clock()
        program.starts.append(program.started_at)
        program.restart_at = None
        self.say("supervisor", f"{program.name} started (pid {program.process.pid})")
        threading.Thread(target=self._relay, args=(program, program.process), daemon=True).start()

    def _relay(self, program: Program, process: subprocess.Popen) -> None:
        for line in process.stdout:
            self.say(program.name, line.rstrip("\n"))

    def _look_after(self, program: Program) -> None:
        now = self.clock()
        if program.restart_at is not None:
            if now >= program.restart_at:
                self._start(program)
            return
        returncode = program.process.poll()
        if returncode is None:
            return
        if now - program.started_at >= STABLE_SECONDS:
            program.failures = 0
        program.failures += 1
        delay = restart_delay(program.failures)
        program.restart_at = now + delay
        self.say(
            "supervisor",
            f"{program.name} exited (rc={returncode}); restarting in {delay:g} s"
            f" (exit {program.failures} in a row)",
        )

    def _stop_all(self) -> None:
        running = [p for p in self.programs.values() if p.process and p.process.poll() is None]
        for program in running:
            self.say("supervisor", f"stopping {program.name} (pid {program.process.pid})")
            self._signal(program, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout
        for program in running:
            try:
                program.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.say("supervisor", f"{program.name} did not stop: SIGKILL")
                self._signal(program, signal.SIGKILL)
                program.process.wait(timeout=10)

    @staticmethod
    def _signal(program: Program, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):  # it has just exited
            os.killpg(program.process.pid, signum)
