"""SHA-256 digests of bytes and files, and a file writer that hashes what it writes.

The bottom of every integrity check: stages hash what they write with it, the store names
objects by it, and transfer checks copies against it. It knows nothing about stores."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

from prep.regular import open_regular
from prep.writeback import start_writeback

CHUNK = 1 << 20


@dataclass(frozen=True)
class Digest:
    """The SHA-256 and size of some bytes; `id` is the `sha256:<hex>` form used in manifests."""

    sha256: str
    size: int

    @property
    def id(self) -> str:
        return f"sha256:{self.sha256}"


def parse_id(object_id: str) -> str:
    """The hex part of `sha256:<hex>` (a bare hex string is accepted too)."""
    hexpart = object_id.removeprefix("sha256:")
    if len(hexpart) != 64 or any(c not in "0123456789abcdef" for c in hexpart):
        raise ValueError(f"not a sha256 object id: {object_id!r}")
    return hexpart


def pack_ids(object_ids: Sequence[str]) -> bytes:
    """Object ids as their raw SHA-256s, 32 bytes each, one after another (job tables name many)."""
    return b"".join(bytes.fromhex(parse_id(object_id)) for object_id in object_ids)


def unpack_ids(data: bytes) -> list[str]:
    """The object ids `pack_ids` packed, in order."""
    return [f"sha256:{data[at:at + 32].hex()}" for at in range(0, len(data), 32)]


def digest_bytes(data: bytes) -> Digest:
    return Digest(hashlib.sha256(data).hexdigest(), len(data))


def digest_file(path: Path) -> Digest:
    """Hash regular file `path` (OSError, never a block, for a FIFO, a device or a folder)."""
    fd = open_regular(path)
    try:
        return digest_descriptor(fd)
    finally:
        os.close(fd)


def digest_descriptor(fd: int) -> Digest:
    """Hash the whole file open on `fd` from its start, in large positional reads (its offset
    unmoved; hashlib releases the GIL on big buffers): what was opened and checked is what is hashed."""
    hasher = hashlib.sha256()
    size = 0
    buffer = bytearray(CHUNK * 4)
    view = memoryview(buffer)
    while True:
        count = os.preadv(fd, [buffer], size)
        if not count:
            break
        hasher.update(view[:count])
        size += count
    return Digest(hasher.hexdigest(), size)


class HashingWriter:
    """A write-only file that hashes what passes through it; `digest` once closed.

    Writeback to disk starts every WRITEBACK_BYTES (prep.writeback), so the fsync in `close`
    finds little left to write. With `durable=False`, `close` does not fsync: for a file that
    is stored later by `put_file`, whose store makes it durable before giving it a name."""

    WRITEBACK_BYTES = 8 << 20

    def __init__(self, path: Path, durable: bool = True) -> None:
        self.path = path
        self.durable = durable
        self._handle: BinaryIO = open(path, "xb")
        self._hasher = hashlib.sha256()
        self._size = 0
        self._written_back = 0
        self.digest: Digest | None = None

    def write(self, data: bytes | bytearray | memoryview) -> int:
        self._handle.write(data)
        self._hasher.update(data)
        size = memoryview(data).nbytes
        self._size += size
        if self._size - self._written_back >= self.WRITEBACK_BYTES:
            self._handle.flush()
            start_writeback(self._handle.fileno(), self._written_back, self._size - self._written_back)
            self._written_back = self._size
        return size

    # The file-object surface pyarrow's PythonFile needs to write through this object.
    def flush(self) -> None:
        self._handle.flush()

    def tell(self) -> int:
        return self._size

    def writable(self) -> bool:
        return True

    @property
    def closed(self) -> bool:
        return self.digest is not None or self._handle.closed

    def close(self) -> Digest:
        if self.digest is None:
            self._handle.flush()
            if self.durable:
                os.fsync(self._handle.fileno())
            self._handle.close()
            self.digest = Digest(self._hasher.hexdigest(), self._size)
        return self.digest

    def __enter__(self) -> HashingWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self._handle.close()
