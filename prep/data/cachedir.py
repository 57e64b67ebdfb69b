"""The node-local cache's folder and the locks its users share (prep.data.nodecache decides with them).

Layout of `cache_dir`:
- `objects/<sha256>`: complete, proven files, named by content (two snapshots sharing a shard
  share one copy); `objects/.<sha256>.prep-tmp-*`: fetches under way.
- `locks/<sha256>`: one flock per object. A fetch holds it exclusively (so an object is fetched
  once however many readers want it: the others wait on the lock, then find the file); a reader
  holds it shared while it reads the file (a pin: nobody evicts a file a reader has mapped); an
  eviction takes it exclusively without waiting, and skips the file if it cannot.
- `users/<id>.json`: one per live cache user, holding an exclusive flock on its own file for its
  whole life and listing the fetches it has reserved room for. A user killed mid-fetch leaves an
  unlocked file: it is seen as dead, its reservations stop counting, its temporaries are deleted.
- `cache.lock`: every decision about room is taken under this flock; `pressure`: touched by a user
  waiting for room, so the others drop the pins they keep between steps.
- `.prep/verified.jsonl`: pull's record of proven files, kept bounded (prep.data.cacherecord).

The ledger is the directory itself read under `cache.lock`: complete files count their size, a
fetch under way counts its object's full size from before its first byte is written until it is
renamed into place. So the bound holds across processes with nothing to keep in step.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from prep.errors import StorageIOError, UsageError
from prep.transfer.shares import discard, temp_name


@dataclass(frozen=True)
class Ledger:
    """The directory as read under cache.lock: complete files, bytes counted, fetches under way."""

    complete: dict[str, os.stat_result]
    used: int
    fetching: frozenset[str]


def is_sha(name: str) -> bool:
    return len(name) == 64 and all(c in "0123456789abcdef" for c in name)


def _identity(info: os.stat_result) -> tuple[int, int]:
    return (info.st_ino, info.st_dev)


OWN_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # never through a symlink, nor blocking on a FIFO


def remove_entry(path: Path) -> None:
    """Remove whatever is at `path` (a file, a FIFO, a symlink, an empty folder); a full folder is an OSError."""
    try:
        path.unlink()
    except IsADirectoryError:
        path.rmdir()
    except FileNotFoundError:
        pass


def present(path: Path, size: int) -> bool:
    """Whether a regular file of `size` bytes is at `path` (through a symlink: its bytes are proven anyway)."""
    try:
        info = path.stat()
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise StorageIOError.from_os_error("reading", path, exc) from None
    return stat.S_ISREG(info.st_mode) and info.st_size == size


def open_own(path: Path, flags: int) -> int:
    """One of the cache's own files (a lock, the pressure file), created if absent; anything else at its
    name (a FIFO, a symlink, an empty folder: not the cache's) is removed first. StorageIOError otherwise."""
    try:
        for _ in range(3):  # another user may remove and recreate it meanwhile
            try:
                fd = os.open(path, flags | os.O_CREAT | OWN_FLAGS, 0o644)
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
                    raise
            else:
                if stat.S_ISREG(os.fstat(fd).st_mode):
                    return fd
                os.close(fd)
            remove_entry(path)
        raise OSError(errno.EEXIST, "not a regular file")
    except OSError as exc:
        raise StorageIOError.from_os_error("opening", path, exc) from None


def _reservations(body: bytes) -> dict[str, int]:
    """A live user's reservations ({sha256: size}); what its file holds besides is ignored."""
    try:
        found = json.loads(body or b"{}")
    except ValueError:
        return {}
    fetching = found.get("fetching") if isinstance(found, dict) else None
    if not isinstance(fetching, dict):
        return {}
    return {sha: size for sha, size in fetching.items() if is_sha(sha) and type(size) is int and size >= 0}


class CacheDir:
    """One user's view of a cache folder: its own users file, cache.lock, the per-object locks."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.objects = root / "objects"
        if root.exists() and not root.is_dir():
            raise UsageError(f"cache_dir {root} is not a folder")
        try:
            for folder in (self.objects, root / "locks", root / "users", root / ".prep"):
                folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageIOError.from_os_error("creating the cache folder", root, exc) from None
        self.pressure = root / "pressure"
        self._mutex = threading.Lock()
        with contextlib.ExitStack() as undo:  # a failure (a read-only folder) leaves no descriptor open
            self._pressure_fd = open_own(self.pressure, os.O_RDWR | os.O_APPEND)
            undo.callback(os.close, self._pressure_fd)
            self._lock_fd = open_own(root / "cache.lock", os.O_RDWR)
            undo.callback(os.close, self._lock_fd)
            self._lock_id = _identity(os.fstat(self._lock_fd))
            self.user_fd, self.user_path = self._register()
            undo.pop_all()
        self._closed = False

    def _register(self) -> tuple[int, Path]:
        """This user's file, flocked before it is renamed in, so no one ever sees it unlocked."""
        final = self.root / "users" / f"{uuid.uuid4().hex}.json"
        temp = temp_name(final)
        try:
            fd = os.open(temp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise StorageIOError.from_os_error("registering a cache user in", final.parent, exc) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.replace(temp, final)
        except OSError as exc:
            os.close(fd)
            discard(temp)
            raise StorageIOError.from_os_error("registering a cache user in", final.parent, exc) from None
        return fd, final

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """This process's mutex, then cache.lock; refused once closed."""
        with self._mutex:
            # A fetch close() stopped waiting for may end later: its descriptors' numbers may
            # belong to other files by then, which writing through them would clobber.
            if self._closed:
                raise UsageError(f"{self.root}: this cache user is closed")
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
            try:
                self._check_in_place()
                yield
            except OSError as exc:  # the folder changed behind the cache's back (a folder at an entry's name, say)
                raise StorageIOError.from_os_error("using the cache", exc.filename or self.root, exc) from None
            finally:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def _check_in_place(self) -> None:
        """Refuse to decide about room once cache.lock is not the file this user locks (the folder was
        removed, or replaced by a fresh cache other users share): their decisions would not exclude ours."""
        try:
            now = _identity(os.stat(self.root / "cache.lock"))
        except FileNotFoundError:
            now = None
        if now != self._lock_id:
            raise StorageIOError("using the cache", self.root, "the folder was removed or replaced while this "
                                 "reader used it; open a new Reader")

    def publish(self, fetching: dict[str, int]) -> None:
        """Rewrite this user's reservations in place (the inode carries the flock); call under `locked`."""
        body = json.dumps({"pid": os.getpid(), "fetching": fetching}).encode()
        os.ftruncate(self.user_fd, 0)
        os.pwrite(self.user_fd, body, 0)

    def _others_fetching(self) -> dict[str, int]:
        """Reservations of the live users other than this one; files of dead users are removed."""
        fetching: dict[str, int] = {}
        for entry in os.scandir(self.root / "users"):
            if entry.path == str(self.user_path) or not entry.name.endswith(".json"):
                continue
            try:
                fd = os.open(entry.path, os.O_RDONLY | OWN_FLAGS)
            except OSError as exc:
                if exc.errno in (errno.ENOENT, errno.ELOOP):  # gone; a symlink is no user's file
                    continue
                raise
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO or folder planted there: no user's
                    continue
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:  # alive: its owner holds the lock
                    fetching.update(_reservations(os.pread(fd, 1 << 24, 0)))
                else:
                    os.unlink(entry.path)  # dead: killed without closing
            finally:
                os.close(fd)
        return fetching

    def ledger(self, mine: dict[str, int]) -> Ledger:
        """Read the directory (call under `locked`): count bytes, delete temporaries nobody fetches."""
        fetching = {**self._others_fetching(), **mine}
        complete: dict[str, os.stat_result] = {}
        for entry in os.scandir(self.objects):
            if is_sha(entry.name):
                with contextlib.suppress(FileNotFoundError):
                    if not entry.is_dir(follow_symlinks=False):  # a folder there is no cache file to evict
                        complete[entry.name] = entry.stat()
            elif entry.name.startswith(".") and entry.name[1:65] not in fetching:
                discard(Path(entry.path))  # left by a killed fetch
        used = sum(info.st_size for info in complete.values())
        used += sum(size for sha, size in fetching.items() if sha not in complete)
        return Ledger(complete, used, frozenset(fetching))

    def object_lock(self, sha256: str) -> int:
        """An open descriptor on the object's lock file (flock it shared to read, exclusive to write)."""
        try:
            return open_own(self.root / "locks" / sha256, os.O_RDWR)
        except StorageIOError:
            self._check_in_place()  # the folder was removed: say so
            raise

    def try_evict(self, sha256: str) -> bool:
        """Delete a complete file unless a reader has it pinned (its lock is held); under `locked`."""
        fd = self.object_lock(sha256)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            (self.objects / sha256).unlink(missing_ok=True)
            return True
        finally:
            os.close(fd)  # closing drops the lock

    def signal_pressure(self) -> None:
        """Tell the other users that someone waits for room (they drop the pins they keep idle)."""
        with contextlib.suppress(OSError):  # a full disk: the others drop their pins at their next step anyway
            os.write(self._pressure_fd, b".")
            if os.fstat(self._pressure_fd).st_size > 1 << 16:
                os.ftruncate(self._pressure_fd, 0)

    def pressure_mark(self) -> tuple[int, int]:
        """Changes whenever someone signals pressure (size and mtime: either may repeat alone); an fstat,
        no path lookup, since every step asks (signal_pressure appends or truncates, never replaces the file)."""
        info = os.fstat(self._pressure_fd)
        return (info.st_size, info.st_mtime_ns)

    def close(self) -> None:
        """Remove this user's file and close every descriptor, once; `locked` refuses afterwards."""
        with self._mutex:
            if self._closed:
                return
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.user_path)
            self._closed = True
            for fd in (self.user_fd, self._pressure_fd, self._lock_fd):  # the last one drops cache.lock
                os.close(fd)
