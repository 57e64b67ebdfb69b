"""The Store interface: a small key/value contract every backend (local, S3) fulfils.

Keys are '/'-separated relative paths. Everything outside `refs/` and `logs/` is written
create-only: `put_*` never replaces an existing key. Refs move only by compare-and-swap.
"""

from __future__ import annotations

import abc
import builtins
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from prep.errors import IntegrityError, NotFoundError, StoreError

# Bounds on a key's body read whole into memory: a bigger one is refused unread (IntegrityError),
# so a huge file planted at a key cannot exhaust memory. A ref value (prep.ref/1) is a few hundred
# bytes; records, manifests and build logs read whole stay far below a GiB even at 20 TB.
MAX_REF_BYTES = 64 * 1024
MAX_BODY_BYTES = 1 << 30


def too_large(source: str, limit: int) -> IntegrityError:
    """The error for a key body at `source` (STORE/KEY) holding more than `limit` bytes."""
    return IntegrityError(f"{source}: larger than {limit} bytes, more than such a key holds, so not read")


@dataclass(frozen=True)
class ObjectInfo:
    """What `head` and `list` report about one key."""

    key: str
    size: int
    mtime: float = 0.0
    etag: str | None = None
    version_id: str | None = None


@dataclass(frozen=True)
class RefValue:
    """A mutable ref's current body and the opaque token a compare-and-swap must present."""

    body: bytes
    token: str


class Store(abc.ABC):
    """A place to keep objects, commit records and refs."""

    url: str

    @abc.abstractmethod
    def put_file(self, key: str, path: Path) -> bool:
        """Create `key` with the bytes of the local file `path`, atomically.

        Returns True if this call created the key, False if the key already existed (in which
        case nothing was written). The caller may delete `path` afterwards. A file under
        `staging_dir()` may become the object itself (a hard link: the caller must not change it);
        any other file is copied, so the caller's file stays the caller's.
        """

    @abc.abstractmethod
    def put_bytes(self, key: str, data: bytes) -> bool:
        """Create `key` holding `data`, atomically and create-only (see `put_file`)."""

    @abc.abstractmethod
    def open(self, key: str) -> BinaryIO:
        """A readable binary stream of the key's bytes; raises NotFoundError."""

    def get_bytes(self, key: str, limit: int = MAX_BODY_BYTES) -> bytes:
        """All bytes of `key`; raises NotFoundError, and IntegrityError (reading no further) past `limit` bytes."""
        with self.open(key) as stream:
            data = stream.read(limit + 1)
        if len(data) > limit:
            raise too_large(f"{self.url}/{key}", limit)
        return data

    def get_range(self, key: str, start: int, length: int) -> bytes:
        """`length` bytes of `key` from offset `start` (fewer at the end of the object)."""
        with self.open(key) as stream:
            stream.seek(start)
            return stream.read(length)

    @abc.abstractmethod
    def head(self, key: str) -> ObjectInfo | None:
        """Size and identity of `key`, or None when it does not exist."""

    def exists(self, key: str) -> bool:
        return self.head(key) is not None

    @abc.abstractmethod
    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        """Every key starting with `prefix`, in ascending key order."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove `key` if present: garbage collection and repair, a corrupt object found on reuse, a
        released lease or hold."""

    def folders_at_keys(self, prefix: str, suffix: str) -> builtins.list[str]:
        """Keys under `prefix` ending in `suffix` at which an empty folder stands instead of a file:
        `list` shows nothing there (the folder holds no key), yet reading the key fails. None for
        stores without folders."""
        return []

    def remove_empty_folder(self, prefix: str) -> None:
        """Remove the folder that `prefix` (ending in "/") names, if it exists and holds nothing:
        for stores with folders, after the last key below a one-off prefix is deleted. Nothing
        to do for stores without folders."""
        return None

    @abc.abstractmethod
    def read_ref(self, key: str) -> RefValue | None:
        """The current value of a mutable ref, or None when it does not exist; IntegrityError for a
        body over MAX_REF_BYTES."""

    @abc.abstractmethod
    def swap_ref(self, key: str, body: bytes, expected: str | None) -> bool:
        """Set the ref to `body` only if its token is still `expected` (None: must not exist).

        Returns False when the ref changed in between (the caller re-reads and decides).
        """

    def local_path(self, key: str) -> Path | None:
        """A filesystem path holding the key's bytes, when the backend has one (zero-copy reads)."""
        return None

    def staging_dir(self) -> Path:
        """A local folder for building files before `put_file`; the same filesystem as the
        store when possible, so publishing is a rename or hard link rather than a copy."""
        return Path(tempfile.gettempdir())

    def stale_staging(self, cutoff: float) -> builtins.list[ObjectInfo]:
        """Entries of the store's own staging folder untouched since `cutoff`; none by default."""
        return []

    def delete_staging(self, info: ObjectInfo) -> None:
        """Delete one entry `stale_staging` reported, a file or a folder with its contents."""
        raise StoreError(f"{self.url}: the store has no staging folder of its own, so no {info.key!r}")

    def require(self, key: str) -> ObjectInfo:
        info = self.head(key)
        if info is None:
            raise NotFoundError(f"{self.url}: no such key {key!r}")
        return info
