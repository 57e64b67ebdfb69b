"""The local executor: worker processes on this machine, each fed one task at a time through a
pipe of its own; forked when the driver runs no other thread (the CLI: a forked worker skips
starting an interpreter and importing prep again), else spawned. The pool waits on the pipes and
runs no thread of its own, so it forks whenever the rest of the driver runs no thread either
(during a build, the lease's renewal thread runs: its own replacements are then spawned).

A forking pool with a prepare function starts a zygote (prep.runner.executors.zygote) instead of
its workers: one process that imports the task modules and loads the build's tokenizer once,
while the driver hashes the inputs, and forks every worker, the first ones included. A pool that
cannot fork starts its workers itself, and a zygote later, once it is warmed and a worker has run
`FRESH_AFTER` tasks with as many per worker still queued.

A worker is replaced by a fresh one after `RECYCLE_AFTER` tasks: whatever its native heap
gains task after task (the tokenizer's cache of pre-tokens, a C heap fragmented batch by batch),
only a new process gives all of it back. (Python 3.11's `max_tasks_per_child` cannot do this:
the pool hangs once a worker exits at its limit, CPython gh-115634.) Once a warmed pool's run
has `FRESH_AFTER` tasks per worker queued, every worker is replaced after `FRESH_AFTER` tasks by
one the zygote forks, whose imports and tokenizer cost nothing.

Each worker caps the tokenizer's thread pool so that total threads stay near the core count. A
task's exception travels back pickled; `call_task` makes sure it can (a prep error arrives as
the same one-line error).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections import deque
from collections.abc import Callable, Generator, Sequence
from contextlib import suppress
from multiprocessing import get_context
from multiprocessing.connection import Connection, wait
from typing import Any, Protocol

from prep.errors import ExecutorError
from prep.runner.executors import zygote
from prep.runner.executors.base import RECYCLE_AFTER, Prepare, WarmUp
from prep.runner.executors.worker import serve, sigint_ignored

FRESH_AFTER = 4
"""Tasks a worker runs before one forked by the zygote replaces it. Measured at 16M short
documents (docs/performance-history.md, seventeenth pass): a worker's tokenize peak grows over its first
tasks; with a fresh worker for every task the largest process at 16M was 310 MB against 307 at 1M,
against 353 and 306 MB with the spawn replacements after RECYCLE_AFTER tasks alone."""


class _Process(Protocol):
    """What the pool uses of a worker's process: multiprocessing's, or a zygote's ForkedProcess."""

    pid: int | None

    def join(self, timeout: float | None = None) -> None: ...

    def is_alive(self) -> bool: ...

    def kill(self) -> None: ...


def _started(_: WarmUp | None) -> None:
    """The start-up of a worker given no prepare function: nothing to do."""


def fork_is_safe() -> bool:
    """Whether this process may fork workers: on Linux, with no other Python thread (a fork copies
    only the calling thread, so a lock another thread held would stay held in the child)."""
    return sys.platform == "linux" and threading.active_count() == 1


def _died() -> ExecutorError:
    """The error of a run whose worker died: one line, and what to do."""
    return ExecutorError("a worker process died (killed, or out of memory); rerun to resume from the committed tasks")


def _may_start_workers() -> bool:
    """Only the main thread starts workers: a worker dies with the thread that started it
    (`die_with`), and another thread, such as one hashing inputs meanwhile, may end first."""
    return threading.current_thread() is threading.main_thread()


class _Worker:
    """One worker process and the driver's end of its pipe, with the replies it still owes."""

    def __init__(self, connection: Connection, process: _Process) -> None:
        self.connection, self.process = connection, process
        self.owed: deque[int | None] = deque()  # a reply per message sent: the task's index, None for a warm-up
        self.tasks = 0
        self.dead = False

    @classmethod
    def start(cls, start_method: str, threads: int, interruptible: bool = True) -> _Worker:
        """A new worker process, forked or spawned by this one."""
        context = get_context(start_method)
        connection, child = context.Pipe()
        process = context.Process(  # type: ignore[attr-defined]
            target=serve, args=(child, threads, os.getpid(), interruptible), daemon=True)
        # Output still buffered here would be written again by a forked worker. A worker starts
        # with Ctrl-C ignored (an ignored signal stays ignored across fork and exec): one that
        # started before it could ignore Ctrl-C would die of it.
        sys.stdout.flush()
        sys.stderr.flush()
        with sigint_ignored():
            process.start()
        child.close()
        return cls(connection, process)

    def send(self, fn: Callable[[Any], Any], item: Any, index: int | None) -> None:
        try:
            self.connection.send((fn, item))
        except OSError:  # the worker is gone (killed while idle): its end of the pipe is closed
            self.dead = True
            raise _died() from None
        self.owed.append(index)

    def receive(self) -> tuple[int | None, bool, Any]:
        """The next reply: (the task's index or None for a warm-up, whether it succeeded, its
        result or exception)."""
        try:
            succeeded, value = self.connection.recv()
        except (EOFError, OSError):
            raise _died() from None
        return self.owed.popleft(), succeeded, value

    def stop(self) -> None:
        """Ask the worker to exit (an explicit message: a worker forked later holds a copy of
        this end of the pipe, so closing it would not reach the worker), and reap it."""
        with suppress(OSError, ValueError):
            self.connection.send(None)
        self.connection.close()
        self.process.join(timeout=10)
        if self.process.is_alive():  # stuck on a message cut short by a signal
            self.process.kill()
            self.process.join()


