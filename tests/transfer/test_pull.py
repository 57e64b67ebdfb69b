"""`prep.transfer.pull`: complete, hash-checked, resumable copies; a killed pull recovers."""

from __future__ import annotations

import fcntl
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from prep.errors import IntegrityError, NotFoundError, StorageIOError, UsageError
from prep.storage import open_store
from prep.storage.local import LocalStore
from prep.store import cas
from prep.transfer.pull import pull
from prep.transfer.shares import temp_name
from prep.transfer.verify import TEMP_MARKER, verify
from tests.runner.test_disk_full import remount, small_tmpfs
from tests.s3support import new_bucket
from tests.snapshot_factory import Built, build_snapshot


def temporaries(dest: Path) -> list[Path]:
    return sorted(path for path in dest.rglob("*") if TEMP_MARKER in path.name)


def assert_complete(built: Built, dest: Path) -> None:
    for path, data in built.files.items():
        assert (dest / path).read_bytes() == data
    assert (dest / ".prep/manifest.json").read_bytes() == built.snapshot.raw
    assert temporaries(dest) == []
    assert verify(built.snapshot, dest).ok


@pytest.fixture
def store(tmp_path: Path) -> LocalStore:
    return LocalStore(tmp_path / "store")


@pytest.fixture
def built(store: LocalStore, tmp_path: Path) -> Built:
    return build_snapshot(store, tmp_path / "work")


def test_pull_copies_everything_and_a_rerun_skips_it(store: LocalStore, built: Built, tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    seen: list[str] = []
    first = pull(store, built.snapshot, dest, jobs=3, on_file=lambda artifact: seen.append(artifact.path))
    assert_complete(built, dest)
    assert (first.files_copied, first.files_reused) == (len(built.files), 0)
    assert first.bytes_copied == sum(len(data) for data in built.files.values())
    assert sorted(seen) == sorted(built.files)
    again = pull(store, built.snapshot, dest)
    assert (again.files_copied, again.files_reused, again.bytes_copied) == (0, len(built.files), 0)


def test_a_dest_inside_the_store_or_that_is_a_store_is_refused(store: LocalStore, built: Built, tmp_path: Path) -> None:
    """Regression: `prep pull SNAP $STORE` wrote bin/, wds/ and .prep/ among the store's own keys."""
    other = LocalStore(tmp_path / "other")
    build_snapshot(other, tmp_path / "other-work")
    for dest, why in ((tmp_path / "store", "inside the store"), (tmp_path / "store" / "objects", "inside the store"),
                      (tmp_path / "store" / "new" / "folder", "inside the store"), (tmp_path / "other", "a prep store")):
        before = sorted(path.name for path in (tmp_path / "store").iterdir())
        with pytest.raises(UsageError, match=why):
            pull(store, built.snapshot, dest)
        assert sorted(path.name for path in (tmp_path / "store").iterdir()) == before
    assert not (tmp_path / "store" / "new").exists() and not (tmp_path / "other" / "bin").exists()


def test_damaged_files_are_replaced_and_stale_temporaries_removed(
    store: LocalStore, built: Built, tmp_path: Path
) -> None:
    dest = tmp_path / "dest"
    pull(store, built.snapshot, dest)
    with open(dest / "bin/00000.bin", "r+b") as handle:
        handle.write(b"corrupt")
    (dest / "wds/00001.tar").unlink()
    stale = temp_name(dest / "wds/00001.tar")
    stale.write_bytes(b"half a file")
    result = pull(store, built.snapshot, dest)
    assert (result.files_copied, result.temporaries_removed) == (2, 1)
    assert_complete(built, dest)


def test_rank_pulls_together_hold_the_snapshot_once(store: LocalStore, built: Built, tmp_path: Path) -> None:
    held: list[str] = []
    for rank in range(4):
        dest = tmp_path / f"rank{rank}"
        result = pull(store, built.snapshot, dest, rank=rank, world_size=4)
        files = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file() and ".prep" not in p.parts)
        assert files == sorted(a.path for a in result.share.artifacts)
        held += files
        assert verify(built.snapshot, dest, rank=rank, world_size=4).ok
        assert (dest / ".prep/manifest.json").read_bytes() == built.snapshot.raw
    assert sorted(held) == sorted(built.files)


def test_an_object_that_does_not_match_the_manifest_is_not_installed(
    store: LocalStore, built: Built, tmp_path: Path
) -> None:
    artifact = built.snapshot.artifacts[0]
    stored = store.local_path(cas.object_key(artifact["sha256"]))
    assert stored is not None
    os.chmod(stored, 0o644)
    stored.write_bytes(b"x" + stored.read_bytes()[1:])
    dest = tmp_path / "dest"
    with pytest.raises(IntegrityError, match=artifact["path"]):
        pull(store, built.snapshot, dest, jobs=1)
    assert not (dest / artifact["path"]).exists()
    assert temporaries(dest) == []


