"""A page's tree built in a child process, bounded in memory and in time.

Lexbor builds the tree in C, without the GIL, and some markup costs it far more than its
size: one tag of 40,000 distinct attributes (263 KB) took 3.7 s, quadratic in them, and
5 MiB of one tag's duplicate attributes 196 MiB (DECISIONS.md, "A large page's tree is
built in a child process"). No check before the parse agrees with Lexbor on where every tag is,
and a time limit cannot interrupt C code (jobs.timelimits). So an audits worker of
threads builds the tree of a page of more than AUDIT_TREE_IN_PROCESS_MAX_BYTES in one of
its AUDIT_TREE_PROCESSES children, each with AUDIT_TREE_MEMORY_MB of address space beyond
its own; one that runs out of it, or of AUDIT_TREE_SECONDS, is killed and replaced
(pebble), and the page is read without a tree (`TreeTooCostly`). A smaller page's tree is
built in the worker: its worst case is bounded by its size.

The children are the worker's own, started and stopped by its `TreeBuilders` bootstep
(audits.bootsteps), once its pool's running audits have finished; in a session of their
own (config.tree_children), so a signal to the worker's process group stops the worker,
not a page in a child. A process without them (a test, a shell, a bench) builds every tree
itself.

The children are shared by every client's audits in the worker, so a client holds at most
half of them (one, with the default one), and its other large pages wait for its turn
outside the children's queue: another client's page queued meanwhile goes first. One
client's costly pages delay another's by one page's deadline at most, not by all of them.
Many clients' costly pages still queue one behind another, so a page waits for its turn
and for a child at most `wait_seconds` (AUDIT_TREE_WAIT_SECONDS); past it, it is read
without a tree (`BuildersBusy`), and its audit stays within its time limits: a thread
waiting here cannot be interrupted by them (jobs.timelimits).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import multiprocessing
import resource
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import pebble
from selectolax.lexbor import SelectolaxError

log = logging.getLogger(__name__)

T = TypeVar("T")

# The children fork from a server that loaded Django and the analysis once: not from the
# worker, whose other threads may hold a lock (SQLite's, an import's) at the fork.
PRELOAD = "config.tree_children"
# pebble ends a timed-out child with SIGTERM, then SIGKILL once this has passed. A child
# inside Lexbor's C code never runs the SIGTERM handler (a Python one), so pebble's default
# of 3 s would only hold the page's fallback back.
KILL_AFTER_SECONDS = 0.5
# The most a started page takes past its deadline: the kill, and pebble's loop (every 0.1
# s) noticing the deadline under a busy worker's GIL. Past it the builders are not
# answering (stopped, or broken), and the page is given up rather than waited on forever.
ANSWER_SECONDS = KILL_AFTER_SECONDS + 1.0


class NoTree(Exception):
    """The page's tree was not built; `reason` is what its audit's findings say, `event`
    what the worker logs."""

    reason = event = ""


class TreeTooCostly(NoTree):
    """The tree would cost more memory or time than a child is given."""

    reason, event = "too_costly_for_a_tree", "audit.tree_too_costly"


class BuildersBusy(NoTree):
    """No child took the page within its wait: other pages held every one."""

    reason, event = "tree_builders_busy", "audit.tree_builders_busy"


_children: pebble.ProcessPool | None = None
_per_client = 1
# The clients whose pages are with the children now, and how many each.
_holding: dict[str, int] = {}
_turns = threading.Condition()


def start(processes: int, *, memory_mb: int) -> None:
    """Start `processes` children, each limited to `memory_mb` of address space beyond
    what it holds at its start; returns once one answers."""
    global _children, _per_client
    _per_client = max(1, processes // 2)
    pebble.CONSTS.term_timeout = KILL_AFTER_SECONDS
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([PRELOAD])
    pool = pebble.ProcessPool(
        max_workers=processes, initializer=_limit_memory, initargs=(memory_mb,), context=context
    )
    # The first task starts the pool's threads here, in the caller's (a bootstep), and
    # waits until a child answers.
    pool.schedule(_ready).result()
    _children = pool


def stop() -> None:
    global _children
    pool, _children = _children, None
    if pool is not None:
        pool.stop()
        pool.join()


def running() -> bool:
    return _children is not None


def holding(client: str) -> int:
    """How many of `client`'s pages are with the children now."""
    with _turns:
        return _holding.get(client, 0)


def build(
    function: Callable[..., T], *args, seconds: float, wait_seconds: float, client: str = ""
) -> T:
    """`function(*args)`, in a child when the worker has them (else here): its result,
    TreeTooCostly when the child ran out of memory or of `seconds`, or BuildersBusy when
    no child started it within `wait_seconds`. `client` (audits.admission.client_key; ""
    for the system's own work) waits for its turn within that wait too."""
    pool = _children
    if pool is None:
        return function(*args)
    given_up_at = time.monotonic() + wait_seconds
    with _clients_turn(client, given_up_at):
        future = pool.schedule(function, args=args, timeout=seconds)
        concurrent.futures.wait([future], timeout=max(0.0, given_up_at - time.monotonic()))
        # Still queued: cancelled, it never starts (or, if a child takes it meanwhile, that
        # child is replaced).
        if not future.running() and not future.done() and future.cancel():
            raise BuildersBusy(f"no tree builder took the page within {wait_seconds:g} s")
        try:
            return future.result(timeout=seconds + ANSWER_SECONDS)
        except concurrent.futures.TimeoutError:
            if not future.done() and future.cancel():
                raise BuildersBusy("the tree builders did not answer") from None
            raise TreeTooCostly(f"the tree took more than {seconds:g} s") from None
        except (MemoryError, SelectolaxError, pebble.ProcessExpired) as exc:
            # Out of address space: Lexbor's allocation fails (SelectolaxError), Python's
            # (MemoryError), or the child dies.
            raise TreeTooCostly(f"the tree ran out of memory ({type(exc).__name__})") from None


@contextlib.contextmanager
def _clients_turn(client: str, given_up_at: float):
    """Hold one of `client`'s places with the children, waiting until it has one, or
    BuildersBusy past `given_up_at` (time.monotonic())."""
    with _turns:
        if not _turns.wait_for(
            lambda: _holding.get(client, 0) < _per_client,
            timeout=max(0.0, given_up_at - time.monotonic()),
        ):
            raise BuildersBusy("the client's pages held its turns with the tree builders")
        _holding[client] = _holding.get(client, 0) + 1
    try:
        yield
    finally:
        with _turns:
            _holding[client] -= 1
            if not _holding[client]:
                del _holding[client]
            _turns.notify_all()


def _limit_memory(memory_mb: int) -> None:
    try:
        address_space = _address_space() + memory_mb * 1024 * 1024
    except OSError:
        # No /proc (macOS, where RLIMIT_AS is not enforced either): the deadline alone.
        log.warning("treebuild.memory_not_limited")
        return
    resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))


def _address_space() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[0]) * resource.getpagesize()


def _ready() -> bool:
    return True
