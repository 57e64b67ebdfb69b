"""A pull killed mid-file resumes from the partial file's bytes; a wrong partial is discarded."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from prep.storage import open_store
from prep.storage.local import LocalStore
from prep.store import cas
from prep.transfer.fetch import COPY_SIZE
from prep.transfer.pull import PullResult, pull
from prep.transfer.shares import TEMP_MARKER, partial_name, temp_name
from prep.transfer.verify import verify
from tests.s3support import Fault, RequestHook, new_bucket
from tests.snapshot_factory import Built, build_snapshot

BIG = 2 * COPY_SIZE + 123_457  # three chunks


class CountingStore(LocalStore):
    """A local store read like a remote one (ranged reads only), counting the bytes it serves."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.served = 0
        self._lock = threading.Lock()

    def local_path(self, key: str) -> Path | None:
        return None

    def get_range(self, key: str, start: int, length: int) -> bytes:
        data = super().get_range(key, start, length)
        with self._lock:
            self.served += len(data)
        return data


def partials(dest: Path) -> list[Path]:
    return sorted(path for path in dest.rglob("*") if TEMP_MARKER in path.name)


def killed_pull(tmp_path: Path) -> tuple[LocalStore, Built, Path, Path]:
    """A store with one big shard and a pull of it SIGKILLed after two chunks of the .bin."""
    store = LocalStore(tmp_path / "store")
    built = build_snapshot(store, tmp_path / "work", shard_sizes=(BIG,), formats=("bin", "idx"))
    dest = tmp_path / "dest"
    command = [sys.executable, "-m", "prep.cli.main", "pull", "demo@latest", str(dest), "--store", str(store.root),
               "--jobs", "1"]
    env = dict(os.environ, PREP_CRASH_AT="pull.after_chunk:2")
    process = subprocess.run(command, env=env, capture_output=True, start_new_session=True, check=False)
    assert process.returncode == -signal.SIGKILL, process.stderr
    big = next(a for a in built.snapshot.artifacts if a["format"] == "bin")
    partial = partial_name(dest / big["path"], big["sha256"])
    assert partials(dest) == [partial] and partial.stat().st_size == 2 * COPY_SIZE
    assert not (dest / big["path"]).exists() and not (dest / ".prep/manifest.json").exists()
    return store, built, dest, partial


def assert_pulled(built: Built, dest: Path) -> None:
    assert verify(built.snapshot, dest).ok
    for path, data in built.files.items():
        assert (dest / path).read_bytes() == data
    assert partials(dest) == []


def test_a_pull_killed_mid_file_continues_from_the_partial(tmp_path: Path) -> None:
    store, built, dest, _ = killed_pull(tmp_path)
    counting = CountingStore(store.root)
    result = pull(counting, built.snapshot, dest, jobs=1)
    assert_pulled(built, dest)
    big = next(a for a in built.snapshot.artifacts if a["format"] == "bin")
    assert (result.files_resumed, result.bytes_resumed) == (1, 2 * COPY_SIZE)
    assert result.temporaries_removed == 0  # the partial was resumed, not deleted
    small = sum(a["size"] for a in built.snapshot.artifacts if a["format"] != "bin")
    # Only the tail of the big file (plus the one byte past its end the last read asks for) and the idx.
    assert counting.served == big["size"] - 2 * COPY_SIZE + small < big["size"]
    assert result.bytes_fetched == counting.served


def test_a_partial_with_a_corrupted_prefix_is_discarded_and_the_file_fetched_whole(tmp_path: Path) -> None:
    store, built, dest, partial = killed_pull(tmp_path)
    with open(partial, "r+b") as handle:
        handle.seek(1000)
        byte = handle.read(1)
        handle.seek(1000)
        handle.write(bytes([byte[0] ^ 0xFF]))
    result = pull(store, built.snapshot, dest, jobs=1)
    assert_pulled(built, dest)
    assert result.files_resumed == 0 and result.bytes_resumed == 0


@pytest.mark.parametrize("extra", [1, 0], ids=["longer-than-the-object", "empty"])
def test_an_oversized_or_empty_partial_is_not_resumed(tmp_path: Path, extra: int) -> None:
    store = LocalStore(tmp_path / "store")
    built = build_snapshot(store, tmp_path / "work", shard_sizes=(50_000,), formats=("bin", "idx"))
    dest = tmp_path / "dest"
    big = next(a for a in built.snapshot.artifacts if a["format"] == "bin")
    partial = partial_name(dest / big["path"], big["sha256"])
    partial.parent.mkdir(parents=True)
    partial.write_bytes(built.files[big["path"]] + b"x" if extra else b"")
    result = pull(store, built.snapshot, dest)
    assert_pulled(built, dest)
    assert result.files_resumed == 0


