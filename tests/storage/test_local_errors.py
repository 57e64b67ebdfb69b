"""LocalStore errors name the operation and path (StorageIOError); failed puts and swaps leave no temporary."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from prep.errors import IntegrityError, NotFoundError, StorageIOError
from prep.storage import LocalStore
from prep.store import cas
from tests.runner.test_disk_full import fill_up, small_tmpfs


@pytest.fixture()
def full_store(tmp_path: Path) -> Iterator[LocalStore]:
    """A store on a 1 MB tmpfs with no space left."""
    with small_tmpfs(tmp_path / "mnt", "1m") as mount:
        store = LocalStore(mount / "store")
        store.put_bytes("refs/tiny/latest.json", b'{"generation": 1}')
        fill_up(mount)
        yield store


def test_put_bytes_on_a_full_disk(full_store: LocalStore) -> None:
    key = cas.object_key("ab" * 32)
    with pytest.raises(StorageIOError) as caught:
        full_store.put_bytes(key, b"x" * 100_000)
    error = caught.value
    assert str(error) == f"writing {full_store.root / key}: No space left on device"
    assert error.errno == errno.ENOSPC and error.exit_code == 4 and error.operation == "writing"
    assert full_store.head(key) is None
    assert list(full_store.staging_dir().iterdir()) == []


def test_put_file_copy_on_a_full_disk(full_store: LocalStore, tmp_path: Path) -> None:
    """A file on another filesystem is copied into tmp/ (no hard link), and the copy fails."""
    source = tmp_path / "outside.bin"
    source.write_bytes(b"y" * 200_000)
    with pytest.raises(StorageIOError, match=r"^writing .*/objects/.*: No space left on device$"):
        cas.put_file(full_store, source)
    assert list(full_store.staging_dir().iterdir()) == []
    assert source.exists(), "the caller's file is the caller's"


def test_swap_ref_on_a_full_disk(full_store: LocalStore) -> None:
    current = full_store.read_ref("refs/tiny/latest.json")
    assert current is not None
    with pytest.raises(StorageIOError, match=r"^writing .*/refs/tiny/latest.json: No space left on device$"):
        full_store.swap_ref("refs/tiny/latest.json", b"x" * 10_000, current.token)
    assert full_store.read_ref("refs/tiny/latest.json") == current
    assert list(full_store.staging_dir().iterdir()) == []


def test_read_errors_name_the_path(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    store.put_bytes("a", b"file, not a folder")
    with pytest.raises(StorageIOError, match=r"^reading .*/store/a/b: Not a directory$"):
        store.get_bytes("a/b")
    with pytest.raises(StorageIOError, match=r"^reading .*/store/a/b: Not a directory$"):
        store.read_ref("a/b")
    with pytest.raises(NotFoundError):
        store.get_bytes("missing")
    assert store.read_ref("missing") is None and store.head("a/b") is None


def test_a_store_folder_that_cannot_be_made(tmp_path: Path) -> None:
    """Opening creates nothing; the first write makes the folders and names the one it could not make."""
    (tmp_path / "file").write_text("")
    store = LocalStore(tmp_path / "file" / "store")
    assert store.head("refs/x.json") is None and list(store.list("")) == []
    with pytest.raises(StorageIOError, match=r"^creating store folder .*/file/store/tmp: Not a directory$"):
        store.put_bytes("objects/a", b"x")


def test_opening_and_reading_create_nothing(tmp_path: Path) -> None:
    """A store opened on a missing path stays missing through every read; the first write creates it."""
    store = LocalStore(tmp_path / "absent")
    assert store.head("a") is None and store.read_ref("refs/d/latest.json") is None
    assert list(store.list("refs/")) == [] and store.stale_staging(float("inf")) == []
    with pytest.raises(NotFoundError):
        store.get_bytes("a")
    assert not (tmp_path / "absent").exists()
    assert store.put_bytes("objects/a", b"x") and store.get_bytes("objects/a") == b"x"
    assert sorted(p.name for p in (tmp_path / "absent").iterdir()) == ["objects", "tmp"]
    assert store.swap_ref("refs/d/latest.json", b"{}", None)


@pytest.mark.parametrize("planted", ["fifo", "folder"])
def test_a_fifo_or_folder_at_a_key_is_one_error_not_a_hang(tmp_path: Path, planted: str) -> None:
    """Regression: a FIFO at an object's key blocked the read (and `prep fsck`) for ever. It is
    damage to the store (exit 3), named by its key, for a whole read and a stream alike."""
    store = LocalStore(tmp_path / "store")
    digest = cas.put_bytes(store, b"some bytes")
    path = store.root / cas.object_key(digest.sha256)
    path.chmod(0o644)
    path.unlink()
    os.mkfifo(path) if planted == "fifo" else path.mkdir()
    key = cas.object_key(digest.sha256)
    for read in (lambda: store.get_bytes(key), lambda: store.open(key), lambda: store.get_range(key, 0, 1)):
        with pytest.raises(IntegrityError, match=f"^{store.url}/{key}: not a regular file, so not read$") as caught:
            read()
        assert caught.value.exit_code == 3
