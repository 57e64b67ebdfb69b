"""The node-local cache's folder under attack: FIFOs, folders and garbage planted at the cache's own
names, a live user's file holding nonsense, an object grown in the store since it was published, a
full disk under the cache's record, a read-only cache folder, and the folder removed while a reader
runs. Each is a read that goes on, or one prep error naming the file; never a hang or a traceback."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from prep.data.cachedir import CacheDir
from prep.data.reader import Reader
from prep.errors import IntegrityError, StorageIOError
from prep.storage import LocalStore
from prep.store import cas
from prep.transfer.pull import pull
from tests.runner.test_disk_full import fill_up, small_tmpfs
from tests.snapshot_factory import build_snapshot

SEQ, GLOBAL, SHARD = 16, 8, 20_000


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A four-shard snapshot (bin only) in a local store, and the same snapshot pulled."""
    root = tmp_path_factory.mktemp("cachedir")
    store = LocalStore(root / "store")
    built = build_snapshot(store, root / "work", shard_sizes=(SHARD,) * 4, formats=("bin",))
    pull(store, built.snapshot, root / "dest")
    shas = [a["sha256"] for a in sorted(built.snapshot.artifacts, key=lambda a: a["path"])]
    return {"store": store, "dest": root / "dest", "shas": shas}


def cached(small: dict[str, Any], cache_dir: Path, cache_bytes: int = 1 << 20, **options: Any) -> Reader:
    return Reader("demo@latest", SEQ, GLOBAL, store=options.pop("store", small["store"]), cache_dir=cache_dir,
                  cache_bytes=cache_bytes, prefetch_steps=0, **options)


def read_steps(small: dict[str, Any], cache_dir: Path, steps: int, cache_bytes: int = 1 << 20) -> None:
    """Read `steps` steps through the cache, each row for row the pulled folder's."""
    pulled = Reader(small["dest"], SEQ, GLOBAL)
    with cached(small, cache_dir, cache_bytes) as reader:
        for step in range(steps):
            assert (reader.batch(step) == pulled.batch(step)).all(), f"step {step}"


def in_thread(work: Callable[[], None], fifos: list[Path], seconds: float = 10.0) -> None:
    """Run `work`; if it is still blocked after `seconds` (on a FIFO), unblock it and fail."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        for fifo in fifos:  # a writer end lets a blocked open of the FIFO return
            with contextlib.suppress(OSError):
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(10)
        pytest.fail(f"the reader hung on a FIFO planted in the cache folder: {fifos}")
    if errors:
        raise errors[0]


@pytest.mark.parametrize("name", ["users/planted.json", "pressure"])
def test_a_fifo_planted_at_a_cache_folder_name_does_not_hang_the_reader(small: dict[str, Any], tmp_path: Path,
                                                                         name: str) -> None:
    """The cache's own files were opened blocking: a FIFO at a user file's name or at `pressure` hung
    every reader that opened the cache, for good."""
    cache = tmp_path / "cache"
    (cache / "users").mkdir(parents=True)
    os.mkfifo(cache / name)
    in_thread(lambda: read_steps(small, cache, 3), [cache / name])


def plant_folders(cache: Path, names: list[str]) -> None:
    for name in names:
        (cache / name).mkdir(parents=True)


@pytest.mark.parametrize("where", ["users", "pressure", "locks", "objects", "foreign-object"])
def test_a_folder_at_a_cache_file_name_is_removed_not_a_traceback(small: dict[str, Any], tmp_path: Path,
                                                                   where: str) -> None:
    """An empty folder where the cache keeps a file (a user file, `pressure`, an object's lock or cache
    file, a file the cache would evict) was a raw IsADirectoryError from open, rename or unlink."""
    cache, shas = tmp_path / "cache", small["shas"]
    names = {"users": ["users/planted.json"], "pressure": ["pressure"],
             "locks": [f"locks/{sha}" for sha in shas], "objects": [f"objects/{sha}" for sha in shas],
             "foreign-object": ["objects/" + "0" * 64]}[where]
    plant_folders(cache, names)
    read_steps(small, cache, 12, cache_bytes=2 * SHARD)  # two of four shards: every step evicts


def test_a_full_folder_at_a_cache_file_name_is_one_error_naming_it(small: dict[str, Any], tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    plant_folders(cache, [f"objects/{sha}/inside" for sha in small["shas"]])
    with cached(small, cache) as reader, pytest.raises(StorageIOError, match=rf"{cache}/objects/[0-9a-f]{{64}}: "):
        reader.batch(0)


@pytest.mark.parametrize("body", [b"[1]", b'{"fetching": [1]}', b'{"fetching": {"%s": "20000"}}' % (b"a" * 64),
                                  b"\xff\xfe"], ids=["list", "list-of-fetches", "size-text", "not-utf8"])
def test_a_live_user_file_of_nonsense_is_read_as_no_reservations(small: dict[str, Any], tmp_path: Path,
                                                                 body: bytes) -> None:
    """A live user's file (its flock held) that is valid JSON of another shape was a raw
    AttributeError or TypeError in every other user's ledger."""
    users = tmp_path / "cache" / "users"
    users.mkdir(parents=True)
    fd = os.open(users / "other.json", os.O_RDWR | os.O_CREAT)
    try:
        os.write(fd, body)
        fcntl.flock(fd, fcntl.LOCK_EX)
        read_steps(small, tmp_path / "cache", 6, cache_bytes=2 * SHARD)
    finally:
        os.close(fd)


