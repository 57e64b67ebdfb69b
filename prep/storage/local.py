"""A store on a local or shared POSIX filesystem.

Create-only puts publish a fully written, fsynced temporary file with `os.link`, which fails
if the final name exists: a reader can never see a partial object under its final name.
Refs are swapped under an exclusive `flock`, compared by the SHA-256 of their body.
Every OSError becomes a StorageIOError naming the operation and path (a full disk is one line,
not a traceback), and a failed put or swap removes its temporary. Every read of a key opens it with
`open_regular`, refs included: anything but a regular file there (a FIFO, a folder, a symlink to a
device), or a body read whole over its bound, is an IntegrityError naming the key, never a hang.
"""

from __future__ import annotations

import builtins
import errno
import fcntl
import hashlib
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import BinaryIO

from prep.errors import IntegrityError, NotFoundError, StorageIOError, StoreError
from prep.faults import crash_point
from prep.regular import open_regular, read_regular
from prep.storage.backend import MAX_BODY_BYTES, MAX_REF_BYTES, ObjectInfo, RefValue, Store, too_large
from prep.writeback import fsync_path

TMP_DIR = "tmp"


@contextmanager
def io_errors(operation: str, path: Path) -> Iterator[None]:
    """Turn an OSError inside the block into a StorageIOError naming `operation` and `path`."""
    try:
        yield
    except OSError as exc:
        raise StorageIOError.from_os_error(operation, path, exc) from exc


def _newest_mtime(path: Path) -> float:
    """The latest mtime of `path` and, for a folder, of everything below it."""
    newest = path.lstat().st_mtime
    if path.is_dir() and not path.is_symlink():
        for child in path.rglob("*"):
            newest = max(newest, child.lstat().st_mtime)
    return newest


def _disk_size(path: Path) -> int:
    """Bytes of a file, or of the files below a folder."""
    if path.is_dir() and not path.is_symlink():
        return sum(child.lstat().st_size for child in path.rglob("*") if child.is_file())
    return path.lstat().st_size


