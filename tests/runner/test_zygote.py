"""The local pool's zygote: once a warmed pool's workers have run `fresh_after` tasks, it forks
their replacements, which hold the imports and the tokenizer already; it dies with the driver,
takes its workers with it, and a lost zygote leaves the pool spawning as before."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from prep.config import load_pipeline
from prep.errors import ExecutorError
from prep.progress import Progress
from prep.runner.build import build
from prep.runner.executors import zygote
from prep.runner.executors.base import WarmUp
from prep.runner.executors.pool import LocalExecutor
from prep.runner.tasks import prepare_worker
from prep.storage import LocalStore
from prep.tokenizer import load_tokenizer
from tests.helpers import make_records, write_jsonl, write_pipeline
from tests.runner.buildsupport import build_local
from tests.runner.test_executors import _kill_self

pytestmark = pytest.mark.skipif(not zygote.supported(), reason="the zygote needs Linux pidfds")


def _engines_at_start(item: int) -> tuple[int, int, int]:
    """(pid, parent pid, tokenizer engines this worker holds before the task does anything)."""
    from prep.stages import tokenize

    return os.getpid(), os.getppid(), len(tokenize._ENGINES)  # noqa: SLF001


def _warm_up(tokenizer_path: Path) -> WarmUp:
    info = load_tokenizer(tokenizer_path, "<|endoftext|>")[1]
    return WarmUp(str(tokenizer_path), info.sha256, "<|endoftext|>", True, "tokenizers")


def _fork_fails(*_: object) -> int:
    raise OSError(11, "Resource temporarily unavailable")


def _prepare_without_fork(warm: WarmUp | None) -> None:
    """A prepare function after which this process cannot fork (run by the zygote too)."""
    os.fork = _fork_fails


@contextmanager
def _zygote_pool(warm_up: WarmUp) -> Iterator[LocalExecutor]:
    """A pool of two warmed with `warm_up` whose workers go to the zygote after every task, with the zygote ready."""
    executor = LocalExecutor(2, prepare_worker, fresh_after=1)
    try:
        executor.warm(warm_up)
        list(executor.run(_engines_at_start, list(range(8))))  # a run long enough to start it
        deadline = time.monotonic() + 60
        # Waiting idle, rather than running tasks until it forks, spawns no replacement meanwhile
        # (each would import everything beside the zygote's own imports: seconds on a loaded machine).
        while executor._zygote is None or not executor._zygote.ready():  # noqa: SLF001
            assert time.monotonic() < deadline, "the zygote never got ready"
            time.sleep(0.05)
        # One more run with the zygote up replaces every worker by its fork (each lives one task).
        list(executor.run(_engines_at_start, list(range(4))))
        assert executor.forked >= 2
        yield executor
    finally:
        executor.close()


@pytest.fixture
def pool(tokenizer_path: Path) -> Iterator[LocalExecutor]:
    """A warmed forking pool (`_zygote_pool`)."""
    with _zygote_pool(_warm_up(tokenizer_path)) as executor:
        yield executor


def _kernel_at_start(item: int) -> tuple[int, bool, bool]:
    """(parent pid, whether this worker holds the compiled MinHash kernel, and the case table of the
    compiled normalization, before the task does anything)."""
    from prep.neardup import kernel, normalization

    return os.getppid(), kernel.loaded(), normalization.case_table.cache_info().currsize > 0


_KERNEL_DRIVER = """
import dataclasses, json, sys
from pathlib import Path
from prep.neardup import kernel
from prep.runner.executors.pool import LocalExecutor
from prep.runner.tasks import prepare_worker
from tests.runner.test_zygote import _kernel_at_start, _warm_up
seen = []
for minhash in (True, False):
    executor = LocalExecutor(2, prepare_worker, fork=True)  # as the CLI makes it
    executor.warm(dataclasses.replace(_warm_up(Path(sys.argv[1])), minhash=minhash))
    zygote_pid = executor._zygote.process.pid
    seen.append([[parent == zygote_pid, loaded, table] for _, (parent, loaded, table) in
                 executor.run(_kernel_at_start, list(range(4)))])
    executor.close()
