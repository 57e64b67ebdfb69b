"""Copy a snapshot's artifacts from a store to a local folder, safely and resumably.

Each file is written under a temporary name in its final folder, hashed while it is copied,
and renamed into place only once its size and SHA-256 match the manifest. A killed pull
leaves only temporaries, which the next pull removes before it starts.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import os
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import IO, Any, Self

from prep import hashing
from prep.errors import IntegrityError, NotFoundError, UsageError
from prep.faults import crash_point
from prep.storage.base import Store
from prep.store import cas
from prep.store.snapshots import Snapshot
from prep.transfer.shares import Artifact, Share, artifacts_of, share_of
from prep.transfer.verify import (
    DEFAULT_JOBS,
    PREP_DIR,
    READ_SIZE,
    TEMP_MARKER,
    ByteCounter,
    ByteTally,
    Cancelled,
    FileDone,
    check_paths,
    hash_file,
    run_parallel,
)
from prep.writeback import fsync_path

MANIFEST_NAME = "manifest.json"
LOCK_NAME = "pull.lock"
# Objects at least this big go through the store's own parallel `download_file`, when it has one.
DOWNLOAD_FILE_MIN = 64 << 20


@dataclass(frozen=True)
class PullResult:
    """What one pull did: files and bytes copied, already valid (skipped), stale temps removed."""

    snapshot_id: str
    dest: Path
    share: Share
    files_copied: int
    bytes_copied: int
    files_skipped: int
    bytes_skipped: int
    temporaries_removed: int
    seconds: float


def temp_name(final: Path) -> Path:
    """A fresh temporary next to `final`, recognizable as ours by the marker."""
    return final.with_name(f".{final.name}{TEMP_MARKER}{uuid.uuid4().hex[:12]}")


def _is_temp(name: str) -> bool:
    return name.startswith(".") and TEMP_MARKER in name


def remove_stale_temporaries(folders: set[Path]) -> int:
    """Delete temporaries a killed pull left in these folders; returns how many."""
    removed = 0
    for folder in sorted(folders):
        try:
            names = os.listdir(folder)
        except (FileNotFoundError, NotADirectoryError):
            continue
        for name in names:
            if _is_temp(name):
                (folder / name).unlink(missing_ok=True)
                removed += 1
    return removed


def _discard(path: Path) -> None:
    """Remove a temporary if it is there; never mask the error that is already propagating."""
    with contextlib.suppress(OSError):
        path.unlink()


def _write_all(out: io.FileIO, data: memoryview | bytes) -> None:
    view = memoryview(data)
    while view:
        written = out.write(view)
        view = view[written or 0 :]


def _source_chunks(store: Store, key: str, stop: threading.Event) -> Iterator[memoryview | bytes]:
    """The object's bytes in large chunks: straight from the file when the store is local."""
    size = READ_SIZE
    local = store.local_path(key)
    stream: IO[bytes] | io.FileIO
    if local is not None:
        try:
            stream = io.FileIO(local, "r")
        except FileNotFoundError:
            raise NotFoundError(f"{store.url}: no such key {key!r}") from None
    else:
        stream = store.open(key)
    with stream:
        buffer = bytearray(size)
        view = memoryview(buffer)
        while True:
            if stop.is_set():
                raise Cancelled()
            if isinstance(stream, io.FileIO):
                count = stream.readinto(buffer) or 0
                chunk: memoryview | bytes = view[:count]
            else:
                chunk = stream.read(size)
                count = len(chunk)
            if not count:
                return
            yield chunk
            crash_point("pull.after_chunk")  # the consumer has written the chunk


def _copy_object(store: Store, key: str, temp: Path, on_bytes: ByteCounter, stop: threading.Event) -> hashing.Digest:
    """Copy one object into `temp` (created exclusively), hashing as it goes; fsynced."""
    download_file: Any = getattr(store, "download_file", None)
    info = store.head(key) if download_file is not None else None
    if download_file is not None and info is not None and info.size >= DOWNLOAD_FILE_MIN:
        # The S3 backend hashes in order while it downloads and returns the hex; re-hash otherwise.
        reported = download_file(key, temp, DEFAULT_JOBS)
        fsync_path(temp)
        if isinstance(reported, str) and len(reported) == 64:
            size = temp.stat().st_size
            on_bytes(size)
            return hashing.Digest(reported, size)
        return hash_file(temp, on_bytes, stop).digest
    hasher = hashlib.sha256()
    size = 0
    with io.FileIO(temp, "x") as out:
        for chunk in _source_chunks(store, key, stop):
            hasher.update(chunk)
            _write_all(out, chunk)
            size += len(chunk)
            on_bytes(len(chunk))
        os.fsync(out.fileno())
    return hashing.Digest(hasher.hexdigest(), size)


def _already_valid(final: Path, artifact: Artifact, on_bytes: ByteCounter, stop: threading.Event) -> bool:
    try:
        if not final.is_file() or final.stat().st_size != artifact.size:
            return False
        found = hash_file(final, on_bytes, stop)
    except OSError:
        return False
    return not found.changed and found.digest.sha256 == artifact.sha256


