"""The one verified download path: copy a stored object to a local file, hashing as it goes.

`prep pull` and the training reader's node-local cache both fetch through `download_verified`,
so a byte reaches a final name only after its object's size and SHA-256 matched what the
manifest declared. The copy goes to a temporary (created exclusively) beside the final name and
is renamed into place only once it is proven and durable.
"""

from __future__ import annotations

import hashlib
import io
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from prep import hashing
from prep.errors import IntegrityError, NotFoundError
from prep.faults import crash_point
from prep.storage.base import Store
from prep.store import cas
from prep.transfer.verify import DEFAULT_JOBS, READ_SIZE, ByteCounter, Cancelled, hash_file
from prep.writeback import fsync_path

# Objects at least this big go through the store's own parallel `download_file`, when it has one.
DOWNLOAD_FILE_MIN = 64 << 20


def write_all(out: io.FileIO, data: memoryview | bytes) -> None:
    """Write every byte of `data` (a raw file may take fewer per call)."""
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


def copy_object(store: Store, key: str, temp: Path, on_bytes: ByteCounter, stop: threading.Event) -> hashing.Digest:
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
            write_all(out, chunk)
            size += len(chunk)
            on_bytes(len(chunk))
        os.fsync(out.fileno())
    return hashing.Digest(hasher.hexdigest(), size)


def download_verified(store: Store, expected: hashing.Digest, final: Path, *, temp: Path, what: str,
                      on_bytes: ByteCounter, stop: threading.Event) -> os.stat_result | None:
    """Copy the object named by `expected.sha256` to `final` through `temp`, refusing bytes whose
    size or SHA-256 differ (IntegrityError naming `what`); the caller removes `temp` in any case.

    Returns the stat of the installed file when it is still the inode this call wrote (None if
    another writer replaced it meanwhile), so a caller can record what it proved."""
    key = cas.object_key(expected.sha256)
    digest = copy_object(store, key, temp, on_bytes, stop)
    if digest.size != expected.size or digest.sha256 != expected.sha256:
        raise IntegrityError(
            f"{store.url}: object {key} for {what} has {digest.size} bytes with sha256 "
            f"{digest.sha256}; the manifest says {expected.size} bytes with sha256 {expected.sha256}"
        )
    ours = os.stat(temp)
    os.replace(temp, final)
    installed = os.stat(final)
    return installed if (installed.st_ino, installed.st_dev) == (ours.st_ino, ours.st_dev) else None
