"""The worker's side of the local pool: the loop a worker process runs (one message, one reply),
its start-up (dies with its parent, Ctrl-C ignored while idle) and its quick exit. Shared by the
workers the pool starts itself and those its zygote forks (prep.runner.executors.zygote)."""

from __future__ import annotations

import atexit
import ctypes
import os
import pickle
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from multiprocessing.connection import Connection
from typing import Any

from prep.runner.executors.base import release_free_memory, transportable

PR_SET_PDEATHSIG = 1  # linux/prctl.h
_CTRL_C = {"interrupts": True}  # whether Ctrl-C interrupts a task (not if the driver was started ignoring it)


def die_with(parent: int) -> None:
    """Have the kernel kill this process when its parent (the driver, or the zygote that forked it)
    dies (Linux). Otherwise a driver killed by SIGKILL (or any signal it does not handle) leaves its
    workers waiting forever on a task queue their forked siblings keep open, each holding its
    tokenizer and memory."""
    if sys.platform != "linux":
        return
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return
    # Hazard: the kernel ties this to the thread that started the worker, so the pool must be
    # made (its workers all start in __init__) by a thread that outlives it: the driver's main one.
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # it died before the call: no signal will come
        os._exit(1)


def init_worker(threads: int, parent: int, interruptible: bool = True) -> None:
    """Set up a worker (or the zygote): dies with `parent`, caps the tokenizer's threads, ignores
    Ctrl-C while idle, and during tasks too unless `interruptible` (the driver's own disposition:
    a build started with Ctrl-C ignored, as a shell starts a background job, must not lose a task
    to a Ctrl-C meant for the foreground)."""
    die_with(parent)
    _CTRL_C["interrupts"] = interruptible
    os.environ["RAYON_NUM_THREADS"] = str(threads)
    os.environ["TOKENIZERS_PARALLELISM"] = "true" if threads > 1 else "false"
    atexit.register(exit_now)
    # Ctrl-C reaches every worker. An idle one ignores it: dying of it would break the pool,
    # which then kills the busy workers before they remove their partial files (see call_task).
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@contextmanager
def sigint_ignored() -> Iterator[None]:
    """Ignore Ctrl-C in this process meanwhile (only the main thread may change handlers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def exit_now() -> None:
    """End a worker without tearing down its interpreter: a worker's results are all sent by
    the time it exits, and finalizing the tokenizer, Arrow and numpy costs tenths of a second."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def call_task(fn: Callable[[Any], Any], item: Any) -> Any:
    """Run a task in a worker: interruptible by Ctrl-C, raising only exceptions the driver can unpickle."""
    # An exception that cannot be rebuilt from its pickle would break the whole pool ("a worker
    # process died"). KeyboardInterrupt passes as it is, after the task's own cleanup.
    idle = signal.signal(signal.SIGINT, signal.default_int_handler if _CTRL_C["interrupts"] else signal.SIG_IGN)
    try:
        return fn(item)
    except Exception as exc:
        raise transportable(exc) from None
    finally:
        signal.signal(signal.SIGINT, idle)
        release_free_memory()


def serve(connection: Connection, threads: int, parent: int, interruptible: bool = True) -> None:
    """A worker's life (it dies with `parent`): run each (function, item) the driver sends and send
    back (True, result) or (False, exception) until it sends None or goes away."""
    init_worker(threads, parent, interruptible)
    # SIGTERM or Ctrl-C outside a task (waiting, unpickling, sending a reply) ends the worker
    # quietly: a forked worker inherits the CLI's handler, which raises Terminated wherever it lands.
    with suppress(KeyboardInterrupt):
        serve_messages(connection)
    exit_now()


def serve_messages(connection: Connection) -> None:
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
            if not answer(connection, (False, transportable(exc))):
                return
            continue
        if message is None:
            return
        fn, item = message
        try:
            reply: tuple[bool, Any] = (True, call_task(fn, item))
        except BaseException as exc:  # noqa: BLE001 -- every failure, Ctrl-C too, goes back to the driver
            reply = (False, exc)
        if not answer(connection, reply):
            return


def answer(connection: Connection, reply: tuple[bool, Any]) -> bool:
    """Send a reply; False when the driver's end is closed (it stopped this worker mid-task, or is
    gone): there is no one left to tell, so the worker ends quietly rather than with a traceback."""
    try:
        connection.send(reply)
    except OSError:
        return False
    except Exception as exc:  # noqa: BLE001 -- a result that cannot be pickled (nothing was sent)
        return answer(connection, (False, RuntimeError(f"a task's result could not be sent back: {exc}")))
    return True
