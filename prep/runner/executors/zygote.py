"""The local pool's zygote: one process that imported the task modules and loaded the build's
tokenizer, and forks a fresh worker whenever the pool starts one. A forking pool starts with it
(forked from the driver, which has imported neither) and has it fork even its first workers, so
the imports and the tokenizer load (about 0.6 s of a core) are paid once instead of once per
worker; a pool that cannot fork spawns one once its workers are due for replacement. A worker
then costs a fork (milliseconds) instead of an interpreter start, the imports and a tokenizer
load, so the pool can replace its workers often enough that none grows old: a worker's heap
grows over its first tasks (the tokenizer's cache of pre-tokens, a fragmented C heap), and a
build of 16M documents should peak no higher than one of 1M.

Linux only (pidfds, SCM_RIGHTS). A forked worker is the zygote's child, not the driver's: the
driver gets its pipe and a pidfd (a handle no reused pid can redirect) over the zygote's socket;
the worker dies with the zygote, which dies with the driver. The zygote runs no thread and ignores
Ctrl-C and SIGTERM: it ends when the driver closes its pipe, after the workers it forked.
"""

from __future__ import annotations

import atexit
import os
import select
import signal
import socket
import sys
from contextlib import suppress
from multiprocessing import get_context, reduction
from multiprocessing.connection import Connection
from typing import Any

from prep.runner.executors.base import Prepare, WarmUp, release_free_memory
from prep.runner.executors.worker import exit_now, init_worker, serve, sigint_ignored

REAP_SECONDS = 0.5  # how often an idle zygote reaps the workers that ended
FORK_SECONDS = 10.0  # how long the driver waits for a forked worker before it gives up on the zygote


def supported() -> bool:
    """Whether this machine can run a zygote (Linux with pidfds)."""
    return sys.platform == "linux" and hasattr(os, "pidfd_open") and hasattr(signal, "pidfd_send_signal")


class ForkedProcess:
    """A worker the zygote forked, seen from the driver: not its child, so it is waited for and
    signalled through a pidfd (the interface of multiprocessing's Process that the pool uses)."""

    def __init__(self, pid: int, pidfd: int) -> None:
        self.pid: int | None = pid
        self._pidfd: int | None = pidfd

    def join(self, timeout: float | None = None) -> None:
        if self._pidfd is not None and select.select([self._pidfd], [], [], timeout)[0]:
            os.close(self._pidfd)  # readable: it ended
            self._pidfd = None

    def is_alive(self) -> bool:
        self.join(0)
        return self._pidfd is not None

    def kill(self) -> None:
        if self._pidfd is not None:
            with suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)


class Zygote:
    """The driver's handle on its zygote (started with or without the build's warm-up): ask
    whether it is `ready`, have it `warm` up, `fork` workers, `close` it."""

    def __init__(self, start_method: str, threads: int, prepare: Prepare, warm_up: WarmUp | None,
                 interruptible: bool = True) -> None:
        context = get_context(start_method)
        self.connection, child = context.Pipe()  # a socket pair: it carries descriptors too
        self.process = context.Process(  # type: ignore[attr-defined]
            target=_live, args=(child, threads, os.getpid(), prepare, warm_up, interruptible), daemon=True)
        sys.stdout.flush()
        sys.stderr.flush()
        with sigint_ignored():
            self.process.start()
        child.close()
        # Hazard: at exit, multiprocessing terminates its daemonic children with SIGTERM, which a
        # zygote ignores, then joins them: a program that never closed its pool would hang there.
        atexit.register(self.close)
        self._owed = 1  # "ready"s still to come: one for its start, one per later warm-up
        self.broken = False

    def ready(self) -> bool:
        """Whether it has done all it was asked (imports, each tokenizer), without waiting; False
        once it failed."""
        try:
            while self._owed and not self.broken and self.connection.poll(0):
                self._note(self.connection.recv())
        except (EOFError, OSError):
            self.broken = True
        return not self._owed and not self.broken

    def warm(self, warm_up: WarmUp) -> None:
        """Have it load a tokenizer (after what it is doing), for the workers it forks from then on."""
        try:
            self.connection.send(("warm", warm_up))
        except (OSError, ValueError):
            self.broken = True
            return
        self._owed += 1

    def fork(self, patient: bool = False) -> tuple[Connection, ForkedProcess] | None:
        """A fresh worker's pipe and process, or None if the zygote is gone, could not fork or did
        not answer within FORK_SECONDS (it is not asked again: the pool starts its workers itself
        then). `patient`: wait as long as it lives instead (it may still be importing and loading
        the tokenizer, which a large tokenizer makes slow)."""
        if self.broken:
            return None
        try:
            self.connection.send("fork")
            pid = self._answer(patient)
            if pid is None:
                self.broken = True
                return None
            with socket.socket(fileno=os.dup(self.connection.fileno())) as carrier:
                pipe, pidfd = reduction.recvfds(carrier, 2)
        except (EOFError, OSError, RuntimeError, ValueError):
            self.broken = True
            return None
        except BaseException:
            self.broken = True  # interrupted mid-answer: what it sends next belongs to this request
            raise
        return Connection(pipe), ForkedProcess(pid, pidfd)

    def _answer(self, patient: bool) -> Any:
        """Its answer to a fork request (a pid, or None), past the "ready"s it sent before it."""
        while True:
            waited = 0.0
            while not self.connection.poll(REAP_SECONDS):
                waited += REAP_SECONDS
                if not self.process.is_alive() or not patient and waited >= FORK_SECONDS:
                    return None
            message = self.connection.recv()
            if message != "ready":
                return message
            self._note(message)

    def _note(self, message: Any) -> None:
        if message != "ready":  # nothing else comes unasked: the conversation is lost
            raise OSError(f"the zygote sent {message!r}")
        self._owed -= 1

    def close(self) -> None:
        """End the zygote (after the pool stopped its workers: they die with it) and reap it."""
        atexit.unregister(self.close)
        with suppress(OSError, ValueError):
            self.connection.send(None)
        self.connection.close()
        self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()


