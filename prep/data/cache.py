"""A bounded, verified node-local cache of stored objects, shared by the ranks of one node.

Layout of `cache_dir`: `objects/<sha256>` (complete, proven files, named by content, so two
snapshots sharing a shard share one copy), `objects/.<sha256>.prep-tmp-*` (fetches under way),
`locks/<sha256>` (one flock per object: a fetch happens once however many readers want it),
`users/<id>.json` (one per live cache user: the objects it has pinned and the fetches it has
reserved room for), `cache.lock` (the flock every decision about room is taken under) and
`.prep/verified.jsonl` (pull's record of proven files, stat stamps included).

The size bound holds across processes because the ledger is the directory itself, read under
`cache.lock`: complete files count their size, a fetch under way counts its object's full size
from before its first byte is written until it is renamed into place. A user holds an exclusive
flock on its own users file for its whole life, so a user killed mid-fetch is seen as dead (its
file is unlocked): its reservations stop counting and its temporaries are deleted.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prep import hashing
from prep.data.plan import Need, Plan
from prep.data.source import check_file
from prep.errors import IntegrityError, UsageError
from prep.storage.base import Store
from prep.transfer.fetch import download_verified
from prep.transfer.shares import PullRecord, discard, temp_name
from prep.transfer.verify import DEFAULT_JOBS

POLICIES = ("belady", "lru")
ROOM_WAIT_SECONDS = 120.0  # how long a read waits for other users to release room before failing


@dataclass(frozen=True)
class CacheOptions:
    """Where the cache lives, its bound, how far ahead it prefetches and with how many fetches."""

    cache_dir: Path
    cache_bytes: int
    prefetch_steps: int | None = None
    prefetch_bytes: int | None = None
    jobs: int = min(DEFAULT_JOBS, 4)
    policy: str = "belady"
    horizon: int = 1024


@dataclass
class CacheStats:
    """What the cache did for one reader: hits, misses, bytes fetched (twice), peak, prefetch lead."""

    hits: int = 0
    misses: int = 0
    fetches: int = 0
    bytes_fetched: int = 0
    bytes_refetched: int = 0
    evictions: int = 0
    peak_bytes: int = 0
    leads: list[float] = field(default_factory=list)
    fetched: Counter[str] = field(default_factory=Counter)  # fetches per object sha256
    sizes: dict[str, int] = field(default_factory=dict)  # object sizes by sha256

    def to_json(self) -> dict[str, Any]:
        leads = sorted(self.leads)
        return {"hits": self.hits, "misses": self.misses, "fetches": self.fetches,
                "bytes_fetched": self.bytes_fetched, "bytes_refetched": self.bytes_refetched,
                "evictions": self.evictions, "peak_cache_bytes": self.peak_bytes,
                "prefetch_lead_seconds_min": leads[0] if leads else None,
                "prefetch_lead_seconds_median": leads[len(leads) // 2] if leads else None}


@dataclass(frozen=True)
class _Ledger:
    """The directory as read under cache.lock: complete files, bytes counted, what others hold."""

    complete: dict[str, os.stat_result]
    used: int
    held: frozenset[str]  # pinned or being fetched by some live user, this one included


def _is_sha(name: str) -> bool:
    return len(name) == 64 and all(c in "0123456789abcdef" for c in name)


class NodeCache:
    """One user's handle on a cache directory: fetch-once, verified, bounded, Belady or LRU."""

    def __init__(self, store: Store, options: CacheOptions) -> None:
        if options.cache_bytes < 1:
            raise UsageError(f"cache_bytes must be at least 1, got {options.cache_bytes}")
        if options.policy not in POLICIES:
            raise UsageError(f"cache policy must be one of {', '.join(POLICIES)}, got {options.policy!r}")
        self.store, self.options, self.limit = store, options, options.cache_bytes
        self.root = Path(options.cache_dir)
        self.objects = self.root / "objects"
        for folder in (self.objects, self.root / "locks", self.root / "users", self.root / ".prep"):
            folder.mkdir(parents=True, exist_ok=True)
        self.plan: Plan | None = None
        self.stats = CacheStats()
        self.record = PullRecord(self.root)
        self.stop = threading.Event()
        self._mutex = threading.Lock()
        self._lock_fd = os.open(self.root / "cache.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self._pinned: Counter[str] = Counter()
        self._fetching: dict[str, int] = {}
        self._fetched: set[str] = set()
        self._used_at: dict[str, float] = {}
        self._ready_at: dict[str, float] = {}
        self._user_fd, self._user_path = self._register()
        with self._locked():
            self._ledger()  # drop dead users and their temporaries now

    # ------------------------------------------------------------ users and the ledger

    def _register(self) -> tuple[int, Path]:
        """Create this user's file already flocked (made aside, renamed in), so no one sees it unlocked."""
        final = self.root / "users" / f"{uuid.uuid4().hex}.json"
        temp = temp_name(final)
        fd = os.open(temp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.replace(temp, final)
        return fd, final

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """This process's mutex, then cache.lock: every decision about room is taken under both."""
        with self._mutex:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def _publish(self) -> None:
        """Rewrite this user's file in place (its inode carries the flock); read only under cache.lock."""
        body = json.dumps({"pid": os.getpid(), "pinned": sorted(self._pinned), "fetching": self._fetching}).encode()
        os.ftruncate(self._user_fd, 0)
        os.pwrite(self._user_fd, body, 0)

    def _others(self) -> tuple[set[str], dict[str, int]]:
        """What live users other than this one hold; files of dead users are removed."""
        pinned: set[str] = set()
        fetching: dict[str, int] = {}
        for entry in os.scandir(self.root / "users"):
            if entry.path == str(self._user_path) or not entry.name.endswith(".json"):
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
                        state = json.loads(os.pread(fd, 1 << 24, 0) or b"{}")
                        pinned.update(state.get("pinned", []))
                        fetching.update(state.get("fetching", {}))
                else:
                    os.unlink(entry.path)  # dead: killed without closing
            finally:
                os.close(fd)
        return pinned, fetching

    def _ledger(self) -> _Ledger:
        """Read the directory (under cache.lock): count bytes, delete temporaries nobody fetches."""
        pinned, fetching = self._others()
        fetching.update(self._fetching)
        complete: dict[str, os.stat_result] = {}
        for entry in os.scandir(self.objects):
            if _is_sha(entry.name):
                with contextlib.suppress(FileNotFoundError):
                    complete[entry.name] = entry.stat()
            elif entry.name.startswith(".") and entry.name[1:65] not in fetching:
                discard(Path(entry.path))  # left by a killed fetch
        used = sum(info.st_size for info in complete.values())
        used += sum(size for sha, size in fetching.items() if sha not in complete)
        return _Ledger(complete, used, frozenset(pinned | set(fetching) | set(self._pinned)))

    # ------------------------------------------------------------ eviction

    def _rank(self, sha: str, info: os.stat_result) -> float:
        """Eviction order, highest first: Belady's next use (never: infinity), or LRU's age."""
        if self.options.policy == "lru":
            return -self._used_at.get(sha, info.st_mtime)
        use = self.plan.next_use(sha) if self.plan is not None else None
        return float("inf") if use is None else float(use)

    def _make_room(self, need: Need, demand: bool) -> bool:
        """Evict until `need` fits, then reserve it (under cache.lock); False if it cannot fit now.
        A prefetch evicts only files needed later than `need` (or never)."""
        ledger = self._ledger()
        if ledger.used + need.size <= self.limit:
            return self._reserve(need, ledger.used)
        floor = -float("inf")
        if not demand:
            if self.options.policy == "lru":
                return False
            use = self.plan.next_use(need.sha256) if self.plan is not None else None
            floor = float("inf") if use is None else float(use)
        victims = sorted(((self._rank(sha, info), sha, info.st_size) for sha, info in ledger.complete.items()
                          if sha not in ledger.held), reverse=True)
        chosen, freed = [], 0
        for rank, sha, size in victims:
            if ledger.used - freed + need.size <= self.limit or rank <= floor:
                break
            chosen.append(sha)
            freed += size
        if ledger.used - freed + need.size > self.limit:
            return False
        for sha in chosen:
            (self.objects / sha).unlink(missing_ok=True)
            self.stats.evictions += 1
        return self._reserve(need, ledger.used - freed)

    def _reserve(self, need: Need, used: int) -> bool:
        self._fetching[need.sha256] = need.size
        self._publish()
        self.stats.peak_bytes = max(self.stats.peak_bytes, used + need.size)
        return True

    # ------------------------------------------------------------ getting an object

    def path_of(self, sha256: str) -> Path:
        return self.objects / sha256

    @contextlib.contextmanager
    def using(self, need: Need) -> Iterator[Path]:
        """The object's verified file, pinned (never evicted) until the block ends."""
        if need.size > self.limit:
            raise UsageError(f"{need.what} is {need.size} bytes, more than cache_bytes {self.limit}; "
                             "give the reader a larger cache")
        path = self._obtain(need, demand=True)
        assert path is not None
        try:
            yield path
        finally:
            with self._locked():
                self._pinned[need.sha256] -= 1
                if self._pinned[need.sha256] <= 0:
                    del self._pinned[need.sha256]
                self._publish()

    def _pin_if_present(self, need: Need) -> bool:
        with self._locked():
            if not self.path_of(need.sha256).exists():
                return False
            self._pinned[need.sha256] += 1
            self._publish()
            return True

    def _obtain(self, need: Need, demand: bool) -> Path | None:
        """Pin (demand) or just fetch (prefetch) the object, fetching it once if absent."""
        final = self.path_of(need.sha256)
        if demand and self._pin_if_present(need):
            if self._usable(need, final):
                self._count_hit(need)
                return final
        elif not demand and final.exists():
            return None
        if demand:
            self.stats.misses += 1
        lock = os.open(self.root / "locks" / need.sha256, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if demand and self._pin_if_present(need):
                if self._usable(need, final):
                    return final
            elif not demand and final.exists():
                return None
            return self._fetch(need, final, demand)
        finally:
            os.close(lock)

    def _usable(self, need: Need, final: Path) -> bool:
        """A pinned file found in the cache: proven, or of the wrong size (a truncated file: it is
        removed and fetched again, unpinned). Right size, wrong bytes: IntegrityError."""
        try:
            size = final.stat().st_size
        except FileNotFoundError:
            size = -1
        if size == need.size:
            try:
                check_file(final, need.sha256, self.record, need.sha256)
                return True
            except IntegrityError as exc:
                self._unpin(need.sha256)
                raise IntegrityError(f"{exc.message} (cache file for {need.what}; delete it to fetch it again)") from None
        self._unpin(need.sha256)
        discard(final)
        return False

    def _unpin(self, sha: str) -> None:
        with self._locked():
            self._pinned[sha] -= 1
            if self._pinned[sha] <= 0:
                del self._pinned[sha]
            self._publish()

    def _count_hit(self, need: Need) -> None:
        now = time.monotonic()
        with self._mutex:
            self.stats.hits += 1
            self._used_at[need.sha256] = now
            ready = self._ready_at.pop(need.sha256, None)
            if ready is not None:
                self.stats.leads.append(now - ready)

    def _wait_for_room(self, need: Need, demand: bool) -> bool:
        """Reserve room for `need`; a read waits for other users to release some, a prefetch does not."""
        deadline = time.monotonic() + ROOM_WAIT_SECONDS
        while True:
            with self._locked():
                if self._make_room(need, demand):
                    return True
            if not demand:
                return False
            if time.monotonic() > deadline:
                raise UsageError(f"{self.root}: no room for {need.what} ({need.size} bytes) within cache_bytes "
                                 f"{self.limit}: the other readers of this cache hold the rest")
            time.sleep(0.02)

    def _fetch(self, need: Need, final: Path, demand: bool) -> Path | None:
        """Download `need` into `final` through the verified path, inside a reservation."""
        if not self._wait_for_room(need, demand):
            return None
        temp = temp_name(final)  # .<sha256>.prep-tmp-*: _ledger knows whose fetch it is
        again = need.sha256 in self._fetched
        try:
            installed = download_verified(self.store, hashing.Digest(need.sha256, need.size), final, temp=temp,
                                          what=need.what, on_bytes=lambda n: None, stop=self.stop)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise UsageError(f"{self.root}: disk full while caching {need.what}; lower cache_bytes") from None
            raise
        finally:
            discard(temp)
            with self._locked():
                self._fetching.pop(need.sha256, None)
                if demand and final.exists():
                    self._pinned[need.sha256] += 1
                self._publish()
        if installed is not None:
            self.record.add(need.sha256, need.sha256, installed)
            check_file(final, need.sha256, self.record, need.sha256)  # proven: recorded, not re-hashed
        with self._mutex:
            self.stats.fetches += 1
            self.stats.bytes_fetched += need.size
            self.stats.bytes_refetched += need.size if again else 0
            self._fetched.add(need.sha256)
            self.stats.fetched[need.sha256] += 1
            self.stats.sizes[need.sha256] = need.size
            self._used_at[need.sha256] = time.monotonic()
            if not demand:
                self._ready_at[need.sha256] = time.monotonic()
        return final if demand else None

    def prefetch(self, need: Need) -> None:
        """Fetch `need` ahead of its use when room can be made without evicting sooner needs."""
        if need.size <= self.limit:
            self._obtain(need, demand=False)

    def close(self) -> None:
        """Stop fetches, release this user's file (its pins and reservations stop counting)."""
        self.stop.set()
        with self._locked():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._user_path)
            os.close(self._user_fd)
        os.close(self._lock_fd)
        self.record.close()
