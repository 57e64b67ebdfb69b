"""A hostile DEST: FIFOs, hard links, folders and read-only filesystems where pull and verify
keep their own files or partials. Each ends in a completed pull or a one-line error, never a
hang, a traceback, or a write into another file."""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from prep.errors import StorageIOError, UsageError
from prep.storage.local import LocalStore
from prep.transfer.pull import pull
from prep.transfer.shares import partial_name
from prep.transfer.verify import verify
from tests.runner.test_disk_full import small_tmpfs
from tests.snapshot_factory import Built
from tests.transfer import test_pull
from tests.transfer.test_pull import assert_complete

store, built = test_pull.store, test_pull.built  # the fixtures of a snapshot in a local store

VICTIM = b"someone else's file\n"


def finishes(call: Callable[[], object], seconds: float = 20) -> list[BaseException]:
    """Run `call` in a thread; assert it returns (or raises) in time; what it raised."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # handed to the test
            raised.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(timeout=seconds)
    assert not worker.is_alive(), "blocked (a FIFO among DEST's own files?)"
    return raised


@pytest.mark.parametrize("name", ["verified.jsonl", "share.json", "manifest.json"])
def test_a_fifo_among_dest_own_files_never_blocks_pull(store: LocalStore, built: Built, tmp_path: Path,
                                                       name: str) -> None:
    """Regression: a FIFO at DEST/.prep/verified.jsonl, share.json or manifest.json made pull
    (with --prune, for the manifest) block forever opening it."""
    dest = tmp_path / "dest"
    pull(store, built.snapshot, dest)
    (dest / ".prep" / name).unlink()
    os.mkfifo(dest / ".prep" / name)
    (dest / "bin/00000.bin").unlink()  # so the pull installs a file and appends to the record
    assert finishes(lambda: pull(store, built.snapshot, dest, prune_old=True)) == []
    assert (dest / ".prep" / name).is_file()
    assert_complete(built, dest)


def test_a_fifo_at_an_object_in_the_store_never_blocks_pull(store: LocalStore, built: Built, tmp_path: Path) -> None:
    """Regression: a FIFO planted at an object's key in a local store made pull block opening it."""
    victim = store.local_path(f"objects/sha256/{built.snapshot.artifacts[0]['sha256'][:2]}/"
                              f"{built.snapshot.artifacts[0]['sha256']}")
    assert victim is not None
    victim.chmod(0o644)
    victim.unlink()
    os.mkfifo(victim)
    raised = finishes(lambda: pull(store, built.snapshot, tmp_path / "dest"), seconds=10)
    assert len(raised) == 1 and "not a regular file" in str(raised[0])


def test_a_fifo_at_the_share_record_is_a_one_line_error_for_verify(store: LocalStore, built: Built,
                                                                    tmp_path: Path) -> None:
    """Regression: a FIFO at DEST/.prep/share.json made verify block forever."""
    dest = tmp_path / "dest"
    pull(store, built.snapshot, dest)
    (dest / ".prep/share.json").unlink()
    os.mkfifo(dest / ".prep/share.json")
    raised = finishes(lambda: verify(built.snapshot, dest))
    assert len(raised) == 1 and isinstance(raised[0], UsageError) and "not a regular file" in raised[0].message


def test_the_record_is_never_appended_to_through_a_hard_link(store: LocalStore, built: Built, tmp_path: Path) -> None:
    """Regression: DEST/.prep/verified.jsonl hard-linked to a file elsewhere made pull append its
    record lines to that file (a symlink there was already removed first)."""
    dest = tmp_path / "dest"
    pull(store, built.snapshot, dest)
    victim = tmp_path / "victim"
    victim.write_bytes(VICTIM)
    (dest / ".prep/verified.jsonl").unlink()
    os.link(victim, dest / ".prep/verified.jsonl")
    (dest / "bin/00000.bin").unlink()
    pull(store, built.snapshot, dest)
    assert victim.read_bytes() == VICTIM
    assert os.stat(dest / ".prep/verified.jsonl").st_nlink == 1
    assert_complete(built, dest)


def test_the_manifest_copy_is_a_file_of_dest_not_a_symlink_with_the_same_bytes(
    store: LocalStore, built: Built, tmp_path: Path
) -> None:
    """Regression: a symlink at DEST/.prep/manifest.json to a file elsewhere holding the same bytes
    was kept (the no-op check read through it), so the manifest copy lived outside DEST."""
    dest = tmp_path / "dest"
    pull(store, built.snapshot, dest)
    elsewhere = tmp_path / "manifest-elsewhere.json"
    (dest / ".prep/manifest.json").rename(elsewhere)
    (dest / ".prep/manifest.json").symlink_to(elsewhere)
    pull(store, built.snapshot, dest)
    assert not (dest / ".prep/manifest.json").is_symlink()
    assert_complete(built, dest)


def test_a_folder_at_a_partial_name_is_removed_or_a_one_line_error(store: LocalStore, built: Built,
                                                                    tmp_path: Path) -> None:
    """Regression: a folder under an artifact's partial name raised TypeError (a traceback) while
    the error about it was being worded. An empty one is removed; a full one is refused."""
    dest = tmp_path / "dest"
    artifact = next(a for a in built.snapshot.artifacts if a["path"] == "bin/00000.bin")
    partial = partial_name(dest / artifact["path"], artifact["sha256"])
    (partial / "inside").mkdir(parents=True)
    with pytest.raises(UsageError, match="cannot copy into place: Directory not empty"):
        pull(store, built.snapshot, dest)
    (partial / "inside").rmdir()
    pull(store, built.snapshot, dest)
    assert_complete(built, dest)


def test_a_read_only_filesystem_under_a_pulled_dest_is_an_io_error(store: LocalStore, built: Built,
                                                                    tmp_path: Path) -> None:
    """Regression: a pull into a DEST on a read-only filesystem failed opening its lock with exit
    code 2 (a usage error), not 4 as the docs promise for a read-only filesystem."""
    with small_tmpfs(tmp_path / "mnt", "4m") as mount:
        dest = mount / "dest"
        pull(store, built.snapshot, dest)
        subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True, capture_output=True)
        with pytest.raises(StorageIOError, match="Read-only file system"):
            pull(store, built.snapshot, dest)
        assert verify(built.snapshot, dest).ok