class LocalExecutor:
    """`workers` processes, kept warm for the whole build and each replaced after `recycle_after`
    tasks; forked by a zygote when `fork` is asked for and safe (fork_is_safe), else spawned.
    Once warmed, each is replaced after `fresh_after` tasks by one its zygote forks, when ready."""

    shares_filesystem = True
    backend = "local"

    def __init__(self, workers: int, prepare: Prepare | None = None, threads_per_worker: int = 1,
                 fork: bool = False, recycle_after: int | None = None, fresh_after: int | None = None) -> None:
        self.workers = workers
        self.recycle_after = recycle_after or RECYCLE_AFTER
        self.fresh_after = fresh_after or FRESH_AFTER
        self.replaced = self.forked = 0  # replacements in all; those the zygote forked
        self._warm_up: WarmUp | None = None
        self._zygote: zygote.Zygote | None = None
        self._retired: list[zygote.Zygote] = []
        self._prepare = prepare
        self._fork = fork
        self._threads = threads_per_worker
        self._renewing = False  # whether workers are replaced after `fresh_after` tasks
        self._interruptible = signal.getsignal(signal.SIGINT) is not signal.SIG_IGN  # else tasks ignore Ctrl-C too
        self.start_method = self._start_method()
        self._workers: list[_Worker] = []
        if prepare is not None and self.start_method == "fork" and zygote.supported():
            # One process imports the task modules and loads the tokenizer, once, while the driver
            # gets ready; every worker is its fork (started by the first run).
            self._zygote = zygote.Zygote("fork", threads_per_worker, prepare, None, self._interruptible)
        else:  # each worker imports the task modules (with `prepare`) while the driver gets ready
            self._workers = [self._start() for _ in range(workers)]

    def _start_method(self) -> str:
        return "fork" if self._fork and fork_is_safe() else "spawn"

    def _start(self) -> _Worker:
        """A new worker, importing the task modules (`prepare`). Only `warm` loads a tokenizer:
        a replacement may run only order or shard tasks, and a tokenize task loads it itself."""
        worker = _Worker.start(self._start_method(), self._threads, self._interruptible)
        worker.send(self._prepare or _started, None, None)
        return worker

    def warm(self, warm_up: WarmUp) -> None:
        """Queue a tokenizer warm-up per worker ahead of the next tasks; its errors are ignored
        (a task that needs the tokenizer reports them)."""
        if self._prepare is not None:
            if self._zygote is not None and self._warm_up is None:
                self._zygote.warm(warm_up)  # before it forks the first workers: they hold it already
            elif self._zygote is not None and self._warm_up != warm_up:
                # It holds another tokenizer: a new one starts when needed. Closed only with the
                # pool, since the workers it forked die with it.
                self._retired.append(self._zygote)
                self._zygote = None
            self._warm_up = warm_up
            for worker in self._workers:
                with suppress(ExecutorError):  # a dead worker: the next run reports it
                    worker.send(self._prepare, warm_up, None)

    def run(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> Generator[tuple[int, Any], None, None]:
        queue = deque(enumerate(items))
        try:
            self._replace_dead()
            self._start_first()
            for worker in self._workers:
                self._feed(worker, fn, queue)
            while any(worker.owed for worker in self._workers):
                for connection in wait([worker.connection for worker in self._workers if worker.owed]):
                    worker = next(worker for worker in self._workers if worker.connection is connection)
                    index, succeeded, value = worker.receive()
                    if index is not None:
                        worker = self._recycled(worker, len(queue))
                    self._feed(worker, fn, queue)
                    if index is None:
                        continue  # a warm-up's errors are for the tasks that need its tokenizer
                    if not succeeded:
                        raise value
                    yield index, value
            if queue:  # every worker died in an earlier run, and this thread may not start new ones
                raise ExecutorError("no worker process is left; rerun to resume from the committed tasks")
        finally:
            # Tasks already running go on in their workers: wait for them, so that nothing a
            # failed run started can still write after the caller cleans up.
            self._drain()

    def _feed(self, worker: _Worker, fn: Callable[[Any], Any], queue: deque[tuple[int, Any]]) -> None:
        """Send an idle worker the next task. Only an idle one: a task sent behind a warm-up of a
        second or more would block the driver in `send` once it outgrows the pipe's buffer."""
        if queue and not worker.owed and not worker.dead:
            index, item = queue.popleft()
            worker.send(fn, item, index)

    def _recycled(self, worker: _Worker, queued: int) -> _Worker:
        """`worker`, or a fresh process in its place once it has run `recycle_after` tasks, or
        `fresh_after` when the zygote can fork the replacement (started with `queued` tasks left)."""
        worker.tasks += 1
        if worker.owed or not _may_start_workers():
            return worker
        due = worker.tasks >= self.recycle_after or (worker.tasks >= self.fresh_after and self._zygote_ready(queued))
        if not due:
            return worker
        worker.stop()
        fresh = self._fresh()
        self._workers[self._workers.index(worker)] = fresh
        self.replaced += 1
        return fresh

    def _drain(self) -> None:
        """Wait for every reply still owed; a worker that died instead is marked, and replaced
        by the next `run` called from the main thread."""
        for worker in self._workers:
            try:
                while worker.owed:
                    worker.receive()
            except ExecutorError:
                worker.owed.clear()
                worker.dead = True
        self._replace_dead()

    def _replace_dead(self) -> None:
        """Reap every worker marked dead (in `_drain`, or by a send that found it gone) or found
        dead while idle (killed, or gone with its zygote: no task was lost) and start one in its
        place, when this thread may start workers."""
        if not _may_start_workers():
            return
        for position, worker in enumerate(self._workers):
            if worker.dead or not worker.owed and not worker.process.is_alive():
                worker.stop()
                self._workers[position] = self._fresh()

    def _start_first(self) -> None:
        """Fork the first workers from the zygote started with the pool, waiting for it to be
        ready (from any thread: a forked worker dies with the zygote, not with the thread that
        asked); if it is lost, start them as a pool without one does, from the main thread."""
        while len(self._workers) < self.workers:
            forked = self._zygote.fork(patient=True) if self._zygote is not None else None
            if forked is not None:
                self._workers.append(_Worker(*forked))
            elif _may_start_workers():
                worker = self._start()
                if self._prepare is not None and self._warm_up is not None:
                    worker.send(self._prepare, self._warm_up, None)
                self._workers.append(worker)
            else:
                return

    def _fresh(self) -> _Worker:
        """A replacement: forked by the zygote when it is ready, else started as the first workers were."""
        if self._zygote is not None and self._zygote.ready():
            forked = self._zygote.fork()
            if forked is not None:
                self.forked += 1
                return _Worker(*forked)
        return self._start()

    def _zygote_ready(self, queued: int) -> bool:
        """Whether the zygote can fork a replacement now. Workers are renewed from the first time
        this is asked with at least `fresh_after` tasks per worker still queued: in a shorter run,
        or a short build, no worker would grow much older, and a fresh process's cold first task
        would buy nothing. A pool without a zygote then starts one (spawned: forked from a driver in
        the middle of a build, it would carry the driver's memory into every worker; a forking pool
        forks its zygote at the start, from a driver that holds little yet)."""
        if self._zygote is None or not self._renewing:
            if not (queued >= self.workers * self.fresh_after and self._warm_up is not None
                    and self._prepare is not None and zygote.supported()):
                return False
            self._renewing = True
            if self._zygote is None:
                self._zygote = zygote.Zygote("spawn", self._threads, self._prepare, self._warm_up, self._interruptible)
                return False
        return self._zygote.ready()

    def pids(self) -> list[int]:
        """The worker processes' ids (tests signal them)."""
        return [worker.process.pid for worker in self._workers if worker.process.pid is not None]

    def close(self) -> None:
        for worker in self._workers:
            worker.stop()
        self._workers = []
        for retired in [*self._retired, *([self._zygote] if self._zygote is not None else [])]:
            retired.close()
        self._retired, self._zygote = [], None
