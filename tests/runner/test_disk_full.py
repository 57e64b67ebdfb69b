"""A full disk is one `prep: error:` line (exit 4), stages nothing, moves no ref; a rerun converges (issue 11)."""

from __future__ import annotations

import contextlib
import errno
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from prep.errors import PrepError, StorageIOError, StoreError
from prep.runner.executors.pool import LocalExecutor
from prep.storage import LocalStore
from tests.helpers import committed_records, make_records, prep_env, run_prep, write_jsonl, write_pipeline

IO_EXIT = 4  # StorageIOError.exit_code, as README.md and docs/build.md document it


@contextmanager
def _mounted(folder: Path, commands: list[list[str]], needs: str) -> Iterator[Path]:
    """`folder` with what the mount `commands` put there, unmounted after (skips the test, saying
    what it `needs`, where mounting is impossible)."""
    folder.mkdir(parents=True, exist_ok=True)
    try:
        try:
            for command in commands:
                subprocess.run(command, check=True, capture_output=True)
        except (OSError, subprocess.CalledProcessError):
            pytest.skip(needs)
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False, capture_output=True)


def small_tmpfs(folder: Path, size: str) -> contextlib.AbstractContextManager[Path]:
    """A tmpfs of `size` mounted at `folder`."""
    return _mounted(folder, [["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)]],
                    "needs root and tmpfs (mount -t tmpfs)")


def read_only_view(source: Path, folder: Path) -> contextlib.AbstractContextManager[Path]:
    """`source` bind-mounted read-only at `folder`."""
    return _mounted(folder, [["mount", "--bind", str(source), str(folder)],
                             ["mount", "-o", "remount,bind,ro", str(folder)]], "needs root and bind mounts")


def remount(folder: Path, size: str) -> None:
    """Grow (or shrink) a tmpfs in place; its files stay."""
    subprocess.run(["mount", "-o", f"remount,size={size}", str(folder)], check=True, capture_output=True)


def fill_up(folder: Path) -> Path:
    """Write a file until the filesystem holding `folder` has no space left; returns it."""
    filler = folder / "filler"
    with open(filler, "ab", buffering=0) as out:
        try:
            while True:
                out.write(bytes(4096))
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return filler


def staged(store: Path) -> list[str]:
    """Everything a build left in the store's tmp/ (files and folders, recursively)."""
    folder = store / "tmp"
    return sorted(str(path.relative_to(folder)) for path in folder.rglob("*")) if folder.is_dir() else []


def published(store: Path) -> list[str]:
    """Refs and snapshot markers: what a build publishes last."""
    return sorted(str(path.relative_to(store)) for name in ("refs", "snapshots") if (store / name).is_dir()
                  for path in (store / name).rglob("*") if path.is_file())


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory, tokenizer_path: Path) -> tuple[Path, str]:
    """One corpus file (a 1.3 MB intermediate, one shard with a 12 MB .tar) and its clean build's snapshot id."""
    root = tmp_path_factory.mktemp("diskfull")
    write_jsonl(root / "corpus" / "a.jsonl", make_records(4000, seed=1))
    pipeline = write_pipeline(root, tokenizer_path, shard_size="1MB")
    clean = run_prep("build", pipeline, "--store", root / "clean", "--workers", "1").stdout.split()[-1]
    return pipeline, clean


def _expect_disk_full(result: subprocess.CompletedProcess[str], store: Path, *needles: str) -> str:
    assert result.returncode == IO_EXIT, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if not line.startswith("[")]
    assert len(errors) == 1, result.stderr
    line = errors[0]
    assert line.startswith("prep: error: writing " + str(store)), line
    assert line.endswith(": No space left on device"), line
    for needle in needles:
        assert needle in line, line
    assert result.stdout == ""
    assert published(store) == [], "a failed build must not publish anything"
    assert staged(store) == [], "a failed build must remove what it staged"
    return line


