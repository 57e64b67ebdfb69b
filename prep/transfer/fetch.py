"""The one verified download path: copy a stored object to a local file, hashing as it goes.

`prep pull` and the training reader's node-local cache both fetch through `download_verified`,
so a byte reaches a final name only after its object's size and SHA-256 matched what the
manifest declared. The copy goes to a temporary beside the final name and is renamed into
place only once it is proven and durable.

With `resume`, the temporary is a partial file a killed run may have left (a deterministic name
the caller holds a lock on): its bytes are re-hashed and the copy continues from its end with a
ranged read (a seek on a local store, Range GETs on S3). A partial whose prefix is not the
object's shows up as a wrong final hash; it is then discarded and the object fetched afresh.
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from prep import hashing
from prep.errors import IntegrityError, NotFoundError
from prep.faults import crash_point
from prep.regular import open_regular
from prep.storage.backend import Store
from prep.storage.parallel import in_sequence
from prep.store import cas
from prep.transfer.verify import READ_SIZE, ByteCounter, Cancelled
from prep.writeback import start_writeback

COPY_SIZE = 8 << 20  # bytes per read and write: large, so per-call overhead is noise
# A remote object at least this big is fetched with RANGE_JOBS ranged reads of RANGE_SIZE at once.
DOWNLOAD_FILE_MIN = 64 << 20
RANGE_SIZE = 8 << 20
RANGE_JOBS = 4


def write_all(out: io.FileIO, data: memoryview | bytes) -> None:
    """Write every byte of `data` (a raw file may take fewer per call)."""
    view = memoryview(data)
    while view:
        written = out.write(view)
        view = view[written or 0 :]


def _local_chunks(local: Path, start: int, stop: threading.Event, missing: str,
                  end: int | None = None) -> Iterator[memoryview]:
    """A local object's bytes from `start` to its end, or to byte `end` (the declared size plus one, so
    an object grown since shows without being copied whole), read into one reused buffer."""
    try:
        stream = io.FileIO(open_regular(local), "r")
    except FileNotFoundError:
        raise NotFoundError(missing) from None
    with stream:
        stream.seek(start)
        view = memoryview(bytearray(COPY_SIZE))
        left = None if end is None else max(0, end - start)
        while left is None or left > 0:
            count = stream.readinto(view if left is None else view[:min(left, COPY_SIZE)]) or 0
            if not count:
                return
            if stop.is_set():
                raise Cancelled()
            left = None if left is None else left - count
            yield view[:count]


def _ranged_chunks(store: Store, key: str, start: int, size: int, stop: threading.Event) -> Iterator[bytes]:
    """Bytes `start`.. of a remote object by ranged reads, in parallel for a large object. The
    last read asks for one byte more than `size`, so an object longer than declared shows."""
    remaining = size - start
    jobs = RANGE_JOBS if remaining >= DOWNLOAD_FILE_MIN else 1
    offsets = range(start, size, RANGE_SIZE) if remaining > 0 else range(start, start + 1)

    def read(offset: int) -> Callable[[], bytes]:
        return lambda: store.get_range(key, offset, min(RANGE_SIZE, size - offset) + (offset + RANGE_SIZE >= size))

    def check() -> None:
        if stop.is_set():
            raise Cancelled()

    for chunk in in_sequence((read(offset) for offset in offsets), jobs, "prep-range", check):
        if not chunk:
            return
        yield chunk


def _hash_prefix(partial: Path, limit: int, on_bytes: ByteCounter, stop: threading.Event) -> tuple[int, Any]:
    """(bytes kept, sha256 state over them) of a partial file; (0, fresh) when there is none, or
    it is longer than the object, no regular file or a hard link (then it is removed; an empty
    folder too, a full one is an OSError)."""
    hasher = hashlib.sha256()
    try:  # never through a symlink planted under the partial's name, nor blocking on a FIFO
        fd = os.open(partial, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return 0, hasher
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        partial.unlink()  # a symlink: removed, never followed
        return 0, hasher
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1 or info.st_size > limit:  # nlink: another file
        os.close(fd)
        (os.rmdir if stat.S_ISDIR(info.st_mode) else os.unlink)(partial)  # FileIO refuses a folder
        return 0, hasher
    with io.FileIO(fd, "r") as stream:
        buffer = bytearray(READ_SIZE)
        view = memoryview(buffer)
        kept = 0
        while count := stream.readinto(buffer) or 0:
            if stop.is_set():
                raise Cancelled()
            hasher.update(view[:count])
            kept += count
            on_bytes(count)
    return kept, hasher


def _no_follow(path: str, flags: int) -> int:
    """Open a temporary without following a symlink at its name (it would write outside DEST)."""
    return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)


def copy_object(store: Store, key: str, temp: Path, on_bytes: ByteCounter, stop: threading.Event, *,
                start: int = 0, hasher: Any = None, size: int | None = None) -> hashing.Digest:
    """Copy one object into `temp` from byte `start` on (`temp` then holds the first `start`
    bytes, already in `hasher`; at 0 it is created exclusively), hashing as it goes; fsynced.
    `size` is the declared size, needed for a remote store's ranged reads."""
    hasher = hasher if hasher is not None else hashlib.sha256()
    local = store.local_path(key)
    if local is not None:
        chunks: Iterator[memoryview | bytes] = _local_chunks(local, start, stop, f"{store.url}: no such key {key!r}",
                                                             None if size is None else size + 1)
    else:
        declared = size if size is not None else store.require(key).size
        chunks = _ranged_chunks(store, key, start, declared, stop)
    written = start
    with io.FileIO(temp, "r+" if start else "x", opener=_no_follow) as out:
        out.seek(start)
        for chunk in chunks:
            hasher.update(chunk)
            write_all(out, chunk)
            if len(chunk) == COPY_SIZE:  # a small file's fsync follows at once: no hint needed
                start_writeback(out.fileno(), written, len(chunk))
            written += len(chunk)
            on_bytes(len(chunk))
            crash_point("pull.after_chunk")  # the chunk is written, the file not yet renamed
        os.fsync(out.fileno())
    return hashing.Digest(hasher.hexdigest(), written)


