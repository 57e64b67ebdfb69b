"""`prep copy` to a hostile target (issue 43 follow-up): a FIFO sitting at an object's key, and a
full disk. Each is one `prep: error:` line, never a block or a traceback, and leaves nothing of
the snapshot visible on the target (no manifest, marker or ref); a rerun with room completes."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from prep import hashing
from prep.storage import LocalStore
from prep.store.fsck import fsck
from prep.store.layout import object_key, snapshot_marker_key
from prep.store.snapshots import Snapshot, resolve
from tests.helpers import one_error, run_prep, within
from tests.runner.test_disk_full import fill_up, remount, small_tmpfs, staged
from tests.store.test_gc import project, template  # noqa: F401  (module fixtures)

Project = dict[str, Path]


def _source(project: Project) -> tuple[Path, Snapshot]:  # noqa: F811
    return project["store"], resolve(LocalStore(project["store"]), "tiny@latest")


def _copy(source: Path, target: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """`prep copy tiny@latest --to target --refs`, failing the test rather than blocking."""
    with within(90):
        return run_prep("copy", "tiny@latest", "--to", target, "--store", source, "--refs", *extra, check=False,
                        timeout=80)


def assert_nothing_visible(target: Path, snapshot: Snapshot) -> None:
    """The snapshot is not on the target: no manifest object (but what was planted there), no
    marker, no ref; nothing staged."""
    store = LocalStore(target)
    manifest = target / object_key(hashing.parse_id(snapshot.id))
    assert not manifest.exists() or manifest.is_fifo(), "the snapshot manifest is copied last"
    assert not store.exists(snapshot_marker_key(snapshot.id))
    assert not (target / "refs").exists() or not any((target / "refs").rglob("*.json"))
    assert staged(target) == [], "a failed copy leaves nothing staged"


def assert_copied(target: Path, snapshot: Snapshot) -> None:
    """The target holds the snapshot whole (marker and ref) and passes fsck."""
    store = LocalStore(target)
    assert resolve(store, "tiny@latest").raw == snapshot.raw
    assert store.exists(snapshot_marker_key(snapshot.id))
    report = fsck(store)
    assert report.clean and not report.dangling, (report.findings, report.dangling)


@pytest.mark.parametrize("which", ["artifact", "manifest"])
def test_a_fifo_at_an_objects_key_on_the_target_is_one_line_never_a_block(project: Project, tmp_path: Path,  # noqa: F811
                                                                           which: str) -> None:
    source, snapshot = _source(project)
    target = tmp_path / "target"
    sha = snapshot.artifacts[0]["sha256"] if which == "artifact" else hashing.parse_id(snapshot.id)
    fifo = target / object_key(sha)
    fifo.parent.mkdir(parents=True)
    os.mkfifo(fifo)
    result = _copy(source, target)
    assert result.returncode == 3, result.stderr
    line = one_error(result)
    assert f"sha256:{sha} is already there with other bytes (0 bytes, not " in line, line
    assert_nothing_visible(target, snapshot)
    assert fifo.is_fifo(), "never overwritten"
    fifo.unlink()
    assert _copy(source, target).returncode == 0
    assert_copied(target, snapshot)


def test_a_full_target_disk_is_one_line_and_a_rerun_with_room_completes(project: Project, tmp_path: Path) -> None:  # noqa: F811
    source, snapshot = _source(project)
    total = sum(path.stat().st_size for path in (source / "objects").rglob("*") if path.is_file())
    with small_tmpfs(tmp_path / "mnt", "1m") as mount:
        target = mount / "target"
        (target / "tmp").mkdir(parents=True)
        filler = fill_up(mount)
        os.truncate(filler, filler.stat().st_size - min(total // 2, 256 * 1024))  # room for some objects only
        result = _copy(source, target, "--jobs", "1")
        assert result.returncode == 4, result.stderr
        line = one_error(result)
        assert line.startswith("prep: error: copying sha256:") and f" into {target}/tmp/" in line, line
        assert line.endswith(": No space left on device"), line
        assert result.stdout == ""
        assert_nothing_visible(target, snapshot)

        remount(mount, "64m")
        rerun = _copy(source, target)
        assert rerun.returncode == 0, rerun.stderr
        assert_copied(target, snapshot)
