"""prep.storage.s3.staging: a process's scratch folder is gone once it exits, whether it ran its
exit hooks (a normal exit, a pool worker) or not (a Ray worker killed, `os._exit`): the next
process of the host sweeps those of processes that are gone, and never a live one's."""

from __future__ import annotations

import multiprocessing
import os
import socket
import tempfile
from pathlib import Path

import pytest

from prep.storage.s3 import staging


@pytest.fixture
def tmp_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(staging, "_OWN", {})
    return tmp_path


def _folders(root: Path) -> list[Path]:
    return sorted(path for path in root.iterdir() if path.name.startswith(staging.PREFIX))


def _use_and_exit(hard: bool) -> None:
    folder = staging.process_folder()
    (folder / "staged.part").write_bytes(b"x")  # what a killed task may leave behind
    if hard:
        os._exit(0)  # no exit hooks of any kind: as a killed worker


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_a_worker_that_exits_removes_its_folder(tmp_root: Path, method: str) -> None:
    context = multiprocessing.get_context(method)
    os.environ["TMPDIR"] = str(tmp_root)  # a spawned child finds its temporary folder here
    pool = context.Pool(1)
    try:
        pool.apply(staging.process_folder)
        assert len(_folders(tmp_root)) == 1
        pool.close()  # the worker ends as pool workers end: through multiprocessing, no atexit
        pool.join()
    finally:
        pool.terminate()
        del os.environ["TMPDIR"]
    assert _folders(tmp_root) == []


def test_a_killed_process_folder_is_swept_by_the_next_one(tmp_root: Path) -> None:
    child = multiprocessing.get_context("fork").Process(target=_use_and_exit, args=(True,))
    child.start()
    child.join()
    (left,) = _folders(tmp_root)
    assert f"-{child.pid}-" in left.name
    mine = staging.process_folder()
    assert _folders(tmp_root) == [mine]


def test_a_process_that_exits_sweeps_the_folders_of_those_gone(tmp_root: Path) -> None:
    """The driver outlives its pool's workers (ended by a signal): its exit sweeps their folders."""
    killed = multiprocessing.get_context("fork").Process(target=_use_and_exit, args=(True,))
    killed.start()
    killed.join()
    assert len(_folders(tmp_root)) == 1
    staging._remove_own()
    assert _folders(tmp_root) == []


def test_live_processes_and_other_hosts_keep_theirs(tmp_root: Path) -> None:
    host = staging._host()
    live = tmp_root / f"{staging.PREFIX}{host}-{os.getppid()}-abc123"
    other_host = tmp_root / f"{staging.PREFIX}not{socket.gethostname()}x-999999999-abc123"
    for folder in (live, other_host):
        folder.mkdir()
    assert staging.sweep(tmp_root) == 0
    assert set(_folders(tmp_root)) == {live, other_host}


def test_a_file_or_symlink_under_the_prefix_is_never_followed(tmp_root: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    outside = tmp_path_factory.mktemp("outside")
    (outside / "precious").write_text("keep")
    link = tmp_root / f"{staging.PREFIX}{staging._host()}-999999999-abc123"
    link.symlink_to(outside, target_is_directory=True)
    assert staging.sweep(tmp_root) == 0
    assert (outside / "precious").read_text() == "keep"
