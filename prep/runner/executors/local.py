"""The local executor: worker processes on this machine, each fed one task at a time through a
pipe of its own; forked from a driver with no other thread (the CLI: a forked worker skips
starting an interpreter and importing prep again, a few tenths of a second before its first
task), else spawned. The pool waits on the pipes and runs no thread of its own, so it forks
whenever the rest of the driver runs no thread either (during a build, the lease's renewal
thread runs: replacements are spawned).

A worker is replaced by a fresh one after `RECYCLE_AFTER` tasks: whatever its native heap
gains task after task (the tokenizer's cache of pre-tokens, a C heap fragmented batch by batch),
only a new process gives all of it back. (Python 3.11's `max_tasks_per_child` cannot do this:
the pool hangs once a worker exits at its limit, CPython gh-115634.)

Each worker caps the tokenizer's thread pool so that total threads stay near the core count. A
task's exception travels back pickled; `_call` makes sure it can (a prep error arrives as the
same one-line error).
"""

from __future__ import annotations

import atexit
import ctypes
import os
import pickle
import signal
import sys
import threading
from collections import deque
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import contextmanager, suppress
from multiprocessing import get_context
from multiprocessing.connection import Connection, wait
from typing import Any

from prep.errors import ExecutorError
from prep.runner.executors.base import RECYCLE_AFTER, Prepare, WarmUp, release_free_memory, transportable


def _die_with(driver: int) -> None:
    """Have the kernel kill this worker when its driver dies (Linux). Otherwise a driver killed
    by SIGKILL (or any signal it does not handle) leaves its workers waiting forever on a task
    queue their forked siblings keep open, each holding its tokenizer and memory."""
    if sys.platform != "linux":
        return
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return
    # Hazard: the kernel ties this to the thread that started the worker, so the pool must be
    # made (its workers all start in __init__) by a thread that outlives it: the driver's main one.
    prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != driver:  # it died before the call: no signal will come
        os._exit(1)


def _init_worker(threads: int, driver: int) -> None:
    _die_with(driver)
    os.environ["RAYON_NUM_THREADS"] = str(threads)
    os.environ["TOKENIZERS_PARALLELISM"] = "true" if threads > 1 else "false"
    atexit.register(_exit_now)
    # Ctrl-C reaches every worker. An idle one ignores it: dying of it would break the pool,
    # which then kills the busy workers before they remove their partial files (see _call).
    signal.signal(signal.SIGINT, signal.SIG_IGN)


_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _started(_: WarmUp | None) -> None:
    """The start-up of a worker given no prepare function: nothing to do."""


@contextmanager
def _sigint_ignored() -> Iterator[None]:
    """Ignore Ctrl-C in this process meanwhile (only the main thread may change handlers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _exit_now() -> None:
    """End a worker without tearing down its interpreter: a worker's results are all sent by
    the time it exits, and finalizing the tokenizer, Arrow and numpy costs tenths of a second."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _call(fn: Callable[[Any], Any], item: Any) -> Any:
    """Run a task in a worker: interruptible by Ctrl-C, raising only exceptions the driver can unpickle."""
    # An exception that cannot be rebuilt from its pickle would break the whole pool ("a worker
    # process died"). KeyboardInterrupt passes as it is, after the task's own cleanup.
    idle = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return fn(item)
    except Exception as exc:
        raise transportable(exc) from None
    finally:
        signal.signal(signal.SIGINT, idle)
        release_free_memory()


def fork_is_safe() -> bool:
    """Whether this process may fork workers: on Linux, with no other Python thread (a fork copies
    only the calling thread, so a lock another thread held would stay held in the child)."""
    return sys.platform == "linux" and threading.active_count() == 1


def _died() -> ExecutorError:
    """The error of a run whose worker died: one line, and what to do."""
    return ExecutorError("a worker process died (killed, or out of memory); rerun to resume from the committed tasks")


def _may_start_workers() -> bool:
    """Only the main thread starts workers: a worker dies with the thread that started it
    (`_die_with`), and another thread, such as one hashing inputs meanwhile, may end first."""
    return threading.current_thread() is threading.main_thread()


class _Worker:
    """One worker process and the driver's end of its pipe, with the replies it still owes."""

    def __init__(self, start_method: str, threads: int) -> None:
        context = get_context(start_method)
        self.connection, child = context.Pipe()
        self.process = context.Process(  # type: ignore[attr-defined]
            target=_serve, args=(child, threads, os.getpid()), daemon=True)
        # Output still buffered here would be written again by a forked worker. A worker starts
        # with Ctrl-C ignored (an ignored signal stays ignored across fork and exec): one that
        # started before it could ignore Ctrl-C would die of it.
        sys.stdout.flush()
        sys.stderr.flush()
        with _sigint_ignored():
            self.process.start()
        child.close()
        self.owed: deque[int | None] = deque()  # a reply per message sent: the task's index, None for a warm-up
        self.tasks = 0
        self.dead = False

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