def _mismatch(store: Store, key: str, what: str, digest: hashing.Digest, expected: hashing.Digest) -> IntegrityError:
    return IntegrityError(
        f"{store.url}: object {key} for {what} has {digest.size} bytes with sha256 "
        f"{digest.sha256}; the manifest says {expected.size} bytes with sha256 {expected.sha256}"
    )


def download_verified(store: Store, expected: hashing.Digest, final: Path, *, temp: Path, what: str,
                      on_bytes: ByteCounter, stop: threading.Event, resume: bool = False,
                      on_resumed: ByteCounter | None = None) -> os.stat_result | None:
    """Copy the object named by `expected.sha256` to `final` through `temp`, refusing bytes whose
    size or SHA-256 differ (IntegrityError naming `what`); without `resume` the caller removes
    `temp` in any case, with it `temp` is a partial kept for the next run (see the module).

    Returns the stat of the installed file when it is still the inode this call wrote (None if
    another writer replaced it meanwhile), so a caller can record what it proved. `on_resumed`
    hears how many bytes of a partial were kept, once the result is proven."""
    key = cas.object_key(expected.sha256)
    try:
        kept, hasher = _hash_prefix(temp, expected.size, on_bytes, stop) if resume else (0, None)
        if resume and os.path.lexists(temp) and not kept:
            temp.unlink()  # an empty or oversized partial: start clean
        digest = copy_object(store, key, temp, on_bytes, stop, start=kept, hasher=hasher, size=expected.size)
        if kept and digest != expected:  # the partial's prefix was not this object's: start over
            temp.unlink()
            kept, digest = 0, copy_object(store, key, temp, on_bytes, stop, size=expected.size)
        if digest.size != expected.size or digest.sha256 != expected.sha256:
            raise _mismatch(store, key, what, digest, expected)
    except IntegrityError:
        if resume:
            temp.unlink(missing_ok=True)  # wrong bytes are never kept for a later resume
        raise
    ours = os.stat(temp)
    os.replace(temp, final)
    installed = os.stat(final)
    if on_resumed is not None and kept:
        on_resumed(kept)
    return installed if (installed.st_ino, installed.st_dev) == (ours.st_ino, ours.st_dev) else None