@pytest.mark.parametrize(("size", "where"), [("8m", "/tmp/assemble-"), ("1m", "/tmp/tokenize-")],
                         ids=["shard-writer", "tokenize"])
def test_full_disk_is_one_line_and_a_rerun_with_space_converges(project: tuple[Path, str], tmp_path: Path,
                                                                 size: str, where: str) -> None:
    pipeline, clean = project
    with small_tmpfs(tmp_path / "mnt", size) as mount:
        store = mount / "store"
        failed = run_prep("build", pipeline, "--store", store, "--workers", "1", check=False)
        line = _expect_disk_full(failed, store, where)
        assert (".tar:" in line) if where == "/tmp/assemble-" else (".part:" in line)

        remount(mount, "64m")
        rerun = run_prep("build", pipeline, "--store", store, "--workers", "1")
        assert rerun.stdout.split()[-1] == clean
        assert staged(store) == []


def test_full_disk_with_two_workers_leaves_nothing_staged(project: tuple[Path, str], tmp_path: Path) -> None:
    pipeline, clean = project
    with small_tmpfs(tmp_path / "mnt", "4m") as mount:
        store = mount / "store"
        _expect_disk_full(run_prep("build", pipeline, "--store", store, "--workers", "2", check=False), store)
        remount(mount, "64m")
        assert run_prep("build", pipeline, "--store", store, "--workers", "2").stdout.split()[-1] == clean