def _serve(connection: Connection, threads: int, driver: int) -> None:
    """A worker's life: run each (function, item) the driver sends and send back (True, result)
    or (False, exception) until it sends None or goes away."""
    _init_worker(threads, driver)
    # SIGTERM or Ctrl-C outside a task (waiting, unpickling, sending a reply) ends the worker
    # quietly: a forked worker inherits the CLI's handler, which raises Terminated wherever it lands.
    with suppress(KeyboardInterrupt):
        _serve_messages(connection)
    _exit_now()


def _serve_messages(connection: Connection) -> None:
    """Answer the driver's messages until it sends None or goes away; a task's own failure, Ctrl-C
    too, is its reply."""
    while True:
        try:
            raw = connection.recv_bytes()
        except (EOFError, OSError):  # the driver is gone
            return
        try:
            message = pickle.loads(raw)
        except Exception as exc:  # noqa: BLE001 -- a task this worker cannot rebuild is that task's error
            if not _answer(connection, (False, transportable(exc))):
                return
            continue
        if message is None:
            return
        fn, item = message
        try:
            reply: tuple[bool, Any] = (True, _call(fn, item))
        except BaseException as exc:  # noqa: BLE001 -- every failure, Ctrl-C too, goes back to the driver
            reply = (False, exc)
        if not _answer(connection, reply):
            return


def _answer(connection: Connection, reply: tuple[bool, Any]) -> bool:
    """Send a reply; False when the driver's end is closed (it stopped this worker mid-task, or is
    gone): there is no one left to tell, so the worker ends quietly rather than with a traceback."""
    try:
        connection.send(reply)
    except OSError:
        return False
    except Exception as exc:  # noqa: BLE001 -- a result that cannot be pickled (nothing was sent)
        return _answer(connection, (False, RuntimeError(f"a task's result could not be sent back: {exc}")))
    return True


class LocalExecutor:
    """`workers` processes, kept warm for the whole build and each replaced after
    `recycle_after` tasks; forked when `fork` is asked for and safe (fork_is_safe), else spawned."""

    shares_filesystem = True
    backend = "local"

    def __init__(self, workers: int, prepare: Prepare | None = None, threads_per_worker: int = 1,
                 fork: bool = False, recycle_after: int | None = None) -> None:
        self.workers = workers
        self.recycle_after = recycle_after or RECYCLE_AFTER
        self.replaced = 0
        self._prepare = prepare
        self._fork = fork
        self._threads = threads_per_worker
        self.start_method = self._start_method()
        # Each worker imports the task modules (with `prepare`) while the driver gets ready.
        self._workers = [self._start() for _ in range(workers)]

    def _start_method(self) -> str:
        return "fork" if self._fork and fork_is_safe() else "spawn"

    def _start(self) -> _Worker:
        """A new worker, importing the task modules (`prepare`). Only `warm` loads a tokenizer:
        a replacement may run only order or shard tasks, and a tokenize task loads it itself."""
        worker = _Worker(self._start_method(), self._threads)
        worker.send(self._prepare or _started, None, None)
        return worker

    def warm(self, warm_up: WarmUp) -> None:
        """Queue a tokenizer warm-up per worker ahead of the next tasks; its errors are ignored
        (a task that needs the tokenizer reports them)."""
        if self._prepare is not None:
            for worker in self._workers:
                with suppress(ExecutorError):  # a dead worker: the next run reports it
                    worker.send(self._prepare, warm_up, None)

    def run(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> Generator[tuple[int, Any], None, None]:
        queue = deque(enumerate(items))
        try:
            self._replace_dead()
            for worker in self._workers:
                self._feed(worker, fn, queue)
            while any(worker.owed for worker in self._workers):
                for connection in wait([worker.connection for worker in self._workers if worker.owed]):
                    worker = next(worker for worker in self._workers if worker.connection is connection)
                    index, succeeded, value = worker.receive()
                    if index is not None:
                        worker = self._recycled(worker)
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

    def _recycled(self, worker: _Worker) -> _Worker:
        """`worker`, or a fresh process in its place once it has run `recycle_after` tasks."""
        worker.tasks += 1
        if worker.tasks < self.recycle_after or worker.owed or not _may_start_workers():
            return worker
        worker.stop()
        fresh = self._start()
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
        """Reap every worker marked dead (in `_drain`, or by a send that found it gone) and start
        one in its place, when this thread may start workers."""
        if not _may_start_workers():
            return
        for position, worker in enumerate(self._workers):
            if worker.dead:
                worker.stop()
                self._workers[position] = self._start()

    def pids(self) -> list[int]:
        """The worker processes' ids (tests signal them)."""
        return [worker.process.pid for worker in self._workers if worker.process.pid is not None]

    def close(self) -> None:
        for worker in self._workers:
            worker.stop()
        self._workers = []