def test_an_object_grown_in_a_local_store_is_refused_without_being_copied_whole(small: dict[str, Any],
                                                                                 tmp_path: Path) -> None:
    """A local store's object was copied to its end before its size was checked: an object grown since
    the snapshot was published (8 MiB for 20 kB here) filled the cache's disk far past cache_bytes."""
    store = LocalStore(tmp_path / "store")
    built = build_snapshot(store, tmp_path / "work", shard_sizes=(SHARD,) * 2, formats=("bin",))
    grown = sorted(built.snapshot.artifacts, key=lambda a: a["path"])[0]
    key = cas.object_key(grown["sha256"])
    path = store.local_path(key)
    assert path is not None
    path.chmod(0o644)
    path.write_bytes(built.files[grown["path"]] + bytes(8 << 20))
    with small_tmpfs(tmp_path / "mnt", "1m") as mount, \
            cached(small, mount / "cache", 4 * SHARD, store=store) as reader, \
            pytest.raises(IntegrityError, match=rf"object {key} for .* has {SHARD + 1} bytes"):
        for step in range(10):
            reader.batch(step)


def test_a_full_disk_under_the_cache_record_costs_a_rehash_not_a_read(small: dict[str, Any], tmp_path: Path) -> None:
    """The record of proven files is advisory, yet a full disk while appending to it (after a fetch was
    installed) or compacting it (as a reader opens the cache) failed the read with a raw OSError."""
    cache = tmp_path / "cache"
    with small_tmpfs(cache / ".prep", "64k") as folder:
        read_steps(small, cache, 30, cache_bytes=SHARD)  # thrashes: a record line per fetch
        record = folder / "verified.jsonl"
        record.write_bytes(record.read_bytes().splitlines(keepends=True)[-1] * 100)  # so the next opener compacts
        fill_up(folder)
        read_steps(small, cache, 30, cache_bytes=SHARD)


@pytest.fixture
def fds() -> Iterator[Callable[[], set[str]]]:
    yield lambda: set(os.listdir("/proc/self/fd"))


def test_a_read_only_cache_folder_is_one_error_naming_it(small: dict[str, Any], tmp_path: Path,
                                                         fds: Callable[[], set[str]]) -> None:
    with small_tmpfs(tmp_path / "mnt", "1m") as mount:
        read_steps(small, mount / "cache", 2)
        subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True, capture_output=True)
        before = fds()
        with pytest.raises(StorageIOError, match=rf"{mount}/cache/\S+: Read-only file system"):
            cached(small, mount / "cache")
        assert fds() <= before  # nothing left open by the reader that failed


def test_a_cache_folder_removed_while_a_reader_runs_stops_it_with_one_error(small: dict[str, Any],
                                                                           tmp_path: Path) -> None:
    """A reader whose cache folder was removed (and maybe made afresh by another job) went on deciding
    about room under a cache.lock nobody else takes, its reservations invisible: the bound was the
    directory's no more. It is one error naming the folder, once it has to fetch."""
    cache = tmp_path / "cache"
    with cached(small, cache, SHARD) as reader:  # one shard: every step fetches
        reader.batch(0)
        shutil.rmtree(cache)
        read_steps(small, cache, 2, cache_bytes=SHARD)  # a new job on a fresh cache in its place
        with pytest.raises(StorageIOError, match=rf"{cache}: the folder was removed or replaced"):
            for step in range(1, 10):
                reader.batch(step)


def test_a_cache_that_fails_as_it_opens_leaves_no_user_registered(small: dict[str, Any], tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure reading the ledger as the cache opened left this process's user file registered (and
    flocked: alive to everyone) with its descriptors open, for the life of the process."""
    def broken(self: CacheDir, mine: dict[str, int]) -> None:
        raise StorageIOError("reading", self.objects, "Input/output error")

    monkeypatch.setattr(CacheDir, "ledger", broken)
    with pytest.raises(StorageIOError, match="Input/output error"):
        cached(small, tmp_path / "cache")
    assert list((tmp_path / "cache" / "users").iterdir()) == []


@pytest.mark.parametrize("name", ["pressure", "locks/{sha}", "cache.lock"])
def test_a_symlink_at_a_cache_file_name_is_never_written_through(small: dict[str, Any], tmp_path: Path,
                                                                 name: str) -> None:
    """The cache's own files were opened through whatever symlink sat at their names: a signal of
    pressure appended to the file it pointed at (and truncated it past 64 KiB), a lock was created there."""
    victim, absent = tmp_path / "victim", tmp_path / "absent"
    victim.write_bytes(b"precious" * 10_000)
    cache = tmp_path / "cache"
    (cache / "locks").mkdir(parents=True)
    (cache / name.format(sha=small["shas"][0])).symlink_to(victim if name == "pressure" else absent)
    with cached(small, cache) as reader:
        assert reader.cache is not None
        for _ in range(2):
            reader.cache.dir.signal_pressure()
        for step in range(4):
            reader.batch(step)
    assert victim.read_bytes() == b"precious" * 10_000 and not absent.exists()