def fetch_artifact(
    store: Store, dest: Path, artifact: Artifact, *, on_bytes: ByteCounter, stop: threading.Event
) -> bool:
    """Make DEST/<path> hold the artifact's bytes; False when it already did (skipped)."""
    final = dest / artifact.path
    if _already_valid(final, artifact, on_bytes, stop):
        return False
    key = cas.object_key(artifact.sha256)
    temp = temp_name(final)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        digest = _copy_object(store, key, temp, on_bytes, stop)
        if digest.size != artifact.size or digest.sha256 != artifact.sha256:
            raise IntegrityError(
                f"{store.url}: object {key} for {artifact.path} has {digest.size} bytes with sha256 "
                f"{digest.sha256}; the manifest says {artifact.size} bytes with sha256 {artifact.sha256}"
            )
        os.replace(temp, final)
    except NotFoundError:
        raise NotFoundError(f"{store.url}: object {key} for {artifact.path} is missing from the store") from None
    except OSError as exc:
        culprit = f" ({exc.filename})" if exc.filename and os.fspath(exc.filename) != os.fspath(final) else ""
        raise UsageError(f"{final}: cannot copy into place: {exc.strerror or exc}{culprit}") from None
    finally:
        _discard(temp)
    return True


def folders_to_sync(dest: Path, artifacts: Iterable[Artifact]) -> list[Path]:
    """Every folder from an artifact's parent up to `dest`, deepest first, so each new
    directory entry is durable after its contents."""
    folders = {dest}
    for artifact in artifacts:
        parts = artifact.path.split("/")[:-1]
        folders.update(dest.joinpath(*parts[:depth]) for depth in range(1, len(parts) + 1))
    return sorted(folders, key=lambda folder: (-len(folder.parts), folder))


class _DestLock:
    """An exclusive flock on DEST/.prep/pull.lock: one pull per folder; freed by the kernel
    even when the pull is killed."""

    def __init__(self, dest: Path) -> None:
        self.path = dest / PREP_DIR / LOCK_NAME
        self.handle: IO[bytes] | None = None

    def __enter__(self) -> Self:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.handle = open(self.path, "a+b")
        try:
            fcntl.flock(self.handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.handle.close()
            raise UsageError(f"{self.path.parent.parent}: another prep pull is writing into this folder") from None
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.handle is not None:
            self.handle.close()


def write_manifest(dest: Path, raw: bytes) -> Path:
    """Store the manifest bytes at DEST/.prep/manifest.json atomically, so verification
    needs no store."""
    final = dest / PREP_DIR / MANIFEST_NAME
    final.parent.mkdir(parents=True, exist_ok=True)
    temp = temp_name(final)
    try:
        with io.FileIO(temp, "x") as out:
            _write_all(out, raw)
            os.fsync(out.fileno())
        os.replace(temp, final)
    finally:
        _discard(temp)
    fsync_path(final.parent)
    return final


def pull(
    store: Store,
    snapshot: Snapshot,
    dest: Path,
    *,
    rank: int | None = None,
    world_size: int | None = None,
    jobs: int = DEFAULT_JOBS,
    on_bytes: ByteCounter | None = None,
    on_file: FileDone | None = None,
) -> PullResult:
    """Copy the snapshot (or one rank's share) into `dest`, skipping files already valid;
    returns only once every file, folder and the manifest copy are fsynced."""
    started = time.perf_counter()
    everything = artifacts_of(snapshot.manifest)
    check_paths(everything, dest, snapshot.id)
    share = share_of(everything, rank, world_size)
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"{dest}: cannot create folder: {exc.strerror or exc}") from None
    ordered = sorted(share.artifacts, key=lambda a: (-a.size, a.path))
    try:
        with _DestLock(dest):
            removed = remove_stale_temporaries({(dest / a.path).parent for a in everything} | {dest / PREP_DIR})
            tally = ByteTally(on_bytes)
            work = partial(fetch_artifact, store, dest, on_bytes=tally.add)
            copied = run_parallel(lambda a, stop: work(a, stop=stop), ordered, jobs, on_file)
            for folder in folders_to_sync(dest, share.artifacts):
                fsync_path(folder)
            write_manifest(dest, snapshot.raw)
    except OSError as exc:
        raise UsageError(f"{exc.filename or dest}: {exc.strerror or exc}") from None
    copied_artifacts = [a for a, was_copied in zip(ordered, copied) if was_copied]
    return PullResult(
        snapshot_id=snapshot.id,
        dest=dest,
        share=share,
        files_copied=len(copied_artifacts),
        bytes_copied=sum(a.size for a in copied_artifacts),
        files_skipped=len(ordered) - len(copied_artifacts),
        bytes_skipped=share.size - sum(a.size for a in copied_artifacts),
        temporaries_removed=removed,
        seconds=time.perf_counter() - started,
    )