def _live(control: Connection, threads: int, driver: int, prepare: Prepare, warm_up: WarmUp | None,
          interruptible: bool) -> None:
    """The zygote's life: import (and load the tokenizer, given one), say "ready", then fork a
    worker or load a tokenizer per request until the driver sends None or goes away."""
    init_worker(threads, driver, interruptible)
    terminate = signal.signal(signal.SIGTERM, signal.SIG_IGN)  # what its workers get back
    _prepared(control, prepare, warm_up)
    while True:
        try:
            while not control.poll(REAP_SECONDS):
                _reap()
            message = control.recv()
        except (EOFError, OSError):
            break
        if isinstance(message, tuple) and message[0] == "warm":
            _prepared(control, prepare, message[1])
            continue
        if message != "fork":
            break
        try:
            _fork(control, threads, terminate, interruptible)
        except OSError:  # the driver went away mid-answer (or no pidfd): its forked worker dies with this process
            break
        _reap()
    _reap()  # the workers the driver stopped: left to init, they might stay zombies (a container's init may not reap)
    exit_now()


def _prepared(control: Connection, prepare: Prepare, warm_up: WarmUp | None) -> None:
    """Run `prepare` (its errors are ignored: a task that needs the tokenizer reports why it
    cannot load), give the heap back, and say "ready"."""
    with suppress(Exception):
        prepare(warm_up)
    release_free_memory()
    with suppress(OSError):
        control.send("ready")


def _fork(control: Connection, threads: int, terminate: Any, interruptible: bool) -> None:
    """Fork a worker; send the driver its pid, then its pipe's other end and a pidfd."""
    ours, theirs = socket.socketpair()
    zygote = os.getpid()
    # A SIGTERM reaching the child before it restores its handler (it inherits the zygote's
    # SIG_IGN) would be lost: blocked across the fork, it stays pending until the handler is back.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        pid = os.fork()
    except OSError:  # no memory or process left for it: the driver spawns its workers instead
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        ours.close()
        theirs.close()
        control.send(None)
        return
    if pid == 0:
        try:  # the child must never return into the zygote's loop
            control.close()
            ours.close()
            signal.signal(signal.SIGTERM, terminate)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
            serve(Connection(theirs.detach()), threads, zygote, interruptible)  # dies with the zygote, which dies with the driver
        finally:
            exit_now()
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})  # ignored here: a pending one is dropped
    theirs.close()
    pidfd = os.pidfd_open(pid)  # a zombie at worst: only this process reaps it, later
    try:
        control.send(pid)
        with socket.socket(fileno=os.dup(control.fileno())) as carrier:
            reduction.sendfds(carrier, [ours.fileno(), pidfd])
    finally:
        ours.close()
        os.close(pidfd)


def _reap() -> None:
    """Collect the workers that ended (each driver-side pidfd saw it end already)."""
    with suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