def test_a_missing_object_names_the_artifact(store: LocalStore, built: Built, tmp_path: Path) -> None:
    artifact = built.snapshot.artifacts[-1]
    store.delete(cas.object_key(artifact["sha256"]))
    with pytest.raises(NotFoundError, match=artifact["path"]):
        pull(store, built.snapshot, tmp_path / "dest")
    # Files stopped mid-copy keep their partial (the next run resumes it); the missing one has none.
    left = temporaries(tmp_path / "dest")
    assert all(".prep-tmp-partial-" in path.name and path.stat().st_size for path in left)
    assert not [path for path in left if path.name.startswith("." + Path(artifact["path"]).name)]


def test_two_pulls_into_one_folder_are_refused(store: LocalStore, built: Built, tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    (dest / ".prep").mkdir(parents=True)
    with open(dest / ".prep/pull.lock", "a+b") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        with pytest.raises(UsageError, match="another prep pull"):
            pull(store, built.snapshot, dest)
    pull(store, built.snapshot, dest)
    assert_complete(built, dest)


def test_a_pull_killed_mid_transfer_resumes_to_a_valid_copy(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    built = build_snapshot(store, tmp_path / "work", shard_sizes=(900_000, 800_000, 700_000, 600_000))
    dest = tmp_path / "dest"
    command = [sys.executable, "-m", "prep.cli.main", "pull", "demo@latest", str(dest),
               "--store", str(store.root), "--jobs", "1"]
    # Each file is one chunk: the second chunk is the second file's, written but not yet renamed.
    env = dict(os.environ, PREP_CRASH_AT="pull.after_chunk:2")
    process = subprocess.run(command, env=env, capture_output=True, start_new_session=True, check=False)
    assert process.returncode == -signal.SIGKILL
    assert (dest / "bin/00000.bin").exists() or (dest / "bin/00000.idx").exists()
    assert temporaries(dest) and not (dest / ".prep/manifest.json").exists()
    assert not verify(built.snapshot, dest).ok

    rerun = subprocess.run(command, capture_output=True, text=True, check=False)
    assert rerun.returncode == 0, rerun.stderr
    # The second file's partial held all its bytes: the rerun re-hashes it and fetches nothing more.
    assert "already valid" in rerun.stderr and "0 stale temporaries removed" in rerun.stderr
    assert re.search(r"11 files copied \(.* MB; 1 resumed from a partial file, 800.0 kB kept\)", rerun.stderr), rerun.stderr
    assert_complete(built, dest)


class StreamOnlyStore(LocalStore):
    """A local store that hides its files, so pull must read through `open` like a remote one."""

    def local_path(self, key: str) -> Path | None:
        return None


class RangeCountingStore(StreamOnlyStore):
    """A remote-like store that records its ranged reads and how many ran at once."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.reads: list[tuple[str, int, int]] = []
        self.running = self.most_at_once = 0
        self._lock = threading.Lock()

    def get_range(self, key: str, start: int, length: int) -> bytes:
        with self._lock:
            self.reads.append((key, start, length))
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
        try:
            time.sleep(0.002)  # long enough for parallel reads to overlap
            return super().get_range(key, start, length)
        finally:
            with self._lock:
                self.running -= 1


def test_pull_reads_through_the_store_interface(built: Built, store: LocalStore, tmp_path: Path) -> None:
    remote = StreamOnlyStore(store.root)
    pull(remote, built.snapshot, tmp_path / "dest", jobs=2)
    assert_complete(built, tmp_path / "dest")


def test_large_remote_objects_are_fetched_by_parallel_ranged_reads(
    built: Built, store: LocalStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("prep.transfer.fetch.DOWNLOAD_FILE_MIN", 20_000)
    monkeypatch.setattr("prep.transfer.fetch.RANGE_SIZE", 4096)
    remote = RangeCountingStore(store.root)
    pull(remote, built.snapshot, tmp_path / "dest", jobs=1)
    assert_complete(built, tmp_path / "dest")
    large = max(built.snapshot.artifacts, key=lambda a: a["size"])
    key = cas.object_key(large["sha256"])
    starts = sorted(start for read_key, start, _ in remote.reads if read_key == key)
    assert starts == list(range(0, large["size"], 4096))  # the object in order, each range once
    assert remote.most_at_once > 1  # one file, several ranges in flight
    last = max((r for r in remote.reads if r[0] == key), key=lambda r: r[1])
    assert last[1] + last[2] == large["size"] + 1  # the last read asks one byte past the declared end


def test_an_object_longer_than_declared_is_refused(built: Built, store: LocalStore, tmp_path: Path) -> None:
    artifact = built.snapshot.artifacts[0]
    stored = store.root / cas.object_key(artifact["sha256"])
    stored.chmod(0o644)
    stored.write_bytes(stored.read_bytes() + b"tail")
    for source in (store, StreamOnlyStore(store.root)):
        dest = tmp_path / f"dest-{type(source).__name__}"
        with pytest.raises(IntegrityError, match=artifact["path"]):
            pull(source, built.snapshot, dest, jobs=1)
        assert not (dest / artifact["path"]).exists() and temporaries(dest) == []


@pytest.mark.usefixtures("s3_endpoint")
@pytest.mark.parametrize("download_min", [1 << 40, 0], ids=["streamed", "ranged"])
def test_pull_from_an_s3_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, download_min: int) -> None:
    monkeypatch.setattr("prep.transfer.fetch.DOWNLOAD_FILE_MIN", download_min)
    remote = open_store(f"{new_bucket()}/datasets")
    built = build_snapshot(remote, tmp_path / "work", shard_sizes=(30_000, 20_000))
    pull(remote, built.snapshot, tmp_path / "dest", jobs=2)
    assert_complete(built, tmp_path / "dest")


def test_a_file_where_a_folder_belongs_is_a_one_line_error(store: LocalStore, built: Built, tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "wds").write_bytes(b"in the way")
    with pytest.raises(UsageError, match=r"wds/0000\d\.tar: cannot copy into place: File exists \(.*/wds\)"):
        pull(store, built.snapshot, dest, jobs=1)
    assert temporaries(dest) == []
    (dest / "wds").unlink()
    pull(store, built.snapshot, dest)
    assert_complete(built, dest)


def test_a_full_disk_is_an_io_error_and_a_rerun_with_space_completes(store: LocalStore, built: Built, tmp_path: Path) -> None:
    """Regression: a pull onto a full disk failed with exit 2, a usage error, where every other
    command's full disk is a StorageIOError (exit 4, docs/cli.md)."""
    with small_tmpfs(tmp_path / "mnt", "64k") as mount:
        dest = mount / "dest"
        with pytest.raises(StorageIOError, match="No space left on device") as caught:
            pull(store, built.snapshot, dest, jobs=1)
        assert caught.value.exit_code == 4 and caught.value.message.startswith(f"writing {dest}/")
        assert not (dest / ".prep/manifest.json").exists()
        for path, data in built.files.items():  # nothing wrong under a final name
            assert not (dest / path).exists() or (dest / path).read_bytes() == data
        remount(mount, "1m")
        pull(store, built.snapshot, dest)
        assert_complete(built, dest)


def test_dest_own_files_are_never_written_through_a_symlink(store: LocalStore, built: Built, tmp_path: Path) -> None:
    """Regression: a symlink at DEST/.prep/verified.jsonl made pull append its record lines to the
    file it pointed to, and one at DEST/.prep/pull.lock created that file, both outside DEST."""
    dest = tmp_path / "dest"
    pull(store, built.snapshot, dest)
    victim = tmp_path / "victim"
    victim.write_bytes(b"someone else's file\n")
    (dest / ".prep/verified.jsonl").unlink()
    (dest / ".prep/verified.jsonl").symlink_to(victim)
    (dest / "bin/00000.bin").unlink()  # so the pull installs a file and records it
    pull(store, built.snapshot, dest)
    assert victim.read_bytes() == b"someone else's file\n"
    assert not (dest / ".prep/verified.jsonl").is_symlink() and (dest / ".prep/verified.jsonl").stat().st_size
    assert_complete(built, dest)
    (dest / ".prep/pull.lock").unlink()
    (dest / ".prep/pull.lock").symlink_to(tmp_path / "elsewhere.lock")
    with pytest.raises(UsageError, match="cannot open the pull lock"):
        pull(store, built.snapshot, dest)
    assert not os.path.lexists(tmp_path / "elsewhere.lock")
    (dest / ".prep/pull.lock").unlink()
    (dest / ".prep").rename(tmp_path / "elsewhere")
    (dest / ".prep").symlink_to(tmp_path / "elsewhere")
    before = sorted(path.name for path in (tmp_path / "elsewhere").iterdir())
    with pytest.raises(UsageError, match="a symlink; pull keeps its own files"):
        pull(store, built.snapshot, dest)
    assert sorted(path.name for path in (tmp_path / "elsewhere").iterdir()) == before


def test_a_copy_thread_finishing_after_the_record_closed_writes_nothing(tmp_path: Path) -> None:
    """Regression: PullRecord.add after close() reopened the record (a descriptor nothing closed),
    and close() took no lock, so an add racing it could write to a number the process had just
    given to another file."""
    from prep.transfer.shares import PREP_DIR, PullRecord

    (tmp_path / PREP_DIR).mkdir()
    record = PullRecord(tmp_path)
    info = (tmp_path / PREP_DIR).stat()
    record.add("bin/a.bin", "a" * 64, info)
    record.close()
    before = len(os.listdir(f"/proc/{os.getpid()}/fd"))
    record.add("bin/b.bin", "b" * 64, info)
    assert len(os.listdir(f"/proc/{os.getpid()}/fd")) == before
    assert b"b.bin" not in (tmp_path / PREP_DIR / "verified.jsonl").read_bytes()