def test_stale_temporaries_of_other_schemes_are_still_removed(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    built = build_snapshot(store, tmp_path / "work", shard_sizes=(50_000,), formats=("bin", "idx"))
    dest = tmp_path / "dest"
    big = next(a for a in built.snapshot.artifacts if a["format"] == "bin")
    final = dest / big["path"]
    final.parent.mkdir(parents=True)
    stale = [temp_name(final), partial_name(final, "f" * 64), final.with_name(f"..00000.bin{TEMP_MARKER}x.part")]
    for path in stale:
        path.write_bytes(b"old")
    resumable = partial_name(final, big["sha256"])
    resumable.write_bytes(built.files[big["path"]][:30_000])
    result = pull(store, built.snapshot, dest)
    assert_pulled(built, dest)
    assert result.temporaries_removed == len(stale)
    assert (result.files_resumed, result.bytes_resumed) == (1, 30_000)


def test_a_partial_never_counts_as_the_file(tmp_path: Path) -> None:
    """A partial holding every byte of the object is still a temporary to verify until renamed."""
    store, built, dest, partial = killed_pull(tmp_path)
    big = next(a for a in built.snapshot.artifacts if a["format"] == "bin")
    partial.write_bytes(built.files[big["path"]])  # complete bytes, under the partial's name
    report = verify(built.snapshot, dest)
    assert not report.ok and big["path"] not in {a.path for a in report.matched}
    assert big["path"] in {p.path for p in report.problems}


@pytest.mark.usefixtures("s3_endpoint")
def test_an_s3_pull_resumes_with_ranged_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("prep.transfer.fetch.DOWNLOAD_FILE_MIN", 40_000)
    monkeypatch.setattr("prep.transfer.fetch.RANGE_SIZE", 16_384)
    remote = open_store(f"{new_bucket()}/datasets")
    built = build_snapshot(remote, tmp_path / "work", shard_sizes=(200_000, 30_000))
    dest = tmp_path / "dest"
    big = max(built.snapshot.artifacts, key=lambda a: a["size"])
    partial = partial_name(dest / big["path"], big["sha256"])
    partial.parent.mkdir(parents=True)
    partial.write_bytes(built.files[big["path"]][:70_001])  # not on a range boundary
    result: PullResult = pull(remote, built.snapshot, dest, jobs=2)
    assert_pulled(built, dest)
    assert (result.files_resumed, result.bytes_resumed) == (1, 70_001)


class RangeWatch:
    """A moto request hook logging the Range of each GET of one key and how many overlapped;
    optionally cutting the body of the n-th one short (a dropped connection)."""

    def __init__(self, key: str, cut_nth: int | None = None) -> None:
        self.key, self.cut_nth = key, cut_nth
        self.ranges: list[str] = []
        self.running = self.most_at_once = 0
        self._lock = threading.Lock()

    def __call__(self, environ: dict[str, Any]) -> Fault | None:
        if environ["REQUEST_METHOD"] != "GET" or not environ["PATH_INFO"].endswith(self.key):
            return None
        with self._lock:
            self.ranges.append(environ.get("HTTP_RANGE", ""))
            nth = len(self.ranges)
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
        time.sleep(0.02)  # hooks run outside the server's lock: parallel requests overlap here
        with self._lock:
            self.running -= 1
        return Fault(200, truncate=1000) if nth == self.cut_nth else None


@pytest.mark.parametrize("cut_nth", [None, 2], ids=["clean", "a-range-cut-short"])
def test_large_s3_objects_come_by_parallel_range_gets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, s3_request_hooks: list[RequestHook], cut_nth: int | None
) -> None:
    monkeypatch.setattr("prep.transfer.fetch.DOWNLOAD_FILE_MIN", 40_000)
    monkeypatch.setattr("prep.transfer.fetch.RANGE_SIZE", 16_384)
    remote = open_store(f"{new_bucket()}/datasets")
    built = build_snapshot(remote, tmp_path / "work", shard_sizes=(100_000,), formats=("bin",))
    big = built.snapshot.artifacts[0]
    watch = RangeWatch(cas.object_key(big["sha256"]), cut_nth)
    s3_request_hooks.append(watch)
    result = pull(remote, built.snapshot, tmp_path / "dest", jobs=1)
    assert result.files_copied == 1 and verify(built.snapshot, tmp_path / "dest").ok
    assert (tmp_path / "dest" / big["path"]).read_bytes() == built.files[big["path"]]
    size = big["size"]
    expected = [f"bytes={start}-{min(start + 16_384, size + 1) - 1}" for start in range(0, size, 16_384)]
    assert sorted(set(watch.ranges)) == sorted(expected)  # each range (a cut one retried), nothing else
    assert len(watch.ranges) == len(expected) + (cut_nth is not None)
    assert watch.most_at_once > 1


@pytest.mark.parametrize("planted", ["symlink", "hardlink", "fifo"])
def test_a_partial_name_that_is_no_regular_file_is_removed_never_followed(tmp_path: Path, planted: str) -> None:
    """Regression: a symlink planted under an artifact's partial name was resumed through: pull
    appended the object's bytes to the file it pointed to, outside DEST (a hard link: into that
    file's inode, a store object's say); a FIFO there blocked it."""
    store = LocalStore(tmp_path / "store")
    built = build_snapshot(store, tmp_path / "work", shard_sizes=(9_000,), formats=("bin",))
    artifact = built.snapshot.artifacts[0]
    dest = tmp_path / "dest"
    partial = partial_name(dest / artifact["path"], artifact["sha256"])
    partial.parent.mkdir(parents=True)
    victim = tmp_path / "victim"
    victim.write_bytes(b"someone else's file\n")
    if planted == "symlink":
        partial.symlink_to(victim)
    elif planted == "hardlink":
        os.link(victim, partial)
    else:
        os.mkfifo(partial)
    worker = threading.Thread(target=lambda: pull(store, built.snapshot, dest), daemon=True)
    worker.start()
    worker.join(timeout=30)
    assert not worker.is_alive(), "pull blocked on the FIFO"
    assert victim.read_bytes() == b"someone else's file\n"
    assert not os.path.lexists(partial) and verify(built.snapshot, dest).ok
