"""The file writer of shard assembly: chunks appended and hashed on threads, bypassing the page cache.

Artifacts are large, written once, and not read again by this process, so they are written with
O_DIRECT where the filesystem allows it: the chunk goes from this process's buffer to the disk,
and the kernel neither copies it nor takes fresh page-cache pages for it (on the 2-core
benchmark VM, buffered writes cost about 1.8 CPU seconds per GB, direct ones under 0.1). A
direct write must start and end on a block boundary, so each chunk writes its aligned prefix and
carries the remaining few bytes to the front of the next buffer; the last block is written
padded and the file truncated to its size. Filesystems without O_DIRECT (tmpfs, some FUSE) get
ordinary buffered writes with early writeback.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import mmap
import os
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from prep.errors import IntegrityError, StorageIOError
from prep.faults import crash_point
from prep.hashing import Digest
from prep.writeback import start_writeback

CHUNK_BYTES = 8 << 20
ALIGNMENT = 4096
"""Offsets, lengths and buffer addresses of direct writes are multiples of this (a page, which
covers every logical block size in use)."""
_O_DIRECT = getattr(os, "O_DIRECT", 0)


@dataclass(frozen=True)
class Written:
    """A file shard assembly wrote: where, its digest, and whether it was read back from the disk."""

    path: Path
    digest: Digest
    read_back: bool


class ChunkSink:
    """Appends chunks to a new file on one thread, hashes them on another and reads each back from
    the disk on a third, while the caller lays out the next chunk (os.pwrite, os.preadv and hashlib
    release the GIL). Three page-aligned buffers take turns (one laid out, one written, one read
    back), so memory is four chunks. `close` fsyncs; I/O errors name the file."""

    def __init__(self, path: Path) -> None:
        self._path = path
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL
        try:
            self._fd = os.open(path, flags | _O_DIRECT, 0o644)
            self._direct = bool(_O_DIRECT)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise StorageIOError.from_os_error("creating", path, exc) from exc
            self._fd, self._direct = self._open_buffered(flags), False
        self._checked = self._direct
        self._hasher = hashlib.sha256()
        self._size = 0  # bytes handed to write()
        self._written = 0  # bytes on disk (block-aligned while direct)
        self._carry = 0  # bytes at the end of the last chunk's buffer not yet written
        self._carry_start = 0
        self._writers = ThreadPoolExecutor(max_workers=2)  # the hash and the write of one chunk
        self._reader = ThreadPoolExecutor(max_workers=1)  # read-backs, in file order
        self._pending: list[Future[Any]] = []  # the last chunk's hash and write
        self._checks: list[Future[Any]] = []  # read-backs of the last chunks, oldest first
        self._buffers = [mmap.mmap(-1, CHUNK_BYTES + ALIGNMENT) for _ in range(3)]  # page-aligned
        self._turn = 0
        self._check = mmap.mmap(-1, CHUNK_BYTES)

    @property
    def read_back(self) -> bool:
        """True when every byte of the file went to the disk directly and was read back from it
        (a direct read, not the page cache) equal to the bytes hashed."""
        return self._checked

    def _open_buffered(self, flags: int) -> int:
        try:
            return os.open(self._path, flags, 0o644)
        except OSError as exc:
            raise StorageIOError.from_os_error("creating", self._path, exc) from exc

    def buffer(self, size: int, zeroed: bool) -> memoryview:
        """A buffer of `size` bytes that no write or read-back in flight uses (zero-filled when asked)."""
        previous = self._buffers[self._turn]
        self._turn = (self._turn + 1) % len(self._buffers)
        self._settle(self._checks[:-2])  # this buffer's chunk was three back: its read-back is done
        if len(self._buffers[self._turn]) < self._carry + size:
            self._buffers[self._turn] = mmap.mmap(-1, self._carry + size)
        current = self._buffers[self._turn]
        if self._carry:  # the end of the previous chunk, which a direct write could not take yet
            current[: self._carry] = previous[self._carry_start : self._carry_start + self._carry]
        if zeroed:
            np.frombuffer(current, dtype=np.uint8, count=size, offset=self._carry).fill(0)
        return memoryview(current)[self._carry : self._carry + size]

    def write(self, chunk: memoryview) -> None:
        """Hash, append and read back `chunk` (the last `buffer`) on the threads; returns at once."""
        self._settle(self._pending)
        self._size += len(chunk)
        ready = self._carry + len(chunk)
        length = ready - ready % ALIGNMENT if self._direct else ready
        offset, self._written = self._written, self._written + length
        self._carry_start, self._carry = length, ready - length
        data = memoryview(self._buffers[self._turn])[:length]
        written = self._writers.submit(self._append, data, offset)
        self._pending = [self._writers.submit(self._hasher.update, chunk), written]
        self._checks.append(self._reader.submit(self._read_back, written, data, offset))
        crash_point("shard.mid_write")

    def _append(self, data: memoryview, offset: int) -> bool:
        """Write `data` at `offset`; True when it went to the disk directly."""
        written = 0
        while written < len(data):
            try:
                written += os.pwrite(self._fd, data[written:], offset + written)
            except OSError as exc:
                if exc.errno != errno.EINVAL or not self._direct:
                    raise
                self._stop_direct()  # the filesystem opened O_DIRECT but will not write it
        if not self._direct:
            self._checked = False
            start_writeback(self._fd, offset, len(data))
        return self._direct

    def _read_back(self, written: Future[bool], data: memoryview, offset: int) -> None:
        """Once `data` is written, read it straight from the disk and compare it with what was hashed."""
        if not written.result() or not data:
            return  # a buffered write: the publish reads the file back instead
        if len(self._check) < len(data):
            self._check = mmap.mmap(-1, len(data))
        check = memoryview(self._check)[: len(data)]
        done = 0
        while done < len(data) and (got := os.preadv(self._fd, [check[done:]], offset + done)):
            done += got
        if done != len(data) or not np.array_equal(np.frombuffer(check, dtype=np.uint64),
                                                   np.frombuffer(data, dtype=np.uint64)):
            raise IntegrityError(f"{self._path}: the disk returned other bytes than were written at offset {offset}")

    def _stop_direct(self) -> None:
        fcntl.fcntl(self._fd, fcntl.F_SETFL, fcntl.fcntl(self._fd, fcntl.F_GETFL) & ~_O_DIRECT)
        self._direct = False

    def _settle(self, futures: list[Future[Any]]) -> None:
        """Wait for `futures` (and forget them), raising the first failure; I/O errors name the file."""
        try:
            for future in futures:
                future.result()
        except OSError as exc:
            raise StorageIOError.from_os_error("writing", self._path, exc) from exc
        finally:
            done = set(map(id, futures))
            self._pending = [f for f in self._pending if id(f) not in done]
            self._checks = [f for f in self._checks if id(f) not in done]

    def _finish(self) -> None:
        """Write the carried tail: padded to a whole block when direct, then cut back to the file's size."""
        self._settle(self._pending + self._checks)
        if not self._carry:
            return
        tail = self._buffers[(self._turn + 1) % len(self._buffers)]  # free: everything has finished
        tail[: self._carry] = self._buffers[self._turn][self._carry_start : self._carry_start + self._carry]
        length = ALIGNMENT if self._direct else self._carry
        tail[self._carry : length] = bytes(length - self._carry)
        try:
            data = memoryview(tail)[:length]
            done: Future[bool] = Future()
            done.set_result(self._append(data, self._written))
            self._read_back(done, data, self._written)
            os.ftruncate(self._fd, self._size)
        except OSError as exc:
            raise StorageIOError.from_os_error("writing", self._path, exc) from exc

    def close(self) -> Digest:
        """Write what is left, fsync, and return the file's digest."""
        try:
            self._finish()
            try:
                os.fsync(self._fd)
            except OSError as exc:
                raise StorageIOError.from_os_error("writing", self._path, exc) from exc
            return Digest(self._hasher.hexdigest(), self._size)
        finally:
            self.abort()

    def abort(self) -> None:
        """Stop the threads and close the file (the caller removes it)."""
        self._writers.shutdown()
        self._reader.shutdown()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
