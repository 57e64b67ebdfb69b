"""Workers give free memory back after every task, whether it returned or raised; the local
pool replaces each worker after a fixed number of tasks, survives a worker's death and passes
items and results larger than a pipe's buffer."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from prep import memory
from prep.errors import ExecutorError
from prep.runner.executors import pool, worker
from prep.runner.executors.base import WarmUp


def test_every_task_ends_by_releasing_free_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(worker, "release_free_memory", lambda: calls.append("released"))
    assert worker.call_task(lambda item: item * 2, 21) == 42
    with pytest.raises(ValueError, match="bad"):
        worker.call_task(lambda item: (_ for _ in ()).throw(ValueError("bad")), 0)
    assert calls == ["released", "released"]


def test_releasing_needs_neither_arrow_nor_glibc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "pyarrow", raising=False)
    monkeypatch.setattr(memory, "_malloc_trim", lambda: None)
    memory.release_free_memory()  # nothing to call: no error


def test_releasing_trims_the_c_heap_and_arrow_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    import pyarrow as pa

    trimmed: list[int] = []
    monkeypatch.setattr(memory, "_malloc_trim", lambda: trimmed.append)
    released: list[bool] = []

    class Pool:
        def release_unused(self) -> None:
            released.append(True)

    monkeypatch.setattr(pa, "default_memory_pool", lambda: Pool())
    memory.release_free_memory()
    assert trimmed == [0] and released == [True]


def _pid_of_worker(item: int) -> tuple[int, int]:
    return item, os.getpid()


def _echo(item: bytes) -> bytes:
    return item[::-1]


def _kill_self(item: int) -> int:
    if item == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.2)
    return item


def _unpicklable(item: int) -> object:
    return threading.Lock()


def _prepare_slowly(warm: WarmUp | None) -> None:
    time.sleep(0.3 if warm is not None else 0)


def test_each_worker_is_replaced_after_its_quota_of_tasks() -> None:
    """No process runs more than `recycle_after` tasks; every task still runs once."""
    executor = pool.LocalExecutor(2, recycle_after=3)
    try:
        results = sorted(executor.run(_pid_of_worker, list(range(20))))
        assert [index for index, _ in results] == list(range(20))
        assert [item for _, (item, _) in results] == list(range(20))
        per_process: dict[int, int] = {}
        for _, (_, pid) in results:
            per_process[pid] = per_process.get(pid, 0) + 1
        assert max(per_process.values()) <= 3 and len(per_process) >= 7
        assert executor.replaced >= 5 and len(executor.pids()) == 2
        assert not set(executor.pids()) & {pid for pid, count in per_process.items() if count == 3}
    finally:
        executor.close()


def test_a_killed_worker_fails_the_run_and_the_pool_goes_on() -> None:
    executor = pool.LocalExecutor(2)
    try:
        with pytest.raises(ExecutorError, match="a worker process died"):
            list(executor.run(_kill_self, [0, 1, 2, 3]))
        assert sorted(executor.run(_kill_self, [0, 2])) == [(0, 0), (1, 2)]
    finally:
        executor.close()


def test_a_result_that_cannot_be_sent_back_is_an_error_not_a_dead_pool() -> None:
    executor = pool.LocalExecutor(1)
    try:
        with pytest.raises(RuntimeError, match="could not be sent back"):
            list(executor.run(_unpicklable, [0]))
        assert list(executor.run(str, [5])) == [(0, "5")]
    finally:
        executor.close()


def test_items_and_results_larger_than_a_pipe_pass_while_warm_ups_are_queued() -> None:
    """Regression guard: the driver sends a worker a task only when it owes no reply, since a
    large task sent behind a slow warm-up would block the driver while other workers finish."""
    executor = pool.LocalExecutor(2, _prepare_slowly, recycle_after=2)
    try:
        executor.warm(WarmUp("tokenizer.json", "0" * 64, "<eos>", False, "fast"))
        items = [bytes([index]) * (3 << 20) for index in range(7)]
        results = dict(executor.run(_echo, items))
        assert results == {index: item[::-1] for index, item in enumerate(items)}
        assert executor.replaced >= 2
    finally:
        executor.close()


def test_closing_reaps_every_worker() -> None:
    executor = pool.LocalExecutor(2, recycle_after=1)
    list(executor.run(str, [1, 2, 3]))
    pids = executor.pids()
    executor.close()
    for pid in pids:
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


def _refuse_to_load() -> object:
    raise ValueError("cannot be rebuilt here")


class _BreaksOnLoad:
    """An item that pickles, but raises when a worker unpickles it."""

    def __reduce__(self) -> tuple[object, tuple[()]]:
        return _refuse_to_load, ()


def test_a_task_the_worker_cannot_unpickle_is_that_tasks_error() -> None:
    executor = pool.LocalExecutor(1)
    try:
        with pytest.raises(ValueError, match="cannot be rebuilt here"):
            list(executor.run(str, [_BreaksOnLoad()]))
        assert list(executor.run(str, [7])) == [(0, "7")]
    finally:
        executor.close()


def test_workers_are_replaced_only_from_the_main_thread() -> None:
    """A worker dies with the thread that started it: one started by a thread that then ends
    (the build hashes inputs on a side thread while it re-checks the latest snapshot on the
    workers) would be killed, and the next run would fail with "a worker process died"."""
    executor = pool.LocalExecutor(2, recycle_after=1)
    try:
        found: list[list[tuple[int, str]]] = []
        side = threading.Thread(target=lambda: found.append(sorted(executor.run(str, list(range(6))))))
        side.start()
        side.join()
        assert found == [[(index, str(index)) for index in range(6)]] and executor.replaced == 0
        time.sleep(0.2)
        assert sorted(executor.run(str, list(range(6)))) == [(index, str(index)) for index in range(6)]
        assert executor.replaced >= 4
    finally:
        executor.close()


def test_a_dead_worker_is_replaced_by_the_next_run_from_the_main_thread() -> None:
    executor = pool.LocalExecutor(1)
    try:
        errors: list[BaseException] = []

        def killing() -> None:
            try:
                list(executor.run(_kill_self, [1]))
            except ExecutorError as exc:
                errors.append(exc)

        side = threading.Thread(target=killing)
        side.start()
        side.join()
        assert len(errors) == 1
        assert list(executor.run(str, [3])) == [(0, "3")]
    finally:
        executor.close()


def test_workers_killed_while_idle_are_replaced_before_the_next_run() -> None:
    """No task was lost: the next run starts new workers instead of failing once per dead worker."""
    executor = pool.LocalExecutor(2)
    try:
        assert sorted(executor.run(str, [1, 2])) == [(0, "1"), (1, "2")]
        for pid in executor.pids():
            os.kill(pid, signal.SIGKILL)
        time.sleep(0.3)  # dead, their ends of the pipes closed (zombies until the pool reaps them)
        assert sorted(executor.run(str, [3, 4])) == [(0, "3"), (1, "4")]
    finally:
        executor.close()


def test_a_worker_found_dead_only_by_sending_it_a_task_fails_the_run_with_the_one_line_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """It died between the pool's look and the send. Before: a raw BrokenPipeError."""
    executor = pool.LocalExecutor(1)
    try:
        assert list(executor.run(str, [1])) == [(0, "1")]
        (pid,) = executor.pids()
        os.kill(pid, signal.SIGKILL)
        time.sleep(0.3)
        monkeypatch.setattr(executor._workers[0].process, "is_alive", lambda: True)  # noqa: SLF001
        with pytest.raises(ExecutorError, match="a worker process died"):
            list(executor.run(str, [2]))
        assert list(executor.run(str, [3])) == [(0, "3")]
    finally:
        executor.close()