class LocalStore(Store):
    """Keys map to files below `root`; temporaries live in `root/tmp`. Opening creates nothing:
    the folders appear with the first write, so reading a path that is no store leaves it alone."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root).absolute()
        self.url = str(self.root)

    def _path(self, key: str) -> Path:
        if not key or key.startswith("/") or ".." in key.split("/"):
            raise StoreError(f"invalid store key {key!r}")
        return self.root / key

    def staging_dir(self) -> Path:
        return self._tmp_dir()

    def _tmp_dir(self) -> Path:
        """`root/tmp`, created (with the root) on first use by a write."""
        folder = self.root / TMP_DIR
        if not folder.is_dir():
            with io_errors("creating store folder", folder):
                self._makedirs(folder)
        return folder

    def stale_staging(self, cutoff: float) -> builtins.list[ObjectInfo]:
        folder = self.root / TMP_DIR
        stale = []
        for path in sorted(folder.iterdir()) if folder.is_dir() else []:
            try:
                if _newest_mtime(path) <= cutoff:
                    stale.append(ObjectInfo(f"{TMP_DIR}/{path.name}", _disk_size(path), path.lstat().st_mtime))
            except FileNotFoundError:
                continue
        return stale

    def delete_staging(self, info: ObjectInfo) -> None:
        path = self._path(info.key)
        if path.parent != self.root / TMP_DIR:
            raise StoreError(f"{self.url}: {info.key!r} is not in the staging folder")
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
            return
        with io_errors("deleting", path):
            path.unlink(missing_ok=True)

    def _temp_path(self) -> Path:
        return self._tmp_dir() / f"{uuid.uuid4().hex}.part"

    def _makedirs(self, folder: Path) -> None:
        """Create `folder` and fsync each new folder's parent, so a power loss cannot drop a
        folder whose files were already reported as written."""
        missing = []
        while not folder.exists():
            missing.append(folder)
            folder = folder.parent
        for new in reversed(missing):
            try:
                new.mkdir()
            except FileExistsError:
                continue
            fsync_path(new.parent)

    def _publish(self, temp: Path, final: Path) -> bool:
        crash_point("store.before_link")
        self._makedirs(final.parent)
        try:
            os.link(temp, final)
        except FileExistsError:
            return False
        fsync_path(final.parent)
        return True

    def _create(self, key: str, fill: Callable[[Path], object]) -> bool:
        """Create-only publish: `fill` writes a new temporary, which is fsynced, made read-only
        and hard-linked to the final name (the link fails if the name exists)."""
        final = self._path(key)
        with io_errors("reading", final):
            if final.exists():
                return False
        temp = self._temp_path()
        try:
            with io_errors("writing", final):
                fill(temp)
                with open(temp, "rb+") as handle:
                    os.fsync(handle.fileno())
                os.chmod(temp, 0o444)
                return self._publish(temp, final)
        finally:  # also on KeyboardInterrupt: a failed put leaves nothing in tmp/
            self._discard(temp)

    @staticmethod
    def _discard(temp: Path) -> None:
        """Remove a temporary; failing to (say, EIO) must not hide the error being handled."""
        with suppress(OSError):
            temp.unlink(missing_ok=True)

    def put_file(self, key: str, path: Path) -> bool:
        # hazard: a hard link shares the inode, so the chmod below and any later write to the
        # caller's file would reach the object: only files staged under our tmp/ are linked
        staged = self.root / TMP_DIR in Path(os.path.abspath(path)).parents

        def fill(temp: Path) -> None:
            if staged:
                try:
                    os.link(path, temp)  # same filesystem: no copy
                    return
                except OSError as exc:
                    if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
                        raise
            shutil.copyfile(path, temp)

        return self._create(key, fill)

    def put_bytes(self, key: str, data: bytes) -> bool:
        return self._create(key, lambda temp: temp.write_bytes(data))

    @contextmanager
    def _key_errors(self, key: str, limit: int = 0) -> Iterator[None]:
        """An OSError reading `key` as the contract names it: NotFoundError when absent, IntegrityError for
        anything but a regular file there or a body over `limit`, else a StorageIOError."""
        try:
            yield
        except OSError as exc:
            source = f"{self.url}/{key}"
            if exc.errno == errno.ENOENT:
                raise NotFoundError(f"{self.url}: no such key {key!r}") from exc
            if exc.errno == errno.EINVAL:  # what open_regular says of a FIFO, a folder, a device
                raise IntegrityError(f"{source}: not a regular file, so not read") from None
            if exc.errno == errno.EFBIG:
                raise too_large(source, limit) from None
            raise StorageIOError.from_os_error("reading", self._path(key), exc) from exc

    def open(self, key: str) -> BinaryIO:
        with self._key_errors(key):
            return os.fdopen(open_regular(self._path(key)), "rb")  # a FIFO planted at a key: an error, never a hang

    def get_bytes(self, key: str, limit: int = MAX_BODY_BYTES) -> bytes:
        with self._key_errors(key, limit):
            return read_regular(self._path(key), limit)

    def get_range(self, key: str, start: int, length: int) -> bytes:
        with self.open(key) as stream, io_errors("reading", self._path(key)):
            stream.seek(start)
            return stream.read(length)

    def head(self, key: str) -> ObjectInfo | None:
        path = self._path(key)
        try:
            with io_errors("reading", path):
                stat = path.stat()
        except StorageIOError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                return None
            raise
        return ObjectInfo(key=key, size=stat.st_size, mtime=stat.st_mtime)

    def _walk(self, prefix: str) -> Iterator[tuple[str, str, builtins.list[str], builtins.list[str]]]:
        """(folder path, its key, subfolders, files) of every folder that may hold keys under
        `prefix`, the staging folder left out; a folder that cannot be read is a StorageIOError."""
        base = self.root / prefix.rsplit("/", 1)[0] if "/" in prefix else self.root
        if not base.is_dir():
            return

        def walk_error(exc: OSError) -> None:
            if not isinstance(exc, FileNotFoundError):  # a folder gc removed meanwhile is just gone
                raise StorageIOError.from_os_error("listing", Path(exc.filename or base), exc)

        for dirpath, dirnames, filenames in os.walk(base, onerror=walk_error):
            rel_dir = Path(dirpath).relative_to(self.root).as_posix()
            if rel_dir == TMP_DIR or rel_dir.startswith(TMP_DIR + "/"):
                dirnames[:] = []
                continue
            yield dirpath, rel_dir, dirnames, filenames

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        found: builtins.list[ObjectInfo] = []
        for dirpath, rel_dir, _, filenames in self._walk(prefix):
            for name in filenames:
                key = name if rel_dir == "." else f"{rel_dir}/{name}"
                if key.startswith(prefix) and not name.endswith(".lock"):
                    try:
                        with io_errors("listing", Path(dirpath, name)):
                            stat = os.stat(os.path.join(dirpath, name))
                    except StorageIOError as exc:
                        if exc.errno == errno.ENOENT:
                            continue  # deleted while listed
                        raise
                    found.append(ObjectInfo(key=key, size=stat.st_size, mtime=stat.st_mtime))
        yield from sorted(found, key=lambda info: info.key)

    def folders_at_keys(self, prefix: str, suffix: str) -> builtins.list[str]:
        return sorted(rel_dir for _, rel_dir, dirnames, filenames in self._walk(prefix)
                      if not dirnames and not filenames and rel_dir.startswith(prefix) and rel_dir.endswith(suffix))

    def delete(self, key: str) -> None:
        path = self._path(key)
        with io_errors("deleting", path):
            path.unlink(missing_ok=True)

    def remove_empty_folder(self, prefix: str) -> None:
        path = self._path(prefix.rstrip("/"))
        with suppress(OSError):  # not empty (a key was written meanwhile), or gone already
            path.rmdir()

    def local_path(self, key: str) -> Path | None:
        return self._path(key)

    def read_ref(self, key: str) -> RefValue | None:
        try:
            body = self.get_bytes(key, MAX_REF_BYTES)
        except NotFoundError:
            return None
        return RefValue(body=body, token=hashlib.sha256(body).hexdigest())

    def swap_ref(self, key: str, body: bytes, expected: str | None) -> bool:
        final = self._path(key)
        with io_errors("creating folder", final.parent):
            self._makedirs(final.parent)
        lock_path = final.with_name(final.name + ".lock")
        with io_errors("locking", lock_path), open(lock_path, "a+b") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            current = self.read_ref(key)
            current_token = current.token if current else None
            if current_token != expected:
                return False
            temp = self._temp_path()
            try:
                with io_errors("writing", final):
                    with open(temp, "xb") as handle:
                        handle.write(body)
                        handle.flush()
                        os.fsync(handle.fileno())
                    os.replace(temp, final)
                    fsync_path(final.parent)
            finally:
                self._discard(temp)  # gone after the replace; still there if a write failed
            return True
