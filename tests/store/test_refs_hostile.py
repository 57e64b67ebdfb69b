"""A FIFO or a symlink to /dev/zero at a ref key, through the real CLI: every command that reads
the ref stops with one line naming the key (exit 3; `prep fsck` lists it as an invalid ref, exit 1),
and none blocks (each run has a timeout), reads until memory runs out, or moves a ref."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from prep.storage import LocalStore
from prep.store.proven import load
from prep.store.snapshots import ManifestFileError, read_manifest_file
from tests.helpers import run_prep, within
from tests.store.test_gc import project, template  # noqa: F401  (module fixtures)

TIMEOUT = 60  # a read that blocks fails the test instead of hanging the run


def plant_fifo(store: Path, name: str) -> str:
    """A FIFO in place of `refs/tiny/<name>.json`; the line every reader of it must stop with."""
    key = f"refs/tiny/{name}.json"
    (store / key).unlink(missing_ok=True)
    os.mkfifo(store / key)
    return f"prep: error: {store}/{key}: not a regular file, so not read\n"


def assert_one_line(result: subprocess.CompletedProcess[str], code: int, line: str) -> None:
    assert result.returncode == code, result.stderr
    assert result.stderr.endswith(line) and result.stderr.count("prep: error") == 1, result.stderr


@pytest.mark.parametrize("name", ["x", "latest"])
def test_a_fifo_at_a_ref_is_one_line_for_every_command_never_a_hang(project: dict[str, Path],  # noqa: F811
                                                                    name: str) -> None:
    """Regression: `LocalStore.read_ref` read with `Path.read_bytes()`, so `prep ls`, `log`, `fsck`,
    `gc`, `show` and `build` blocked for ever on a FIFO at a ref key."""
    store = project["store"]
    history = sorted((store / "history").rglob("*"))
    line = plant_fifo(store, name)
    builds = ["build", project["v1"], "--workers", "1"] + (["--tag", "x"] if name == "x" else [])
    for args in (["ls"], ["log", "tiny"], ["gc"], ["show", f"tiny@{name}"], builds):
        assert_one_line(run_prep(*args, "--store", store, check=False, timeout=TIMEOUT), 3, line)
    fsck = run_prep("fsck", "--store", store, check=False, timeout=TIMEOUT)
    assert fsck.returncode == 1 and f"  ref  refs/tiny/{name}.json  " in fsck.stdout, fsck.stdout
    assert (store / f"refs/tiny/{name}.json").is_fifo(), "nothing moved the ref"
    assert sorted((store / "history").rglob("*")) == history, "no ref took a generation"


def test_a_fifo_at_a_history_record_is_a_finding_of_fsck_not_an_aborted_run(project: dict[str, Path]) -> None:  # noqa: F811
    """Regression: it was a StorageIOError (exit 4) that stopped `prep fsck` at the first such record."""
    store = project["store"]
    key = "history/tiny/latest/0000000000000002.json"
    os.mkfifo(store / key)
    line = f"prep: error: {store}/{key}: not a regular file, so not read\n"
    assert_one_line(run_prep("log", "tiny", "--store", store, check=False, timeout=TIMEOUT), 3, line)
    fsck = run_prep("fsck", "--store", store, check=False, timeout=TIMEOUT)
    assert fsck.returncode == 1 and f"  history record  {key}  " in fsck.stdout, fsck.stdout


def test_a_symlink_to_dev_zero_at_a_ref_is_one_line_not_a_read_until_memory_runs_out(
        project: dict[str, Path]) -> None:  # noqa: F811
    store = project["store"]
    key = "refs/tiny/x.json"
    (store / key).symlink_to("/dev/zero")
    line = f"prep: error: {store}/{key}: not a regular file, so not read\n"
    assert_one_line(run_prep("ls", "--store", store, check=False, timeout=TIMEOUT), 3, line)


def test_a_fifo_at_the_proven_record_or_a_manifest_file_blocks_nothing(tmp_path: Path) -> None:
    """The proven record is advisory: a FIFO there reads as no record. A manifest file given as
    SNAP that turns out a FIFO is refused in one line."""
    store = LocalStore(tmp_path / "store")
    (store.root / "proven").mkdir(parents=True)
    os.mkfifo(store.root / "proven" / "objects.jsonl")
    os.mkfifo(tmp_path / "manifest.json")
    with within(10):
        assert load(store) == {}
        with pytest.raises(ManifestFileError, match="manifest.json: cannot read the manifest file"):
            read_manifest_file(tmp_path / "manifest.json")
