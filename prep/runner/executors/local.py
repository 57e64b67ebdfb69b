"""The local executor: a pool of worker processes on this machine, spawned, or forked from a
driver with no other thread (the CLI: a forked worker skips starting an interpreter and
importing prep again, a few tenths of a second before its first task).

Each worker caps the tokenizer's
thread pool so that total threads stay near the core count. A task's exception travels back
pickled; `_call` makes sure it can (a prep error arrives as the same one-line error).
"""

from __future__ import annotations

import atexit
import ctypes
import os
import pickle
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Generator, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from multiprocessing import get_context
from typing import Any

from prep.errors import ExecutorError, PrepError
from prep.runner.executors.base import Prepare, WarmUp, release_free_memory


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
        raise _transportable(exc) from None
    finally:
        signal.signal(signal.SIGINT, idle)
        release_free_memory()


def _transportable(exc: Exception) -> Exception:
    """`exc` if it survives a pickle round trip, else a stand-in with its message and exit code."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 -- any failure to round-trip means: send a stand-in
        pass
    if isinstance(exc, PrepError):  # its nearest ancestor built from the message alone
        base = next(cls for cls in type(exc).__mro__ if issubclass(cls, PrepError) and _plain_constructor(cls))
        stand_in: PrepError = base(exc.message)
        stand_in.exit_code = exc.exit_code
        return stand_in
    text = "".join(traceback.format_exception(exc))
    return RuntimeError(f"{type(exc).__module__}.{type(exc).__qualname__} in a worker (not picklable):\n{text}")


def _plain_constructor(cls: type[PrepError]) -> bool:
    """True when `cls` is built from its message alone (no class up to PrepError redefines __init__)."""
    mro = cls.__mro__
    return all("__init__" not in vars(ancestor) for ancestor in mro[:mro.index(PrepError)])


def fork_is_safe() -> bool:
    """Whether this process may fork workers: on Linux, with no other Python thread (a fork copies
    only the calling thread, so a lock another thread held would stay held in the child)."""
    return sys.platform == "linux" and threading.active_count() == 1


class LocalExecutor:
    """A warm pool of `workers` processes, kept for the whole build; forked when `fork` is asked
    for and safe (fork_is_safe), else spawned."""

    shares_filesystem = True
    backend = "local"

    def __init__(self, workers: int, prepare: Prepare | None = None, threads_per_worker: int = 1,
                 fork: bool = False) -> None:
        self.workers = workers
        self._prepare = prepare
        self.start_method = "fork" if fork and fork_is_safe() else "spawn"
        self._pool = ProcessPoolExecutor(max_workers=workers, mp_context=get_context(self.start_method),
                                         initializer=_init_worker, initargs=(threads_per_worker, os.getpid()))
        # Submits start the workers (spawned: one each; forked: all at the first), which import the
        # task modules while the driver gets ready. Workers start with Ctrl-C ignored (an ignored
        # signal stays ignored across fork and exec): one that started before its initializer ran
        # would die of it, with a traceback, breaking the pool. Output still buffered here would be
        # written again by a forked worker.
        sys.stdout.flush()
        sys.stderr.flush()
        with _sigint_ignored():
            for _ in range(workers):
                self._pool.submit(self._prepare or _started, None)

    def warm(self, warm_up: WarmUp) -> None:
        """Queue a tokenizer warm-up per worker ahead of the next tasks; its errors are ignored
        (a task that needs the tokenizer reports them)."""
        if self._prepare is not None:
            for _ in range(self.workers):
                self._pool.submit(self._prepare, warm_up)

    def run(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> Generator[tuple[int, Any], None, None]:
        pending: dict[Future[Any], int] = {}
        queue = list(enumerate(items))
        queue.reverse()
        try:
            while queue or pending:
                while queue and len(pending) < self.workers * 2:
                    index, item = queue.pop()
                    pending[self._pool.submit(_call, fn, item)] = index
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in sorted(done, key=lambda f: pending[f]):
                    index = pending.pop(future)
                    yield index, _result(future)
        finally:
            # Tasks already running go on in their workers: wait for them, so that nothing a
            # failed run started can still write after the caller cleans up.
            running = [future for future in pending if not future.cancel()]
            wait(running)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def _result(future: Future[Any]) -> Any:
    try:
        return future.result()
    except BrokenProcessPool:
        raise ExecutorError("a worker process died (killed, or out of memory); "
                            "rerun to resume from the committed tasks") from None