def test_a_build_that_cannot_write_its_lease_says_so(project: tuple[Path, str], tmp_path: Path) -> None:
    pipeline, _ = project
    with small_tmpfs(tmp_path / "mnt", "1m") as mount:
        store = mount / "store"
        (store / "tmp").mkdir(parents=True)
        fill_up(mount)
        _expect_disk_full(run_prep("build", pipeline, "--store", store, "--workers", "1", check=False), store,
                          "/leases/build/")


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (Linux /proc)."""
    found = []
    for status in Path("/proc").glob("[0-9]*/status"):
        with contextlib.suppress(OSError):
            fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line)
            if int(fields.get("PPid", "0")) == pid:
                found.append(int(status.parent.name))
    return found


def _pool(pid: int, workers: int = 2, timeout: float = 60.0) -> list[int]:
    """The driver's pool once all of it runs: its zygote and the `workers` it forked (the
    driver's children's children), or whatever is there at `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        found = [child for zygote in _children(pid) for child in [zygote, *_children(zygote)]]
        if len(found) >= workers + 1 or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def _gone(pids: list[int], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(_running(pid) for pid in pids):
            return True
        time.sleep(0.05)
    return False


def _running(pid: int) -> bool:
    """Neither gone nor a zombie. One read: a process can vanish between a check that its /proc
    entry exists and a read of its status (regression: the test then failed with FileNotFoundError)."""
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


def test_a_process_that_vanishes_while_it_is_looked_at_counts_as_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its /proc entry still listed, its status already gone: the exit the test waits for."""
    monkeypatch.setattr(Path, "exists", lambda self: True)

    def vanished(self: Path, *args: object, **kwargs: object) -> str:
        raise FileNotFoundError(2, "No such file or directory", str(self))

    monkeypatch.setattr(Path, "read_text", vanished)
    assert _gone([os.getpid()], timeout=1.0)


def _build_until_tokenizing(tmp_path: Path, tokenizer_path: Path) -> tuple[subprocess.Popen[str], list[str], list[int]]:
    write_jsonl(tmp_path / "corpus" / "a.jsonl", make_records(20000, seed=2))
    pipeline = write_pipeline(tmp_path, tokenizer_path, shard_size="1MB")
    process = subprocess.Popen([sys.executable, "-m", "prep.cli.main", "build", str(pipeline), "--store",
                                str(tmp_path / "store"), "--workers", "2"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=prep_env(), start_new_session=True)
    assert process.stderr is not None
    seen = []
    for line in process.stderr:
        seen.append(line)
        if "tokenize: 0/1 tasks" in line:
            break
    pool = _pool(process.pid)
    time.sleep(0.3)  # the task is writing its intermediate (it takes about a second)
    return process, seen, pool


def test_ctrl_c_during_tokenize_leaves_nothing_staged(tmp_path: Path, tokenizer_path: Path) -> None:
    """Ctrl-C to the process group: the busy task removes its partial file and idle workers survive."""
    process, seen, _ = _build_until_tokenizing(tmp_path, tokenizer_path)
    os.killpg(process.pid, signal.SIGINT)
    _, rest = process.communicate(timeout=120)
    stderr = "".join(seen) + rest
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr, stderr
    assert staged(tmp_path / "store") == [] and published(tmp_path / "store") == []


def test_sigterm_to_the_driver_is_one_line_and_leaves_no_worker_or_partial_file(tmp_path: Path,
                                                                                 tokenizer_path: Path) -> None:
    """Regression: SIGTERM (a scheduler's stop) killed the driver at once, and its workers waited
    forever on their task queue."""
    process, seen, workers = _build_until_tokenizing(tmp_path, tokenizer_path)
    assert len(workers) == 3  # the zygote and the two workers it forked
    process.send_signal(signal.SIGTERM)  # the driver alone, as a scheduler or `kill` sends it
    _, rest = process.communicate(timeout=120)
    stderr = "".join(seen) + rest
    assert process.returncode == 143 and stderr.strip().splitlines()[-1] == "prep: error: terminated (SIGTERM)", stderr
    assert "Traceback" not in stderr, stderr
    assert _gone(workers), "the workers outlived the driver"
    assert staged(tmp_path / "store") == [] and published(tmp_path / "store") == []


def test_workers_die_with_a_driver_killed_by_sigkill(tmp_path: Path, tokenizer_path: Path) -> None:
    """Regression: a driver killed with SIGKILL left its workers alive forever."""
    process, _, workers = _build_until_tokenizing(tmp_path, tokenizer_path)
    assert len(workers) == 3  # the zygote and the two workers it forked
    process.kill()
    process.communicate(timeout=60)
    assert _gone(workers), "the workers outlived the driver"


def _prepare_nothing(warm: object) -> None:
    """A worker's prepare function (given one, the pool starts its workers at once)."""


def test_ctrl_c_while_workers_start_leaves_the_pool_working() -> None:
    """A Ctrl-C that reaches workers before their initializer ignores it (they are still importing)
    must not kill them: a dead worker breaks the pool, and prints a traceback."""
    executor = LocalExecutor(2, _prepare_nothing)
    try:
        for pid in executor.pids():
            os.kill(pid, signal.SIGINT)
        assert sorted(executor.run(str, [1, 2])) == [(0, "1"), (1, "2")]  # results come as tasks finish
    finally:
        executor.close()


# ------------------------------------------------------------------ errors across processes


class _Custom(StoreError):
    """A prep error whose constructor does not take the message alone, so it cannot unpickle."""

    exit_code = 5

    def __init__(self, name: str, count: int) -> None:
        super().__init__(f"{name}: {count} problems")


def _raise_storage_error(path: str) -> None:
    raise StorageIOError.from_os_error("writing", path, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))


def _raise_custom(name: str) -> None:
    raise _Custom(name, 3)


def _raise_os_error(path: str) -> None:
    raise OSError(errno.EIO, os.strerror(errno.EIO), path)


def test_storage_error_survives_pickling() -> None:
    error = StorageIOError("writing", Path("/store/tmp/x.part"), "No space left on device", errno.ENOSPC)
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is StorageIOError and str(copy) == "writing /store/tmp/x.part: No space left on device"
    assert (copy.operation, copy.path, copy.reason, copy.errno, copy.exit_code) == (
        "writing", "/store/tmp/x.part", "No space left on device", errno.ENOSPC, IO_EXIT)
    assert isinstance(copy, StoreError)


def test_worker_errors_arrive_as_the_same_prep_error() -> None:
    executor = LocalExecutor(1)
    try:
        with pytest.raises(StorageIOError) as caught:
            list(executor.run(_raise_storage_error, ["/store/tmp/shard-00000.tar"]))
        assert caught.value.message == "writing /store/tmp/shard-00000.tar: No space left on device"
        assert caught.value.errno == errno.ENOSPC and caught.value.exit_code == IO_EXIT

        # A prep error that cannot unpickle comes back as its nearest plain ancestor with the
        # same message and exit code, instead of breaking the pool ("a worker process died").
        with pytest.raises(PrepError) as custom:
            list(executor.run(_raise_custom, ["thing"]))
        assert isinstance(custom.value, StoreError)
        assert custom.value.message == "thing: 3 problems" and custom.value.exit_code == 5

        with pytest.raises(OSError) as plain:
            list(executor.run(_raise_os_error, ["/data/x"]))
        assert plain.value.errno == errno.EIO and plain.value.filename == "/data/x"
        assert [result for _, result in executor.run(str, [1])] == ["1"], "the pool still works"
    finally:
        executor.close()


def test_an_os_error_reaching_the_cli_is_one_line(tmp_path: Path) -> None:
    """The last-resort handler in prep.cli.main: any OSError no layer converted."""
    script = ("import sys, errno, os\n"
              "import prep.cli.main as m\n"
              "def boom(**kwargs):\n"
              "    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), '/store/tmp/x', None)\n"
              "m.cli.main = boom\n"
              "m.main()\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert result.returncode == IO_EXIT
    assert result.stderr == "prep: error: accessing /store/tmp/x: No space left on device\n"


def free_pages(mount: Path, filler: Path, pages: int) -> None:
    """Leave exactly `pages` 4 KiB pages free on a full tmpfs by shortening the filler file."""
    with open(filler, "r+b") as out:
        out.truncate(max(0, filler.stat().st_size - pages * 4096))


@pytest.mark.parametrize("pages", [1, 2, 3, 4, 6])
def test_a_disk_filling_up_while_refs_move_never_half_publishes(project: tuple[Path, str], tmp_path: Path,
                                                                pages: int) -> None:
    """The disk fills during the publish of a cached rebuild (`--tag v1`): wherever it runs out (the
    lease, the read-back record, the tag's history or value), either nothing moved and the error is
    one line (exit 4), or the tag moved and the build succeeded; a rerun with space converges."""
    pipeline, _ = project
    with small_tmpfs(tmp_path / "mnt", "64m") as mount:
        store = mount / "store"
        clean = run_prep("build", pipeline, "--store", store, "--workers", "1").stdout.split()[-1]
        shutil.rmtree(store / "readback")  # a store from before read-back: the publish writes a record too
        latest = (store / "refs" / "tiny" / "latest.json").read_bytes()
        filler = fill_up(mount)
        free_pages(mount, filler, pages)
        ran = run_prep("build", pipeline, "--store", store, "--workers", "1", "--tag", "v1", check=False)
        assert "Traceback" not in ran.stderr, ran.stderr
        assert (store / "refs" / "tiny" / "latest.json").read_bytes() == latest
        tagged = (store / "refs" / "tiny" / "v1.json").exists()
        if ran.returncode == 0:
            assert tagged and ran.stdout.split()[-1] == clean
        else:
            assert ran.returncode == IO_EXIT, ran.stderr
            errors = [line for line in ran.stderr.splitlines() if not line.startswith("[")]
            assert len(errors) == 1 and errors[0].endswith(": No space left on device"), ran.stderr
            assert not tagged, "a failed publish moved a ref"
        filler.unlink()
        rerun = run_prep("build", pipeline, "--store", store, "--workers", "1", "--tag", "v1")
        assert rerun.stdout.split()[-1] == clean and (store / "refs" / "tiny" / "v1.json").exists()
        assert (store / "refs" / "tiny" / "latest.json").read_bytes() == latest


@pytest.mark.parametrize("spare_pages", [2, 8, 24])
def test_a_disk_filling_up_while_a_part_s_entries_are_written_is_one_line(project: tuple[Path, str],
                                                                         tmp_path: Path, spare_pages: int) -> None:
    """Room for the intermediate but not for the part's entries written after it: the build fails
    with one line naming the entries file, leaves nothing staged, and a rerun converges."""
    pipeline, clean = project
    clean_store = Path(pipeline).parent / "clean"
    tokenize = next(iter(committed_records(LocalStore(clean_store), "tokenize").values()))
    intermediate = clean_store / "objects" / "sha256" / tokenize["outputs"]["intermediate"][7:9] / \
        tokenize["outputs"]["intermediate"][7:]
    with small_tmpfs(tmp_path / "mnt", "64m") as mount:
        store = mount / "store"
        filler = fill_up(mount)
        free_pages(mount, filler, -(-intermediate.stat().st_size // 4096) + spare_pages)
        failed = run_prep("build", pipeline, "--store", store, "--workers", "1", check=False)
        line = _expect_disk_full(failed, store)
        assert ".part.entries:" in line, line
        filler.unlink()
        assert run_prep("build", pipeline, "--store", store, "--workers", "1").stdout.split()[-1] == clean
        assert staged(store) == []



@pytest.mark.parametrize(("fan_in", "writer"), [(2, "merge"), (None, "order")])
def test_merge_and_order_on_a_full_disk_are_one_line_and_a_rerun_with_space_converges(
        tmp_path: Path, tokenizer_path: Path, fan_in: int | None, writer: str) -> None:
    """Parts tokenized and committed by a first build; the disk then fills up, and a build that
    must merge them (fan-in 2) or order them again (a new shard size) fails in one line naming
    the file it was writing, leaving nothing staged; with space again, a rerun converges."""
    for index in range(4):
        write_jsonl(tmp_path / "corpus" / f"{index}.jsonl", make_records(600, seed=index, prefix=f"d{index}"))
    first = write_pipeline(tmp_path, tokenizer_path, shard_size="1MB", formats='["bin"]')
    second = write_pipeline(tmp_path, tokenizer_path, shard_size="500KB", formats='["bin"]', name="second.toml",
                            extra=f"\n[build]\nmerge_fan_in = {fan_in}\n" if fan_in else "")
    clean = run_prep("build", second, "--store", tmp_path / "clean", "--workers", "1").stdout.split()[-1]
    with small_tmpfs(tmp_path / "mnt", "32m") as mount:
        store = mount / "store"
        run_prep("build", first, "--store", store, "--workers", "1")
        before = {path: (store / path).read_bytes() for path in published(store)}
        filler = fill_up(mount)
        os.truncate(filler, filler.stat().st_size - (40 << 10))  # room for the lease, not for a run or bucket
        failed = run_prep("build", second, "--store", store, "--workers", "1", check=False)
        assert ("merge: round 1" in failed.stderr) == (writer == "merge"), failed.stderr
        assert failed.returncode == IO_EXIT and "Traceback" not in failed.stderr and failed.stdout == ""
        errors = [line for line in failed.stderr.splitlines() if not line.startswith("[")]
        assert len(errors) == 1 and errors[0].startswith(f"prep: error: writing {store}/tmp/{writer}-"), errors
        assert errors[0].endswith(".part: No space left on device"), errors
        assert {path: (store / path).read_bytes() for path in published(store)} == before  # no ref moved
        assert staged(store) == []
        filler.unlink()
        assert run_prep("build", second, "--store", store, "--workers", "1").stdout.split()[-1] == clean
        assert staged(store) == []
