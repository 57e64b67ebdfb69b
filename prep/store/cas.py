"""Content-addressed objects: stored under their SHA-256, checked by content when found, re-hashed when read."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from prep.errors import IntegrityError, NotFoundError
from prep.hashing import CHUNK, Digest, digest_bytes, digest_file, parse_id
from prep.storage.backend import Store
from prep.store.layout import OBJECTS_PREFIX as OBJECTS_PREFIX
from prep.store.layout import object_key as object_key


def _settle_existing(store: Store, digest: Digest, write: Callable[[], bool]) -> None:
    """The object's key already existed: keep it only if its bytes hash to its name. A corrupt
    or vanished copy is replaced by the bytes the caller holds, which do."""
    if check(store, digest.id):
        return
    store.delete(object_key(digest.sha256))
    if not write() and not check(store, digest.id):
        raise IntegrityError(f"{store.url}: object {digest.id} is stored with other bytes and could not be replaced")


def put_file(store: Store, path: Path, digest: Digest | None = None) -> Digest:
    """Store a local file under its SHA-256 (hashing it unless `digest` is given)."""
    digest = digest or digest_file(path)
    key = object_key(digest.sha256)
    if not store.put_file(key, path):
        _settle_existing(store, digest, lambda: store.put_file(key, path))
    return digest


def put_bytes(store: Store, data: bytes) -> Digest:
    """Store bytes under their SHA-256; storing the same bytes twice is a no-op."""
    digest = digest_bytes(data)
    key = object_key(digest.sha256)
    if not store.put_bytes(key, data):
        _settle_existing(store, digest, lambda: store.put_bytes(key, data))
    return digest


def get_bytes(store: Store, object_id: str) -> bytes:
    """Read an object and prove it still hashes to its name."""
    sha = parse_id(object_id)
    data = store.get_bytes(object_key(sha))
    if hashlib.sha256(data).hexdigest() != sha:
        raise IntegrityError(f"{store.url}: object sha256:{sha} does not hash to its name")
    return data


class FileStamp(NamedTuple):
    """An object's file in a local store as `stat` sees it: replacing, rewriting, truncating or
    touching the file changes it."""

    device: int
    inode: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, info: os.stat_result) -> FileStamp:
        return cls(info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)

    def same_file(self, info: os.stat_result) -> bool:
        """True when `info` is of this very file (same device and inode), whatever its contents."""
        return (self.device, self.inode) == (info.st_dev, info.st_ino)


def file_stamp(store: Store, object_id: str) -> FileStamp | None:
    """The stamp of the file that holds `object_id` in a local store (None: not local, or missing)."""
    path = store.local_path(object_key(parse_id(object_id)))
    try:
        return FileStamp.of(path.stat()) if path is not None else None
    except OSError:
        return None


def check(store: Store, object_id: str) -> bool:
    """Re-hash a stored object; True when its bytes still match its name."""
    sha = parse_id(object_id)
    hasher = hashlib.sha256()
    try:
        with store.open(object_key(sha)) as stream:
            while chunk := stream.read(CHUNK * 4):
                hasher.update(chunk)
    except NotFoundError:
        return False
    return hasher.hexdigest() == sha
