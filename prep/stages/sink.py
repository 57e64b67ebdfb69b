"""The file writer of shard assembly: chunks written past the page cache, then hashed as read back.

Artifacts are large, written once, and not read again by the build, so they are written with
O_DIRECT where the filesystem allows it: a chunk goes from this process's buffer to the disk, and
the kernel neither copies it nor takes fresh page-cache pages for it (on the 2-core benchmark VM,
buffered writes cost about 1.8 CPU seconds per GB, direct ones under 0.1). Each chunk is then
read back from the disk (a direct read: the device's bytes, not a cache) and compared with the
buffer it was written from: other bytes fail the write. The bytes read back are what is hashed,
so the file's digest, its name in the store, is the hash of what the disk returned, and that
equals what was laid out: neither a device that stored other bytes nor a buffer reused too
early can give a file with a wrong name. A direct write must start and end on a block boundary,
so each chunk writes its aligned prefix and carries the few bytes left to the front of the next
buffer; the last block is written padded and the file cut back to its size. Filesystems without O_DIRECT,
or that refuse a direct write, get buffered writes with early writeback, hashed from the buffer.
A build run with `--no-readback` asks for no read-back: its chunks still go to the disk directly, and
are hashed from the buffer once written.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import mmap
import os
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from prep.errors import IntegrityError, StorageIOError
from prep.faults import crash_point
from prep.hashing import Digest
from prep.workfiles.intermediate import pread_into
from prep.writeback import start_writeback

CHUNK_BYTES = 4 << 20
ALIGNMENT = 4096
"""Offsets, lengths and buffer addresses of direct writes are multiples of this (a page, which
covers every logical block size in use)."""
_O_DIRECT = getattr(os, "O_DIRECT", 0)
_BUFFERS = 3  # one laid out, one written, one read back and hashed


@dataclass(frozen=True)
class Written:
    """A file shard assembly wrote: where, its digest, and whether that digest is of the bytes
    read back from the disk (every byte written and read back directly)."""

    path: Path
    digest: Digest
    read_back: bool


class ChunkSink:
    """Writes chunks to a new file on one thread, reads each back and compares it on another, and
    hashes what was read on a third, while the caller lays out the next chunk (os.pwrite,
    os.preadv and hashlib release the GIL). Memory: three chunk buffers and two read-back
    buffers. `close` fsyncs; I/O errors name the file. With `read_back` False, each chunk is
    hashed from its buffer once written, and not read back."""

    def __init__(self, path: Path, read_back: bool = True) -> None:
        self._path = path
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL
        try:
            self._fd = os.open(path, flags | _O_DIRECT, 0o644)
            self._direct = bool(_O_DIRECT)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise StorageIOError.from_os_error("creating", path, exc) from exc
            self._fd, self._direct = self._open_buffered(flags), False
        self._verify = read_back
        self._read_back_all = self._direct and read_back
        self._hasher = hashlib.sha256()
        self._size = 0  # bytes handed to write()
        self._written = 0  # bytes on disk (block-aligned while direct)
        self._carry = 0  # bytes at the end of the last chunk's buffer not yet written
        self._carry_start = 0
        self._pools = [ThreadPoolExecutor(max_workers=1) for _ in range(3)]  # write, read back, hash: each in order
        self._hashed: deque[Future[None]] = deque()  # the last chunks' hashes (each waits on its read and write)
        self._buffers = [mmap.mmap(-1, CHUNK_BYTES + ALIGNMENT) for _ in range(_BUFFERS)]  # page-aligned
        self._checks = [mmap.mmap(-1, CHUNK_BYTES + ALIGNMENT) for _ in range(2)]
        self._turn = 0
        self._chunks = 0

    @property
    def read_back(self) -> bool:
        """True when every byte went to the disk directly and the digest is of the bytes read back."""
        return self._read_back_all

    def _open_buffered(self, flags: int) -> int:
        try:
            return os.open(self._path, flags, 0o644)
        except OSError as exc:
            raise StorageIOError.from_os_error("creating", self._path, exc) from exc

    def buffer(self, size: int, zeroed: bool) -> memoryview:
        """A buffer of `size` bytes that no write, read-back or hash in flight uses (zero-filled when asked)."""
        previous = self._buffers[self._turn]
        self._turn = (self._turn + 1) % _BUFFERS
        self._settle(len(self._hashed) - (_BUFFERS - 1))  # this buffer's last chunk is done with it
        if len(self._buffers[self._turn]) < self._carry + size:
            self._buffers[self._turn] = mmap.mmap(-1, self._carry + size)
        current = self._buffers[self._turn]
        if self._carry:  # the end of the previous chunk, which a direct write could not take yet
            current[: self._carry] = previous[self._carry_start : self._carry_start + self._carry]
        view = memoryview(current)[self._carry : self._carry + size]
        if zeroed:
            np.frombuffer(current, dtype=np.uint8, count=size, offset=self._carry).fill(0)
        return view

    def write(self, chunk: memoryview) -> None:
        """Write, read back and hash `chunk` (the last `buffer`) on the threads; returns at once."""
        self._size += len(chunk)
        ready = self._carry + len(chunk)
        length = ready - ready % ALIGNMENT if self._direct else ready
        offset, self._written = self._written, self._written + length
        self._carry_start, self._carry = length, ready - length
        self._submit(memoryview(self._buffers[self._turn])[:length], offset, length)
        crash_point("shard.mid_write")

    def _submit(self, data: memoryview, offset: int, hashed: int) -> None:
        """Queue the write of `data` at `offset`, its read-back, and the hash of its first `hashed` bytes."""
        writer, reader, hasher = self._pools
        slot = self._chunks % 2
        before = self._hashed[-2] if len(self._hashed) >= 2 else None  # the last user of this read-back buffer
        self._chunks += 1
        written = writer.submit(self._append, data, offset)
        read = reader.submit(self._read_back, written, before, data, offset, slot)
        self._hashed.append(hasher.submit(lambda: self._hasher.update(read.result()[:hashed])))

    def _append(self, data: memoryview, offset: int) -> bool:
        """Write `data` at `offset`; True when it went to the disk directly."""
        done = 0
        while done < len(data):
            try:
                done += os.pwrite(self._fd, data[done:], offset + done)
            except OSError as exc:
                if exc.errno != errno.EINVAL or not self._direct:
                    raise
                self._stop_direct()  # the filesystem opened O_DIRECT but will not write it
        if not self._direct:
            self._read_back_all = False
            start_writeback(self._fd, offset, len(data))
        return self._direct

    def _read_back(self, written: Future[bool], before: Future[None] | None, data: memoryview, offset: int,
                   slot: int) -> memoryview:
        """The bytes to hash for `data`: once written directly, as read straight back from the disk."""
        if not written.result() or not data or not self._verify:
            return data  # a buffered write, or no read-back asked for: hashed from the buffer
        if before is not None:
            before.result()  # the chunk that last used this read-back buffer is hashed
        if len(self._checks[slot]) < len(data):
            self._checks[slot] = mmap.mmap(-1, len(data))
        check = memoryview(self._checks[slot])[: len(data)]
        if pread_into(self._fd, check, offset) != len(data) or not np.array_equal(np.frombuffer(check, dtype=np.uint64),
                                                   np.frombuffer(data, dtype=np.uint64)):
            raise IntegrityError(f"{self._path}: the disk returned other bytes than were written at offset {offset}")
        return check

    def _stop_direct(self) -> None:
        fcntl.fcntl(self._fd, fcntl.F_SETFL, fcntl.fcntl(self._fd, fcntl.F_GETFL) & ~_O_DIRECT)
        self._direct = False

    def _settle(self, count: int) -> None:
        """Wait for the oldest `count` chunks to be hashed, raising the first failure (I/O errors name the file)."""
        try:
            while count > 0 and self._hashed:
                self._hashed[0].result()
                self._hashed.popleft()
                count -= 1
        except OSError as exc:
            raise StorageIOError.from_os_error("writing", self._path, exc) from exc

    def _finish(self) -> None:
        """Write the carried tail: padded to a whole block when direct, then cut back to the file's size."""
        self._settle(len(self._hashed))
        if not self._carry:
            return
        tail = self._buffers[(self._turn + 1) % _BUFFERS]  # free: everything has finished
        tail[: self._carry] = self._buffers[self._turn][self._carry_start : self._carry_start + self._carry]
        length = ALIGNMENT if self._direct else self._carry
        tail[self._carry : length] = bytes(length - self._carry)
        self._submit(memoryview(tail)[:length], self._written, self._carry)
        self._settle(1)
        try:
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
        for pool in self._pools:
            pool.shutdown()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