print(json.dumps({"driver": kernel.loaded(), "pools": seen}))
"""


@pytest.mark.skipif(importlib.util.find_spec("numba") is None, reason="numba is not installed (the `fast` extra)")
def test_a_near_dup_warm_up_has_the_zygote_load_the_minhash_kernel_once_for_every_fork(tokenizer_path: Path) -> None:
    """In a driver of its own (one that never loaded the kernel, as prep's does not): the workers a
    zygote warmed for near-dup forks hold it (and the case table) at their first task, those of
    another zygote do not."""
    from tests.helpers import prep_env

    done = subprocess.run([sys.executable, "-c", _KERNEL_DRIVER, str(tokenizer_path)], capture_output=True,
                          text=True, env=prep_env(), timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"driver": False, "pools": [[[True, True, True]] * 4, [[True, False, False]] * 4]}


def test_a_run_too_short_for_any_worker_to_age_much_starts_no_zygote(tokenizer_path: Path) -> None:
    """Fewer than `fresh_after` tasks per worker left when one reaches its quota: a zygote's start
    (imports and a tokenizer load) would cost more than its forks save (a short build)."""
    executor = LocalExecutor(2, prepare_worker, fresh_after=2)
    try:
        executor.warm(_warm_up(tokenizer_path))
        for _ in range(10):
            assert sorted(executor.run(str, list(range(5)))) == [(index, str(index)) for index in range(5)]
        assert executor._zygote is None and executor.replaced == 0  # noqa: SLF001
        assert sorted(executor.run(str, list(range(12))))  # 4 tasks per worker still queued: started
        assert executor._zygote is not None  # noqa: SLF001
    finally:
        executor.close()


def test_replacements_are_forked_by_the_zygote_and_hold_the_tokenizer(pool: LocalExecutor) -> None:
    assert pool._zygote is not None  # noqa: SLF001
    zygote_pid = pool._zygote.process.pid  # noqa: SLF001
    forked = pool.forked
    results = [value for _, value in sorted(pool.run(_engines_at_start, list(range(12))))]
    assert pool.forked >= forked + 10
    assert {parent for _, parent, _ in results} == {zygote_pid}
    assert {engines for _, _, engines in results} == {1}  # loaded by the zygote, not by the task
    per_process: dict[int, int] = {}
    for pid, _, _ in results:
        per_process[pid] = per_process.get(pid, 0) + 1
    assert max(per_process.values()) == 1  # fresh_after=1: a new process for every task


def test_a_killed_forked_worker_fails_the_run_with_the_one_line_error_and_the_pool_goes_on(
        pool: LocalExecutor) -> None:
    with pytest.raises(ExecutorError, match="a worker process died"):
        list(pool.run(_kill_self, [0, 1, 2, 3]))
    assert sorted(pool.run(_kill_self, [0, 2])) == [(0, 0), (1, 2)]


def test_forked_workers_killed_while_idle_are_replaced_before_the_next_run(pool: LocalExecutor) -> None:
    for pid in pool.pids():
        os.kill(pid, signal.SIGKILL)
    time.sleep(0.3)
    forked = pool.forked
    assert sorted(pool.run(str, [1, 2])) == [(0, "1"), (1, "2")]
    assert pool.forked >= forked + 2


def test_a_lost_zygote_takes_its_workers_and_the_pool_spawns_their_replacements(pool: LocalExecutor) -> None:
    assert pool._zygote is not None  # noqa: SLF001
    os.kill(pool._zygote.process.pid, signal.SIGKILL)  # noqa: SLF001
    pool._zygote.process.join(10)  # noqa: SLF001
    time.sleep(0.3)  # its workers die with it (their parent-death signal): replaced, spawned
    forked = pool.forked
    results = [value for _, value in pool.run(_engines_at_start, list(range(6)))]
    assert {parent for _, parent, _ in results} == {os.getpid()}  # spawned by the pool itself
    assert pool.forked == forked and pool._zygote.broken  # noqa: SLF001


def test_closing_reaps_the_zygote_and_every_worker_it_forked(pool: LocalExecutor) -> None:
    """A container's init may never reap an orphan: the zygote reaps its workers before it ends."""
    assert pool._zygote is not None  # noqa: SLF001
    pids = [*pool.pids(), pool._zygote.process.pid]  # noqa: SLF001
    pool.close()
    time.sleep(0.3)
    assert all(not Path(f"/proc/{pid}").exists() for pid in pids)


def test_sigterm_is_ignored_by_the_zygote_and_ends_an_idle_forked_worker_quietly(pool: LocalExecutor,
                                                                                capfd: pytest.CaptureFixture[str]) -> None:
    """SIGTERM to the process group (a scheduler's stop) reaches the zygote too: dying of it would
    kill every worker mid-task (their parent-death signal) before they clean up."""
    assert pool._zygote is not None  # noqa: SLF001
    os.kill(pool._zygote.process.pid, signal.SIGTERM)  # noqa: SLF001
    worker = pool._workers[0]  # noqa: SLF001
    os.kill(worker.process.pid or 0, signal.SIGTERM)
    worker.process.join(10)
    assert not worker.process.is_alive() and pool._zygote.ready()  # noqa: SLF001
    forked = pool.forked
    assert sorted(pool.run(str, list(range(4)))) == [(index, str(index)) for index in range(4)]
    assert pool.forked > forked
    assert "Traceback" not in capfd.readouterr().err


def test_a_driver_killed_by_sigkill_takes_the_zygote_and_its_workers_down(tokenizer_path: Path) -> None:
    driver = subprocess.Popen([sys.executable, "-c", _DRIVER, str(tokenizer_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert driver.stdout is not None
        pids = [int(pid) for pid in driver.stdout.readline().split()]
        assert len(pids) == 3 and all(Path(f"/proc/{pid}").exists() for pid in pids)
    finally:
        driver.kill()
        driver.communicate(timeout=60)
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in pids):
        assert time.monotonic() < deadline, "the zygote or its workers outlived the driver"
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    """Running (a zombie waits only to be reaped: it holds nothing)."""
    try:
        return " Z " not in Path(f"/proc/{pid}/stat").read_text().split(")", 1)[1][:4]
    except FileNotFoundError:
        return False


_DRIVER = """
import sys, time
from pathlib import Path
from tests.runner.test_zygote import _engines_at_start, _warm_up
from prep.runner.executors.pool import LocalExecutor
from prep.runner.tasks import prepare_worker
executor = LocalExecutor(2, prepare_worker, fresh_after=1)
executor.warm(_warm_up(Path(sys.argv[1])))
while executor.forked < 2:
    list(executor.run(_engines_at_start, list(range(8))))
    time.sleep(0.05)
print(*executor.pids(), executor._zygote.process.pid, flush=True)
time.sleep(120)
"""


def test_workers_forked_by_the_zygote_build_the_default_pools_snapshot(tmp_path: Path, tokenizer_path: Path) -> None:
    """A new worker for every task, forked with the tokenizer the zygote loaded: the same bytes.
    The second build on the same pool finds its zygote (started by the first) ready."""
    for name, count in (("a", 60), ("b", 45), ("c", 30)):
        write_jsonl(tmp_path / "corpus" / f"{name}.jsonl", make_records(count, seed=len(name) + count, prefix=name))
    pipeline = write_pipeline(tmp_path, tokenizer_path, ["corpus"])
    reference = build_local(pipeline, tmp_path / "reference", workers=2)
    executor = LocalExecutor(2, prepare_worker, fresh_after=1)
    try:
        first = build(load_pipeline(pipeline), LocalStore(tmp_path / "first"), executor, (), Progress(quiet=True))
        deadline = time.monotonic() + 60
        while executor._zygote is None or not executor._zygote.ready():  # noqa: SLF001 -- started by the first build
            assert time.monotonic() < deadline, "the zygote never got ready"
            time.sleep(0.05)
        forked = executor.forked
        second = build(load_pipeline(pipeline), LocalStore(tmp_path / "second"), executor, (), Progress(quiet=True))
    finally:
        executor.close()
    assert first.snapshot.id == second.snapshot.id == reference.snapshot.id
    tasks = sum(stage.ran for stage in second.stages.values())
    assert executor.forked - forked >= tasks // 2  # a run on a side thread replaces no worker


def test_a_warm_up_for_another_tokenizer_retires_the_zygote_without_killing_its_workers(
        pool: LocalExecutor, tmp_path: Path) -> None:
    """Its workers die with it: it may end only with the pool."""
    assert pool._zygote is not None  # noqa: SLF001
    old = pool._zygote.process  # noqa: SLF001
    other = tmp_path / "other.json"
    other.write_bytes(Path(pool._warm_up.tokenizer_path).read_bytes().replace(b'"<|endoftext|>"', b'"<|endoftext|>" '))  # type: ignore[union-attr]  # noqa: SLF001
    workers = pool.pids()
    pool.warm(_warm_up(other))
    time.sleep(0.3)
    assert old.is_alive() and pool._zygote is None  # noqa: SLF001
    assert all(_alive(pid) for pid in workers)
    pool.close()
    assert not old.is_alive()


def test_a_zygote_that_cannot_fork_says_so_and_the_pool_spawns_instead(tokenizer_path: Path,
                                                                      capfd: pytest.CaptureFixture[str]) -> None:
    executor = LocalExecutor(2, _prepare_without_fork, fresh_after=1)
    try:
        executor.warm(_warm_up(tokenizer_path))
        deadline = time.monotonic() + 60
        while executor._zygote is None or not executor._zygote.broken:  # noqa: SLF001
            assert time.monotonic() < deadline, "the zygote was never asked to fork"
            assert sorted(executor.run(str, list(range(8)))) == [(index, str(index)) for index in range(8)]
            time.sleep(0.05)
        assert executor.forked == 0
        assert sorted(executor.run(str, list(range(6)))) == [(index, str(index)) for index in range(6)]
        assert executor.replaced >= 1  # the one whose fork failed: spawned
    finally:
        executor.close()
    assert "Traceback" not in capfd.readouterr().err


# ------------------------------------------------------------------ a forking pool starts with its zygote

_FORKING_DRIVER = """
import json, os, signal, sys, time
from pathlib import Path
from prep.runner.executors import pool, zygote
from prep.runner.tasks import prepare_worker
from tests.runner.test_zygote import _engines_at_start, _slow_prepare, _warm_up
mode, tokenizer = sys.argv[1], Path(sys.argv[2])
zygote.FORK_SECONDS = 0.5  # a zygote slower than this to answer a replacement's fork is given up on
prepare = _slow_prepare if mode == "slow" else prepare_worker
executor = pool.LocalExecutor(2, prepare, fork=True)
first = executor._zygote.process.pid if executor._zygote is not None else None
if mode == "lost":
    os.kill(first, signal.SIGKILL)
    executor._zygote.process.join(10)
executor.warm(_warm_up(tokenizer))
if mode == "thread":  # as a build's first tasks may run, on a side thread while the driver hashes inputs
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(1) as side:
        ran = side.submit(lambda: sorted(executor.run(_engines_at_start, list(range(4))))).result()
else:
    ran = sorted(executor.run(_engines_at_start, list(range(4))))
results = [value for _, value in ran]
print(json.dumps({"driver": os.getpid(), "zygote": first, "results": results, "forked": executor.forked,
                  "replaced": executor.replaced, "alive": executor._zygote.process.is_alive()}), flush=True)
executor.close()
"""


def _slow_prepare(warm: WarmUp | None) -> None:
    """`prepare_worker`, slower than the driver's patience with a replacement's fork."""
    time.sleep(1.0)
    prepare_worker(warm)


def _forking_pool(mode: str, tokenizer_path: Path) -> dict[str, Any]:
    """What a pool made as the CLI makes it (forking, in a driver running no other thread) reports."""
    from tests.helpers import prep_env

    done = subprocess.run([sys.executable, "-c", _FORKING_DRIVER, mode, str(tokenizer_path)], capture_output=True,
                          text=True, env=prep_env(), timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def test_a_forking_pool_forks_every_worker_from_one_zygote_that_loaded_the_tokenizer_once(tokenizer_path: Path) -> None:
    """The CLI's pool: one process imports and loads the tokenizer; its workers are forks of it,
    and a run too short to age them replaces none."""
    report = _forking_pool("plain", tokenizer_path)
    assert report["zygote"] is not None and report["alive"]
    assert {parent for _, parent, _ in report["results"]} == {report["zygote"]}
    assert {engines for _, _, engines in report["results"]} == {1}  # loaded before the fork, not by a task
    assert report["forked"] == 0 and report["replaced"] == 0  # the first workers are no replacements


def test_the_first_workers_wait_for_a_zygote_slower_than_a_replacements_patience(tokenizer_path: Path) -> None:
    """Its imports and a large tokenizer may take longer than the FORK_SECONDS a replacement waits
    for a fork: the first workers wait for it rather than give up and load everything again."""
    report = _forking_pool("slow", tokenizer_path)
    assert {parent for _, parent, _ in report["results"]} == {report["zygote"]}
    assert {engines for _, _, engines in report["results"]} == {1}


def test_a_forking_pool_forks_its_first_workers_for_a_run_on_a_side_thread(tokenizer_path: Path) -> None:
    """Regression: the first run of a rebuild may come from the thread that checks the previous
    snapshot while the driver hashes inputs; starting no worker there failed the build with "no
    worker process is left". A fork by the zygote is safe from any thread of the driver."""
    report = _forking_pool("thread", tokenizer_path)
    assert {parent for _, parent, _ in report["results"]} == {report["zygote"]}


def test_a_forking_pool_whose_zygote_is_lost_at_once_starts_its_workers_itself(tokenizer_path: Path) -> None:
    report = _forking_pool("lost", tokenizer_path)
    assert {parent for _, parent, _ in report["results"]} == {report["driver"]}
    assert len(report["results"]) == 4 and {engines for _, _, engines in report["results"]} == {1}  # warmed all the same


_UNCLOSED = """
from prep.runner.executors import pool
from prep.runner.tasks import prepare_worker
executor = pool.LocalExecutor(2, prepare_worker, fork=True)
assert sorted(executor.run(str, [1, 2])) == [(0, "1"), (1, "2")]
print(*executor.pids(), executor._zygote.process.pid, flush=True)
raise SystemExit("ended without closing its pool")
"""


def test_a_program_that_never_closes_its_forking_pool_still_ends_and_takes_the_pool_with_it() -> None:
    """Regression: at exit, multiprocessing sends its daemonic children SIGTERM, which the zygote
    ignores, and then waits for them: the program hung forever."""
    from tests.helpers import prep_env

    done = subprocess.run([sys.executable, "-c", _UNCLOSED], capture_output=True, text=True, env=prep_env(),
                          timeout=60, check=False)
    assert done.returncode == 1 and "ended without closing its pool" in done.stderr, done.stderr
    pids = [int(pid) for pid in done.stdout.split()]
    assert len(pids) == 3
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in pids):
        assert time.monotonic() < deadline, "the pool outlived its program"
        time.sleep(0.05)


def _nap(marker: str) -> str:
    """A task that says it started (a file), then runs a while."""
    Path(marker).touch()
    time.sleep(1.5)
    return "done"


@pytest.mark.parametrize("with_zygote", [True, False])
def test_a_driver_started_ignoring_ctrl_c_keeps_its_tasks_running_through_one(tmp_path: Path, with_zygote: bool) -> None:
    """Regression: a build a script started in the background (Ctrl-C ignored, as the shell sets
    it) lost its running tasks to a Ctrl-C typed at the foreground, because a worker always
    turned Ctrl-C on for the length of a task. A worker now takes the driver's disposition."""
    from tests.helpers import prep_env

    prepare = "prepare_worker" if with_zygote else "None"
    script = (
        "import signal, sys\n"
        "signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a shell starts a background job\n"
        "from prep.runner.executors.pool import LocalExecutor\n"
        "from prep.runner.tasks import prepare_worker\n"
        "from tests.runner.test_zygote import _nap\n"
        f"executor = LocalExecutor(2, {prepare}, fork=True)\n"
        "print(sorted(executor.run(_nap, [sys.argv[1] + '.0', sys.argv[1] + '.1'])), flush=True)\n"
        "executor.close()\n")
    marker = tmp_path / "started"
    driver = subprocess.Popen([sys.executable, "-c", script, str(marker)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=prep_env(), start_new_session=True)
    deadline = time.monotonic() + 60
    while not (Path(f"{marker}.0").exists() and Path(f"{marker}.1").exists()):
        assert time.monotonic() < deadline and driver.poll() is None, "the tasks never started"
        time.sleep(0.02)
    os.killpg(driver.pid, signal.SIGINT)  # the whole group, as a terminal's Ctrl-C
    out, err = driver.communicate(timeout=60)
    assert driver.returncode == 0, err
    assert out.strip() == "[(0, 'done'), (1, 'done')]"


_FORK_RACE = """
import os, signal, sys, time
from multiprocessing import Pipe
from prep.runner.executors import zygote
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # as the zygote holds it
here = os.getpid()
ours, theirs = Pipe()


class SlowInTheChild:
    '''The zygote's control pipe, whose close (the child's first step) takes a second in the child.'''
    def close(self):
        if os.getpid() != here:
            time.sleep(1.0)
        ours.close()

    def send(self, value):
        ours.send(value)

    def fileno(self):
        return ours.fileno()


zygote._fork(SlowInTheChild(), 1, signal.SIG_DFL, True)
pid = theirs.recv()
os.kill(pid, signal.SIGTERM)  # while the child still holds the zygote's SIG_IGN
deadline = time.monotonic() + 10
while time.monotonic() < deadline:
    ended, status = os.waitpid(pid, os.WNOHANG)
    if ended:
        print(os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM)
        break
    time.sleep(0.05)
else:
    os.kill(pid, signal.SIGKILL)
    print("alive")
"""


def test_a_sigterm_reaching_a_worker_while_it_is_being_forked_is_not_lost() -> None:
    """A forked worker inherits the zygote's SIG_IGN until it restores its own handler: a SIGTERM
    in that window (a scheduler's stop of the process group) used to be ignored, leaving it alive."""
    from tests.helpers import prep_env

    done = subprocess.run([sys.executable, "-c", _FORK_RACE], capture_output=True, text=True, env=prep_env(),
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"
