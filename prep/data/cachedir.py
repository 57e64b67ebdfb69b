"""The node-local cache's folder and the locks its users share (prep.data.cache decides with them).

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
- `.prep/verified.jsonl`: pull's record of proven files (prep.transfer.shares.PullRecord).

The ledger is the directory itself read under `cache.lock`: complete files count their size, a
fetch under way counts its object's full size from before its first byte is written until it is
renamed into place. So the bound holds across processes with nothing to keep in step.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
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
        self._pressure_fd = os.open(self.pressure, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self._mutex = threading.Lock()
        self._lock_fd = os.open(root / "cache.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self.user_fd, self.user_path = self._register()
        self._closed = False

    def _register(self) -> tuple[int, Path]:
        """This user's file, flocked before it is renamed in, so no one ever sees it unlocked."""
        final = self.root / "users" / f"{uuid.uuid4().hex}.json"
        temp = temp_name(final)
        fd = os.open(temp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.replace(temp, final)
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
                yield
            finally:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

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
                fd = os.open(entry.path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:  # alive: its owner holds the lock
                    with contextlib.suppress(ValueError):
                        fetching.update(json.loads(os.pread(fd, 1 << 24, 0) or b"{}").get("fetching", {}))
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
                    complete[entry.name] = entry.stat()
            elif entry.name.startswith(".") and entry.name[1:65] not in fetching:
                discard(Path(entry.path))  # left by a killed fetch
        used = sum(info.st_size for info in complete.values())
        used += sum(size for sha, size in fetching.items() if sha not in complete)
        return Ledger(complete, used, frozenset(fetching))

    def object_lock(self, sha256: str) -> int:
        """An open descriptor on the object's lock file (flock it shared to read, exclusive to write)."""
        return os.open(self.root / "locks" / sha256, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)

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
        with open(self.pressure, "ab") as out:
            out.write(b".")
        with contextlib.suppress(OSError):
            if self.pressure.stat().st_size > 1 << 16:
                self.pressure.write_bytes(b"")

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
