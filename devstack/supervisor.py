"""Runs `make run`'s processes in one terminal and keeps them running.

A process that exits is started again after a backoff (1 s, doubling to
RESTART_BACKOFF_MAX_SECONDS; back to 1 s once it has stayed up STABLE_SECONDS), so a
worker that dies in a Redis or database outage comes back without taking the web
and the other workers down with it (honcho stopped everything when any one exited).
Each line a process prints is prefixed with its name. SIGINT or SIGTERM stops them
all: SIGTERM first, SIGKILL after `stop_timeout` seconds (at once on a second signal).

A signal only writes its number to a pipe (`signal.set_wakeup_fd`) that the main loop
selects on: nothing runs in a handler that could take a lock the interrupted main thread
holds (a `threading.Event` set from a handler once left a whole stack running).

No process outlives the supervisor, even one that is SIGKILLed: each child asks the
kernel for SIGKILL when its parent dies (PR_SET_PDEATHSIG), and the pid file names
every process group started, so the next start stops whatever a lost run left behind
(and refuses to start while that run's supervisor is still alive).

DECISIONS.md ("make run restarts what exits") says why this is not supervisord.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import psutil

RESTART_BACKOFF_FIRST_SECONDS = 1.0
RESTART_BACKOFF_MAX_SECONDS = 30.0
# Up this long, a process is healthy again: its next exit restarts after the first backoff.
STABLE_SECONDS = 60.0

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# prctl(2): the signal the kernel sends a process when the thread that forked it exits.
PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None


class AlreadyRunning(RuntimeError):
    """The supervisor named in the pid file is still alive."""


def die_with_parent(parent_pid: int) -> Callable[[], None] | None:
    """A preexec_fn that makes the child get SIGKILL when `parent_pid` dies (Linux).

    It runs in the child between fork and exec: only a C call and two system calls,
    no lock. A parent that died before prctl took effect is caught by getppid."""
    if _libc is None:
        return None

    def preexec() -> None:
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec


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
        pid_file: Path | None = None,
    ):
        self.out = out
        self.stop_timeout = stop_timeout
        self.clock = clock
        self.pid_file = pid_file
        self.programs: dict[str, Program] = {}
        # The wake-up pipe: a signal's number (set_wakeup_fd) or stop()'s byte.
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        os.set_blocking(self._wake_write, False)
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
        """Start every program and keep them running until stop() or a signal.

        Every program is started, and restarted, from the thread that calls run(): the
        kernel's parent-death signal follows the thread that forked, not the process."""
        previous = self._catch_signals() if handle_signals else None
        try:
            self._stop_leftovers()
            try:
                for program in self.programs.values():
                    self._start(program)
                while not (woken := self._wait_for_wake(0.1)):
                    for program in self.programs.values():
                        self._look_after(program)
                self.say("supervisor", f"{woken}: stopping every process")
            finally:  # an error of the supervisor's own stops the programs too
                self._stop_all()
            if self.pid_file is not None:
                self.pid_file.unlink(missing_ok=True)
        finally:
            if previous is not None:
                self._restore_signals(*previous)
        return 0

    def stop(self) -> None:
        """Ask run() to stop every program (from any thread: one byte on the wake pipe)."""
        with contextlib.suppress(BlockingIOError):  # a wake-up is already pending
            os.write(self._wake_write, b"\0")

    def _catch_signals(self):
        # The handler does nothing: the C-level handler has already written the signal's
        # number to the wake pipe, which is all the main loop reads.
        wakeup = signal.set_wakeup_fd(self._wake_write, warn_on_full_buffer=False)
        handlers = {signum: signal.signal(signum, _leave_to_wake_pipe) for signum in STOP_SIGNALS}
        return wakeup, handlers

    @staticmethod
    def _restore_signals(wakeup: int, handlers: dict) -> None:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        signal.set_wakeup_fd(wakeup)

    def _wait_for_wake(self, timeout: float) -> str | None:
        """What woke the supervisor within `timeout` s ("SIGTERM", "stop()"), else None."""
        readable, _, _ = select.select([self._wake_read], [], [], timeout)
        if not readable:
            return None
        try:
            data = os.read(self._wake_read, 512)
        except BlockingIOError:
            return None
        reasons = [signal.Signals(byte).name if byte else "stop()" for byte in data]
        return ", ".join(dict.fromkeys(reasons)) or None

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
            preexec_fn=die_with_parent(os.getpid()),
        )
        program.started_at = self.clock()
        program.starts.append(program.started_at)
        program.restart_at = None
        self._write_pid_file()
        self.say("supervisor", f"{program.name} started (pid {program.process.pid})")
        threading.Thread(target=self._relay, args=(program, program.process), daemon=True).start()

    def _write_pid_file(self) -> None:
        """Name this supervisor and each program's process group (its leader's pid and
        start time, so a reused pid is never taken for it)."""
        if self.pid_file is None:
            return
        groups = [
            {"name": p.name, "pid": p.process.pid, "started": _start_time(p.process.pid)}
            for p in self.programs.values()
            if p.process is not None and p.process.poll() is None
        ]
        record = {"supervisor": os.getpid(), "started": _start_time(os.getpid()), "groups": groups}
        self.pid_file.parent.mkdir(parents=True, exist_ok=True)
        written = self.pid_file.with_suffix(".tmp")
        written.write_text(json.dumps(record))
        written.replace(self.pid_file)

    def _stop_leftovers(self) -> None:
        """Stop what the last run named in the pid file and left running, or refuse to
        start while that run's supervisor is alive (it would consume the same Redis)."""
        if self.pid_file is None or not self.pid_file.exists():
            return
        try:
            record = json.loads(self.pid_file.read_text())
        except ValueError:
            record = {"groups": []}
        supervisor = record.get("supervisor")
        if supervisor and supervisor != os.getpid() and _alive_since(supervisor, record["started"]):
            raise AlreadyRunning(
                f"another stack's supervisor is running (pid {supervisor}, {self.pid_file});"
                " stop it first"
            )
        leftovers = []
        for group in record.get("groups", []):
            members = _group_members(group["pid"], group["started"])
            if members:
                self.say(
                    "supervisor",
                    f"stopping {group['name']} left by the last run (pids"
                    f" {', '.join(str(p.pid) for p in members)})",
                )
                leftovers.extend(members)
        for process in leftovers:
            with contextlib.suppress(psutil.Error):
                process.terminate()
        _, alive = psutil.wait_procs(leftovers, timeout=self.stop_timeout)
        for process in alive:
            with contextlib.suppress(psutil.Error):
                process.kill()
        psutil.wait_procs(alive, timeout=10)
        self.pid_file.unlink(missing_ok=True)

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
        while time.monotonic() < deadline and any(p.process.poll() is None for p in running):
            if woken := self._wait_for_wake(0.1):
                self.say("supervisor", f"{woken} again: SIGKILL now")
                break
        for program in running:
            if program.process.poll() is None:
                self.say("supervisor", f"{program.name} did not stop: SIGKILL")
                self._signal(program, signal.SIGKILL)
                program.process.wait(timeout=10)

    @staticmethod
    def _signal(program: Program, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):  # it has just exited
            os.killpg(program.process.pid, signum)


def _leave_to_wake_pipe(signum, frame) -> None:
    """Python's handler for STOP_SIGNALS: none is needed beyond the wake pipe's byte."""


def _start_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def _alive_since(pid: int, started: float | None) -> bool:
    return started is not None and _start_time(pid) == started


def _group_members(group: int, started: float | None) -> list[psutil.Process]:
    """The live processes of process group `group`, started no earlier than its leader
    was (a group id reused since then is another program's)."""
    if started is None:
        return []
    members = []
    for process in psutil.process_iter(["create_time"]):
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            if os.getpgid(process.pid) == group and process.info["create_time"] >= started:
                members.append(process)
    return members