def test_a_forked_idle_worker_ends_quietly_on_sigterm() -> None:
    """Regression: a forked worker inherits the CLI's SIGTERM handler (raise Terminated); SIGTERM
    sent to the whole process group (a scheduler's stop) then printed a traceback from every idle
    worker, out of its wait for the next task. It runs in a process of its own: this one may hold
    other tests' threads (a moto server, a library's monitor), and a pool forks only without any."""
    run = subprocess.run([sys.executable, "-c", _SIGTERM_IDLE_FORKED_WORKER], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["fork", "ended"]
    assert "Traceback" not in run.stderr


_SIGTERM_IDLE_FORKED_WORKER = """
import os, signal
from prep.cli.main import _terminate
from prep.runner.executors import pool
signal.signal(signal.SIGTERM, _terminate)
executor = pool.LocalExecutor(1, fork=True)
try:
    print(executor.start_method)
    assert list(executor.run(str, [1])) == [(0, "1")]
    (pid,) = executor.pids()
    os.kill(pid, signal.SIGTERM)
    executor._workers[0].process.join(10)
    print("running" if executor._workers[0].process.is_alive() else "ended")
finally:
    executor.close()
"""


def test_sigterm_landing_while_a_worker_sends_its_reply_ends_it_quietly() -> None:
    """Regression: SIGTERM to the process group just as a forked worker sent a task's reply (the
    driver had read it, the worker had not yet left `send`) raised the inherited Terminated out of
    the reply and printed a traceback; only a wait for the next message was guarded."""
    run = subprocess.run([sys.executable, "-c", _SIGTERM_WHILE_SENDING], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["sent"]
    assert "Traceback" not in run.stderr


_SIGTERM_WHILE_SENDING = """
import os, pickle
from prep.cli.main import Terminated
from prep.runner.executors import worker

class Interrupted:
    def recv_bytes(self):
        return pickle.dumps((str, 1))
    def send(self, reply):
        print("sent", flush=True)
        raise Terminated()

worker.serve(Interrupted(), 1, os.getppid())
print("not ended")
"""


def test_a_worker_whose_driver_closes_its_pipe_mid_task_ends_quietly(capfd: pytest.CaptureFixture[str]) -> None:
    """Regression: a worker stopped while a task ran (the pool closed after Ctrl-C, say) met the
    closed pipe sending the result, tried again with an error and printed two BrokenPipeError
    tracebacks to the user's terminal."""
    started = pool._Worker.start("spawn", 1)  # noqa: SLF001
    try:
        started.send(pool._started, None, None)  # noqa: SLF001
        assert started.receive()[1]
        started.send(time.sleep, 1.5, 0)
        time.sleep(0.5)  # the task is running
        started.connection.close()
        started.process.join(20)
        assert started.process.exitcode == 0  # type: ignore[attr-defined]
    finally:
        if started.process.is_alive():
            started.process.kill()
    assert "Traceback" not in capfd.readouterr().err
