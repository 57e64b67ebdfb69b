"""A bounded, verified node-local cache of stored objects, shared by the ranks of one node (the
folder and its locks: prep.data.cachedir).

An object is fetched on first need through the one verified download path
(prep.transfer.fetch.download_verified: hashed while copied, renamed into place only when
proven). A file found in the cache is used only after its identity is checked: a wrong size (a
file truncated behind the cache's back) is deleted and fetched again; the right size is proven by
pull's record (its stat stamp unchanged) or hashed once per process, and a mismatch is an
IntegrityError naming the file. Eviction drops the file needed furthest in the future by the
reader's plan (Belady), or the least recently used one (LRU, for comparison).

A reader keeps a file it read open and pinned (a shared flock) while the next step reads it (the
next KEEP_STEPS steps once the cache is calm), so a step whose shards are all pinned costs one
lock and no system call (pin_held); pins are dropped when this user needs room, and when another
user signals that it waits for room.

The cache's values are here too: its options (CacheOptions, refused when made if one would fail
mid-run), what it did for one reader (CacheStats) and a pinned file's hold (Hold).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import threading
import time
from collections import Counter, deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prep import hashing
from prep.data.cachedir import CacheDir, present, remove_entry
from prep.data.cacherecord import CacheRecord
from prep.data.checks import whole
from prep.data.plan import Need, Plan
from prep.data.pread import TokenFile
from prep.data.source import open_checked, open_file_budget
from prep.errors import IntegrityError, StorageIOError, UsageError
from prep.storage.backend import Store
from prep.transfer.fetch import download_verified
from prep.transfer.shares import discard, temp_name
from prep.transfer.verify import DEFAULT_JOBS

POLICIES = ("belady", "lru")
ROOM_WAIT_SECONDS = 120.0  # how long a read waits for other users to release room before failing
KEEP_STEPS = 8  # when the cache is calm, an idle pin stays while one of this many coming steps reads the file
LEADS_KEPT = 4096  # prefetch leads the median is taken over: the latest ones, so a long run's memory stays flat


@dataclass(frozen=True)
class CacheOptions:
    """Where the cache lives, its bound, how far ahead it prefetches and with how many fetches."""

    cache_dir: Path
    cache_bytes: int
    prefetch_steps: int | None = None
    prefetch_bytes: int | None = None
    jobs: int = min(DEFAULT_JOBS, 4)
    policy: str = "belady"
    horizon: int = 256

    def __post_init__(self) -> None:
        """Refuse now, naming it, an option that would fail mid-run or be bent silently (a size
        given as "1GB", a negative lookahead)."""
        whole("cache_bytes", self.cache_bytes)
        for name in ("prefetch_steps", "prefetch_bytes"):
            if getattr(self, name) is not None:
                whole(name, getattr(self, name), 0)
        whole("jobs", self.jobs)
        whole("horizon", self.horizon)


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
    leads: deque[float] = field(default_factory=lambda: deque(maxlen=LEADS_KEPT))  # the latest leads
    lead_min: float | None = None  # over the whole run
    fetched: Counter[str] = field(default_factory=Counter)  # fetches per object sha256
    sizes: dict[str, int] = field(default_factory=dict)  # object sizes by sha256

    def count_fetch(self, sha256: str, size: int) -> None:
        """One object fetched (again, if it was fetched before)."""
        self.fetches += 1
        self.bytes_fetched += size
        self.bytes_refetched += size if sha256 in self.fetched else 0
        self.fetched[sha256] += 1
        self.sizes[sha256] = size

    def add_lead(self, seconds: float) -> None:
        """How long before its first use a prefetched object was ready."""
        self.leads.append(seconds)
        self.lead_min = seconds if self.lead_min is None else min(self.lead_min, seconds)

    def to_json(self) -> dict[str, Any]:
        leads = sorted(self.leads)
        return {"hits": self.hits, "misses": self.misses, "fetches": self.fetches,
                "bytes_fetched": self.bytes_fetched, "bytes_refetched": self.bytes_refetched,
                "evictions": self.evictions, "peak_cache_bytes": self.peak_bytes,
                "prefetch_lead_seconds_min": self.lead_min,
                "prefetch_lead_seconds_median": leads[len(leads) // 2] if leads else None}


@dataclass
class Hold:
    """A pinned cache file: its lock descriptor (flocked shared), the file held open for reading, its path."""

    fd: int
    file: TokenFile
    path: Path
    refs: int = 0
    closing: bool = False  # dropped by close() while in use: closed at its last release


class NodeCache:
    """One user's handle on a cache directory: fetch-once, verified, bounded, Belady or LRU."""

    def __init__(self, store: Store, options: CacheOptions) -> None:
        if options.policy not in POLICIES:
            raise UsageError(f"cache policy must be one of {', '.join(POLICIES)}, got {options.policy!r}")
        self.store, self.options, self.limit = store, options, options.cache_bytes
        self.dir = CacheDir(Path(options.cache_dir))
        self.plan: Plan | None = None
        self.stats = CacheStats()
        self.record = CacheRecord(self.dir.root)
        self.stop = threading.Event()
        self._mutex = threading.Lock()  # never held while taking self.dir.locked()
        self._holds: dict[str, Hold] = {}
        self._max_holds = open_file_budget()  # two descriptors each: the lock and the file
        self._fetching: dict[str, int] = {}
        self._used_at: dict[str, float] = {}
        self._ready_at: dict[str, float] = {}
        self._pressure = self.dir.pressure_mark()
        self._calm = self._evictions_seen = 0  # steps since this user evicted or saw pressure; evictions then
        self._pressure_mid_step = False  # pressure answered while pins were in use: they go at the next settle
        try:
            with self.dir.locked():
                ledger = self.dir.ledger(self._fetching)  # drop dead users and their temporaries now
                with contextlib.suppress(OSError):  # a full disk: the record is only advisory
                    self.record.tend(ledger.complete)
        except BaseException:
            self.dir.close()
            raise

    def path_of(self, sha256: str) -> Path:
        return self.dir.objects / sha256

    def has(self, sha256: str) -> bool:
        """Whether the object is in the cache now (pinned by this user, or its file is there)."""
        return sha256 in self._holds or self.path_of(sha256).exists()

    # ------------------------------------------------------------ pins

    @contextlib.contextmanager
    def using(self, need: Need) -> Iterator[Hold]:
        """The object's verified file, open and pinned (never evicted) at least until the block ends."""
        hold = self.acquire(need)
        try:
            yield hold
        finally:
            self.release(hold)

    def release(self, *holds: Hold) -> None:
        """End one use of holds from `acquire` or `pin_held` (the pins may stay until no coming step needs them)."""
        with self._mutex:
            for hold in holds:
                hold.refs -= 1
                if hold.closing and hold.refs <= 0:
                    self._holds_drop(hold)

    def pin_held(self, needs: Sequence[Need]) -> list[Hold] | None:
        """One more use of each object this user holds already, all or none (None: `acquire` them one by one);
        the hit path of a step, one lock and no system call."""
        with self._mutex:
            holds = self._holds
            try:
                found = [holds[need.sha256] for need in needs]
            except KeyError:
                return None
            for hold in found:
                hold.refs += 1
            self.stats.hits += len(found)
            if self.options.policy == "lru":
                now = time.monotonic()
                for need in needs:
                    self._used_at[need.sha256] = now
            return found

    def held(self) -> frozenset[str]:
        """The objects this user holds (so the cache has them) now."""
        with self._mutex:
            return frozenset(self._holds)

    def acquire(self, need: Need) -> Hold:
        """A hold on the object (kept from an earlier step, found in the cache, or fetched now);
        every call must be paired with `release`."""
        if self.stop.is_set():  # closed: a pin taken now would never be released, blocking every eviction of it
            raise UsageError(f"{self.dir.root}: this reader's cache is closed; open a new Reader")
        if need.size > self.limit:
            raise UsageError(f"{need.what} is {need.size} bytes, more than cache_bytes {self.limit}; "
                             "give the reader a larger cache")
        with self._mutex:
            hold = self._holds.get(need.sha256)
            if hold is not None:
                hold.refs += 1
                self.stats.hits += 1
                self._used_at[need.sha256] = time.monotonic()
                return hold
        deadline = time.monotonic() + ROOM_WAIT_SECONDS
        fd = self.dir.object_lock(need.sha256)
        try:
            hold = self._pin_or_fetch(need, fd, deadline)
        except BaseException:
            os.close(fd)
            raise
        with self._mutex:
            other = self._holds.get(need.sha256)
            if other is None:
                self._holds[need.sha256] = hold
                self._trim_holds()
                return hold
            other.refs += 1  # another thread of this user pinned it meanwhile: keep one hold
        hold.refs = 0
        self._holds_drop(hold)
        return other

    @staticmethod
    def _holds_drop(hold: Hold) -> None:
        hold.file.close()
        os.close(hold.fd)

    def _pin_or_fetch(self, need: Need, fd: int, deadline: float) -> Hold:
        """Pin the file (shared lock), fetching it first under the exclusive lock when it is absent.
        Lock conversions are not atomic (flock(2)), so every step re-checks what it finds."""
        missed = False
        while True:
            self._lock_shared(fd)
            hold = self._open(need, fd)
            if hold is not None:
                if not missed:
                    self._count_hit(need)
                return hold
            if not missed:
                missed = True
                self.stats.misses += 1
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # someone fetches it (the shared lock waits for that) or reads it
                if time.monotonic() > deadline:
                    raise UsageError(f"{self.dir.root}: {need.what} could not be pinned for "
                                     f"{ROOM_WAIT_SECONDS:.0f} s: cache_bytes {self.limit} is too small") from None
                time.sleep(0.002)
                continue
            self._fetch_locked(need, demand=True)

    def _lock_shared(self, fd: int) -> None:
        """Take the object's shared lock; before waiting for it, drop this user's idle pins, which
        whoever holds the lock may be waiting for room from."""
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            self._release_idle()
            fcntl.flock(fd, fcntl.LOCK_SH)

    def _open(self, need: Need, fd: int) -> Hold | None:
        """Open the cache file if it is there with the right size, after proving its bytes."""
        final = self.path_of(need.sha256)
        if not present(final, need.size):
            return None  # truncated, or no file: the fetch (under the exclusive lock) deletes and refetches it
        try:
            file = open_checked(final, need.sha256, self.record, need.sha256, note=f"; cache file for {need.what}",
                                kind="index" if need.what.endswith(".idx") else "shard")
        except IntegrityError as exc:
            raise IntegrityError(f"{exc.message} (cache file for {need.what}; delete it to fetch it again)") from None
        return Hold(fd, file, final, refs=1)

    def _release(self, sha256: str) -> None:
        """Close and unpin a hold (call under self._mutex); one still in use (close() during a read) is
        closed at its last release, so no read goes to a descriptor number reused meanwhile."""
        hold = self._holds.pop(sha256)
        if hold.refs > 0:
            hold.closing = True
        else:
            self._holds_drop(hold)

    def _trim_holds(self) -> None:
        """Past the descriptor budget, drop the oldest idle pins (under self._mutex): a step may read more files than that."""
        excess = len(self._holds) - self._max_holds
        if excess > 0:
            for sha in [sha for sha, hold in self._holds.items() if hold.refs <= 0][:excess]:
                self._release(sha)

    def _release_idle(self, keep: Iterable[str] = ()) -> None:
        kept = set(keep)
        with self._mutex:
            for sha in [sha for sha, hold in self._holds.items() if hold.refs <= 0 and sha not in kept]:
                self._release(sha)

    def unpin_idle(self, sha256s: Iterable[str]) -> None:
        """Drop this user's idle pins of these objects now: files read once (the .idx) that no step
        will read, whose pins would otherwise hold room until a batch, maybe never, settles them."""
        with self._mutex:
            for sha in set(sha256s):
                hold = self._holds.get(sha)
                if hold is not None and hold.refs <= 0:
                    self._release(sha)

    def settle(self, next_objects: frozenset[str]) -> None:
        """Between steps: keep pinned what the next step reads, or the next KEEP_STEPS steps once as many
        steps passed with no eviction here and no pressure; none if others wait for room."""
        evictions = self.stats.evictions
        pressured = self.answer_pressure()
        with self._mutex:
            pressured, self._pressure_mid_step = pressured or self._pressure_mid_step, False
        if pressured:
            self._release_idle()
            return
        self._calm = self._calm + 1 if evictions == self._evictions_seen else 0
        self._evictions_seen = evictions
        with self._mutex:
            others = self._holds.keys() - next_objects
        if others:
            calm = self._calm >= KEEP_STEPS
            self._release_idle(next_objects | {sha for sha in others if calm and self._needed_soon(sha)})

    def answer_pressure(self) -> bool:
        """Drop the idle pins if another user signalled that it waits for room since this user last
        looked (True then); between steps, and every PRESSURE_POLL_SECONDS while the reader idles."""
        mark = self.dir.pressure_mark()
        with self._mutex:
            if mark == self._pressure:
                return False
            self._pressure, self._calm = mark, 0
            # a prefetch thread may answer during a step: the pins that step uses cannot go now
            self._pressure_mid_step |= any(hold.refs > 0 for hold in self._holds.values())
        self._release_idle()
        return True

    def _needed_soon(self, sha256: str) -> bool:
        use = self.plan.next_use(sha256) if self.plan is not None else None
        return use is not None and self.plan is not None and use < self.plan.start + KEEP_STEPS

    def _count_hit(self, need: Need) -> None:
        now = time.monotonic()
        with self._mutex:
            self.stats.hits += 1
            self._used_at[need.sha256] = now
            ready = self._ready_at.pop(need.sha256, None)
            if ready is not None:
                self.stats.add_lead(now - ready)

    # ------------------------------------------------------------ room

    def _rank(self, sha: str, info: os.stat_result) -> float:
        """Eviction order, highest first: Belady's next use (never: infinity), or LRU's age."""
        if self.options.policy == "lru":
            return -self._used_at.get(sha, info.st_mtime)
        use = self.plan.next_use(sha) if self.plan is not None else None
        return float("inf") if use is None else float(use)

    def _make_room(self, need: Need, demand: bool) -> bool:
        """Evict until `need` fits, then reserve it (under cache.lock); False if it cannot fit now.
        A prefetch evicts only files needed later than `need` (or never)."""
        ledger = self.dir.ledger(self._fetching)
        used = ledger.used
        if used + need.size > self.limit:
            floor = -float("inf")
            if not demand:
                if self.options.policy == "lru":
                    return False
                use = self.plan.next_use(need.sha256) if self.plan is not None else None
                floor = float("inf") if use is None else float(use)
            victims = sorted(((self._rank(sha, info), sha, info.st_size) for sha, info in ledger.complete.items()
                              if sha not in ledger.fetching), reverse=True)
            for rank, sha, size in victims:
                if used + need.size <= self.limit or rank <= floor:
                    break
                if self._evict(sha):
                    used -= size
            if used + need.size > self.limit:
                return False
        self._fetching[need.sha256] = need.size
        self.dir.publish(self._fetching)
        self.stats.peak_bytes = max(self.stats.peak_bytes, used + need.size)
        return True

    def _evict(self, sha: str) -> bool:
        """Delete a cache file unless some reader uses it; this user's idle pin does not count."""
        with self._mutex:
            hold = self._holds.get(sha)
            if hold is not None:
                if hold.refs > 0:
                    return False
                self._release(sha)
        if not self.dir.try_evict(sha):
            return False
        self.stats.evictions += 1
        return True

    def _wait_for_room(self, need: Need, demand: bool) -> bool:
        """Reserve room for `need`; a read waits for other users to release some, a prefetch does not."""
        deadline = time.monotonic() + ROOM_WAIT_SECONDS
        while True:
            with self.dir.locked():
                if self._make_room(need, demand):
                    return True
            if not demand:
                return False
            if time.monotonic() > deadline:
                raise UsageError(f"{self.dir.root}: no room for {need.what} ({need.size} bytes) within cache_bytes "
                                 f"{self.limit}: the other readers of this cache hold the rest")
            self._release_idle()
            self.dir.signal_pressure()
            time.sleep(0.02)

    # ------------------------------------------------------------ fetching

    def _fetch_locked(self, need: Need, demand: bool) -> None:
        """Under the object's exclusive lock: fetch it unless a proven copy is there already."""
        final = self.path_of(need.sha256)
        if present(final, need.size):
            return  # fetched while we waited for the lock; _open proves it
        try:
            remove_entry(final)  # truncated behind our back, or a FIFO or an empty folder planted there
        except OSError as exc:
            raise StorageIOError.from_os_error(f"caching {need.what} at", final, exc) from None
        if not self._wait_for_room(need, demand):
            return
        temp = temp_name(final)  # .<sha256>.prep-tmp-*: the ledger knows whose fetch it is
        try:
            installed = download_verified(self.store, hashing.Digest(need.sha256, need.size), final, temp=temp,
                                          what=need.what, on_bytes=lambda n: None, stop=self.stop)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):  # exit 4 as every full disk, though a lower bound may avoid it
                raise StorageIOError(f"caching {need.what} at", final, f"{exc.strerror}: free space under the cache "
                                     "folder or lower cache_bytes", exc.errno) from None
            raise StorageIOError.from_os_error(f"caching {need.what} at", exc.filename or final, exc) from None
        finally:
            discard(temp)
            with self.dir.locked():
                self._fetching.pop(need.sha256, None)
                self.dir.publish(self._fetching)
        if installed is not None:
            with contextlib.suppress(OSError):  # a full disk: the record is only advisory (a rehash)
                self.record.add(need.sha256, need.sha256, installed)
            self._tend_record()
        now = time.monotonic()
        with self._mutex:
            self.stats.count_fetch(need.sha256, need.size)
            self._used_at[need.sha256] = now
            if not demand:
                self._ready_at[need.sha256] = now

    def _tend_record(self) -> None:
        """Compact the record of proven files (a line per fetch) once it has doubled, under cache.lock."""
        if self.record.overgrown():
            with self.dir.locked(), contextlib.suppress(OSError):  # a full disk: the record is only advisory
                self.record.tend(self.dir.ledger(self._fetching).complete)

    def prefetch(self, need: Need) -> None:
        """Fetch `need` ahead of its use, when nobody else is fetching it and room can be made
        without evicting a file needed sooner."""
        if need.size > self.limit or self.path_of(need.sha256).exists():
            return
        fd = self.dir.object_lock(need.sha256)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return  # being fetched, or just fetched and being read
            self._fetch_locked(need, demand=False)
        finally:
            os.close(fd)

    def close(self) -> None:
        """Stop fetches, unpin everything, release this user's file (its reservations stop counting)."""
        self.stop.set()
        with self._mutex:
            for sha in list(self._holds):
                self._release(sha)
        self.dir.close()
        self.record.close()
