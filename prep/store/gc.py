"""Garbage collection: delete objects and commit records that no ref reaches, never what a ref
reaches and never what a build in progress may still commit.

The rules (docs/history.md has the reasoning):
1. Roots: every current ref, plus every snapshot marker, stage record and task record younger
   than the grace period (what a build in progress may have written or re-committed).
2. Kept: the roots' snapshot manifests and artifacts, their stage manifests, every object a kept
   stage manifest or young record names.
3. Deleted once older than the grace period: objects not kept; records naming any object not
   kept; markers of snapshots not kept; expired leases; stale temporaries of a local store.
4. Exclusion: gc holds a `leases/gc/...` lease and refuses to start while a live build lease
   exists; builds take a `leases/build/...` lease (`build_lease`) and wait while a gc lease lives.
   Each writes its own lease before looking for the other's, so the two never overlap.
5. Order: markers and records go before objects, so an interrupted gc never leaves a record
   that names a missing object.
6. Full disk: when the gc lease cannot be written for lack of space, gc first deletes the stale
   temporaries of a local store's tmp/ without a lease (nothing names a temporary, and those of
   a build in progress are younger than the grace period), then tries the lease again.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from prep import hashing
from prep.errors import IntegrityError, NotFoundError, StorageIOError, StoreError, UsageError
from prep.manifest import canonical
from prep.storage.base import ObjectInfo, Store
from prep.storage.local import TMP_DIR, LocalStore
from prep.store import cas
from prep.store.records import STAGES_PREFIX, TASKS_PREFIX
from prep.store.refs import list_refs
from prep.store.snapshots import INDEX_PREFIX

REPORT_SCHEMA = "prep.gc-report/1"
LEASES_PREFIX = "leases/"
BUILD, GC = "build", "gc"
DEFAULT_GRACE = "24h"
DEFAULT_LEASE_SECONDS = 600
WAIT_POLL_SECONDS = 5.0
IO_THREADS = 8
OBJECT_ID = re.compile(rb"sha256:([0-9a-f]{64})")
CATEGORIES = ("objects", "records", "snapshots", "leases", "temporary")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def parse_duration(text: str) -> int:
    """'30m' -> 1800, '6h', '2d', '1w', '45s', or bare seconds; UsageError otherwise."""
    match = _DURATION.match(text)
    if match is None:
        raise UsageError(f"invalid duration {text!r}: use a number with s, m, h, d or w, like 30m, 6h or 2d")
    return int(float(match.group(1)) * _UNIT_SECONDS[match.group(2)])


# ------------------------------------------------------------------------------------ leases


@dataclass(frozen=True)
class LeaseInfo:
    """A lease as listed: `leases/<kind>/<run>/<expires epoch>.json`; the name alone tells liveness."""

    key: str
    kind: str
    run: str
    expires: int

    def live(self, now: float) -> bool:
        return now < self.expires


def _parse_lease(info: ObjectInfo) -> LeaseInfo | None:
    parts = info.key[len(LEASES_PREFIX):].split("/")
    if len(parts) != 3 or not parts[2].endswith(".json") or not parts[2][:-5].isdigit():
        return None
    return LeaseInfo(info.key, parts[0], parts[1], int(parts[2][:-5]))


def read_leases(store: Store, kind: str | None = None) -> list[LeaseInfo]:
    """Every lease key in the store (of one kind), oldest expiry first."""
    found = (_parse_lease(info) for info in store.list(LEASES_PREFIX + (f"{kind}/" if kind else "")))
    return sorted((lease for lease in found if lease is not None), key=lambda lease: lease.expires)


def process_scope() -> str | None:
    """What makes a pid meaningful: this boot of this machine and this PID namespace (Linux);
    None where that cannot be told, and then no lease is ever judged abandoned by its pid."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None
    return f"{socket.gethostname()}/{boot}/{namespace}"


def _holder_is_dead(store: Store, lease: LeaseInfo) -> bool:
    """True when the lease's holder ran in this process scope (same boot, same PID namespace)
    and its process is gone, so a killed build releases its lease at once instead of at expiry.
    A lease from anywhere else counts as held (a pid means nothing across hosts or containers)."""
    try:
        body = json.loads(store.get_bytes(lease.key))
    except NotFoundError:
        return True  # released while we looked
    except ValueError:
        return False
    scope = process_scope()
    if scope is None or body.get("scope") != scope or not isinstance(body.get("pid"), int):
        return False
    try:
        os.kill(body["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _held(store: Store, lease: LeaseInfo, now: float) -> bool:
    return lease.live(now) and not _holder_is_dead(store, lease)


def live_leases(store: Store, kind: str, now: float | None = None) -> list[LeaseInfo]:
    """Leases not yet expired whose holder may still be running."""
    moment = time.time() if now is None else now
    return [lease for lease in read_leases(store, kind) if _held(store, lease, moment)]


class Lease:
    """Holds `leases/<kind>/<run>/<expires>.json` while in use, renewing it from a thread: each
    renewal creates a later-expiring key, then deletes the previous one."""

    def __init__(self, store: Store, kind: str, seconds: int = DEFAULT_LEASE_SECONDS) -> None:
        self.store, self.kind, self.seconds = store, kind, seconds
        self.run = f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{uuid.uuid4().hex[:12]}"
        self.key = ""
        self.expires = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _write(self) -> None:
        expires = int(time.time()) + self.seconds
        key = f"{LEASES_PREFIX}{self.kind}/{self.run}/{expires:012d}.json"
        body = {"kind": self.kind, "run": self.run, "host": socket.gethostname(), "pid": os.getpid(),
                "scope": process_scope(), "expires": expires}
        self.store.put_bytes(key, json.dumps(body, sort_keys=True).encode())
        previous, self.key, self.expires = self.key, key, expires
        if previous and previous != key:
            self.store.delete(previous)

    def _renew(self) -> None:
        while not self._stop.wait(self.seconds / 4):
            try:
                self._write()
            except Exception:  # noqa: BLE001, S112 - a failed renewal shows as `lapsed`
                continue

    @property
    def lapsed(self) -> bool:
        """True once the lease may have expired (renewals failed): stop acting under it."""
        return time.time() >= self.expires - 1

    def __enter__(self) -> Self:
        self._write()
        self._thread = threading.Thread(target=self._renew, name=f"prep-lease-{self.kind}", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.store.delete(self.key)


@contextmanager
def build_lease(store: Store, timeout: float | None = None, poll: float = WAIT_POLL_SECONDS) -> Iterator[Lease]:
    """What a build holds from before its first cache lookup until its refs moved: a build lease,
    taken first, then a wait while any gc holds a live lease (StoreError after `timeout`)."""
    with Lease(store, BUILD) as lease:
        waited = 0.0
        while running := live_leases(store, GC):
            if timeout is not None and waited >= timeout:
                raise StoreError(f"{store.url}: garbage collection is running ({running[0].key}); try again later")
            time.sleep(poll)
            waited += poll
        yield lease


# ------------------------------------------------------------------------------------ report


@dataclass(frozen=True)
class Tally:
    count: int = 0
    bytes: int = 0

    def to_json(self) -> dict[str, int]:
        return {"count": self.count, "bytes": self.bytes}


def _tally(infos: Iterable[ObjectInfo]) -> Tally:
    items = list(infos)
    return Tally(len(items), sum(info.size for info in items))


@dataclass(frozen=True)
class GcReport:
    """What gc kept and deleted (or, in a dry run, would delete), by category."""

    store: str
    dry_run: bool
    grace_seconds: int
    refs: int
    kept: dict[str, Tally] = field(default_factory=dict)
    deleted: dict[str, Tally] = field(default_factory=dict)

    @property
    def freed(self) -> Tally:
        return Tally(sum(t.count for t in self.deleted.values()), sum(t.bytes for t in self.deleted.values()))

    def to_json(self) -> dict[str, Any]:
        return {"schema": REPORT_SCHEMA, "store": self.store, "dry_run": self.dry_run,
                "grace_seconds": self.grace_seconds, "refs": self.refs,
                "kept": {name: tally.to_json() for name, tally in self.kept.items()},
                "deleted": {name: tally.to_json() for name, tally in self.deleted.items()},
                "freed": self.freed.to_json()}


# ------------------------------------------------------------------------------ reachability


def _named_ids(data: bytes) -> set[str]:
    return {match.decode() for match in OBJECT_ID.findall(data)}


def _record_names(store: Store, key: str) -> set[str]:
    """The object ids a commit record names (none if another gc deleted it meanwhile)."""
    try:
        return _named_ids(store.get_bytes(key))
    except NotFoundError:
        return set()


def _parallel(function: Callable[[Any], Any], items: Iterable[Any]) -> list[Any]:
    with ThreadPoolExecutor(max_workers=IO_THREADS) as pool:
        return list(pool.map(function, items))


class _Reach:
    """The set of kept object ids, grown from roots; stage manifests are read to follow their names."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.kept: set[str] = set()

    def stage_manifest(self, object_id: str, required: bool) -> None:
        sha = hashing.parse_id(object_id)
        if sha in self.kept:
            return
        self.kept.add(sha)
        try:
            self.kept |= _named_ids(cas.get_bytes(self.store, object_id))
        except NotFoundError:
            if required:
                raise IntegrityError(f"{self.store.url}: stage manifest {object_id} of a ref'd snapshot is missing; "
                                     "gc refuses to guess what it named") from None

    def snapshot(self, sha: str, required: bool) -> None:
        if sha in self.kept:
            return
        try:
            raw = cas.get_bytes(self.store, f"sha256:{sha}")
        except NotFoundError:
            if required:
                raise IntegrityError(f"{self.store.url}: a ref names snapshot sha256:{sha}, which is missing") from None
            return
        self.kept.add(sha)
        manifest = canonical.loads(raw)
        self.kept.update(artifact["sha256"] for artifact in manifest["artifacts"])
        for stage in manifest["stages"]:
            self.stage_manifest(stage["output"], required)


@dataclass(frozen=True)
class _Plan:
    """Everything to delete, by category, in deletion order."""

    deletions: dict[str, list[ObjectInfo]]
    kept: dict[str, Tally]
    refs: int


def _plan(store: Store, cutoff: float, now: float) -> _Plan:
    objects = list(store.list(cas.OBJECTS_PREFIX))
    records = list(store.list(TASKS_PREFIX)) + list(store.list(STAGES_PREFIX))
    markers = list(store.list(INDEX_PREFIX))
    named = dict(zip((info.key for info in records), _parallel(lambda info: _record_names(store, info.key), records)))
    reach = _Reach(store)
    refs = list_refs(store)
    for ref in refs:
        reach.snapshot(hashing.parse_id(ref.snapshot), required=True)
    for marker in markers:
        if marker.mtime > cutoff:
            reach.snapshot(marker.key[len(INDEX_PREFIX):], required=False)
    for info in records:
        if info.mtime > cutoff:
            if info.key.startswith(STAGES_PREFIX):
                for sha in named[info.key]:
                    reach.stage_manifest(f"sha256:{sha}", required=False)
            reach.kept |= named[info.key]
    old = [info for info in records if info.mtime <= cutoff]
    dead_records = [info for info in old if not named[info.key] <= reach.kept]
    expired = [info for info in store.list(LEASES_PREFIX)
               if info.mtime <= cutoff and ((lease := _parse_lease(info)) is None or not _held(store, lease, now))]
    deletions = {
        "snapshots": [m for m in markers if m.mtime <= cutoff and m.key[len(INDEX_PREFIX):] not in reach.kept],
        "records": dead_records,
        "leases": expired,
        "objects": [o for o in objects if o.mtime <= cutoff and o.key.rsplit("/", 1)[-1] not in reach.kept],
        "temporary": _stale_temporaries(store, cutoff),
    }
    dead_keys = {info.key for info in dead_records}
    kept = {"objects": _tally(o for o in objects if o.key.rsplit("/", 1)[-1] in reach.kept),
            "records": _tally(info for info in records if info.key not in dead_keys)}
    return _Plan(deletions, kept, len(refs))


def _newest_mtime(path: Path) -> float:
    newest = path.lstat().st_mtime
    if path.is_dir() and not path.is_symlink():
        for child in path.rglob("*"):
            newest = max(newest, child.lstat().st_mtime)
    return newest


def _disk_size(path: Path) -> int:
    if path.is_dir() and not path.is_symlink():
        return sum(child.lstat().st_size for child in path.rglob("*") if child.is_file())
    return path.lstat().st_size


def _stale_temporaries(store: Store, cutoff: float) -> list[ObjectInfo]:
    """Entries of a local store's tmp/ untouched since the cutoff (left by killed builds)."""
    if not isinstance(store, LocalStore):
        return []
    folder = store.root / TMP_DIR
    stale = []
    for path in sorted(folder.iterdir()) if folder.is_dir() else []:
        try:
            if _newest_mtime(path) <= cutoff:
                stale.append(ObjectInfo(f"{TMP_DIR}/{path.name}", _disk_size(path), path.lstat().st_mtime))
        except FileNotFoundError:
            continue
    return stale


def _delete(store: Store, category: str, infos: list[ObjectInfo]) -> None:
    if category == "temporary":
        if not isinstance(store, LocalStore):
            return  # only a local store has tmp/ (see _stale_temporaries)
        for info in infos:
            path = store.root / info.key
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                try:
                    path.unlink(missing_ok=True)
                except OSError as exc:
                    raise StorageIOError.from_os_error("deleting", path, exc) from exc
        return
    _parallel(lambda info: store.delete(info.key), infos)


def collect_garbage(store: Store, grace_seconds: int, dry_run: bool = False) -> GcReport:
    """Delete (or with `dry_run` only count) what no ref reaches and is older than the grace
    period; raises StoreError without deleting anything while a build holds a live lease."""
    if grace_seconds < 0:
        raise UsageError(f"grace period must not be negative, got {grace_seconds} s")
    if dry_run:
        now = time.time()
        plan = _plan(store, now - grace_seconds, now)
        return GcReport(store.url, True, grace_seconds, plan.refs, plan.kept,
                        {name: _tally(plan.deletions[name]) for name in CATEGORIES})
    with ExitStack() as stack:
        freed: list[ObjectInfo] = []  # stale temporaries deleted without a lease (a full disk)
        try:
            lease = stack.enter_context(Lease(store, GC))
        except StorageIOError as exc:
            if exc.errno not in _NO_SPACE or not isinstance(store, LocalStore):
                raise
            freed = _free_temporaries(store, grace_seconds, exc)
            try:
                lease = stack.enter_context(Lease(store, GC))
            except StorageIOError as again:
                if again.errno not in _NO_SPACE:
                    raise
                raise StorageIOError(again.operation, again.path, f"{again.reason}; {_freed_text(freed)}",
                                     again.errno) from again
        builds = live_leases(store, BUILD)
        if builds:
            raise StoreError(f"{store.url}: a build holds lease {builds[0].key}; gc deletes nothing while "
                             "builds run, try again later")
        now = time.time()
        plan = _plan(store, now - grace_seconds, now)
        for name in ("snapshots", "records", "leases", "objects", "temporary"):
            if lease.lapsed:
                raise StoreError(f"{store.url}: the gc lease lapsed (renewals failed); stopped before deleting {name}")
            _delete(store, name, [info for info in plan.deletions[name] if info.key != lease.key])
        deleted = {name: _tally(plan.deletions[name]) for name in CATEGORIES}
        deleted["temporary"] = _tally([*freed, *plan.deletions["temporary"]])
        return GcReport(store.url, False, grace_seconds, plan.refs, plan.kept, deleted)


def _free_temporaries(store: LocalStore, grace_seconds: int, cause: StorageIOError) -> list[ObjectInfo]:
    """Without a lease (the disk is full), delete only tmp/ entries older than the grace period."""
    # Safe without the gc lease: nothing names a temporary, so deleting one can never leave the
    # store inconsistent; a build in progress touches its temporaries within the grace period,
    # and one that starts after the cutoff is fixed makes only newer ones. Still, no deleting at
    # all while a build holds a live lease.
    cutoff = time.time() - grace_seconds  # fixed before looking for builds
    builds = live_leases(store, BUILD)
    if builds:
        raise StorageIOError(cause.operation, cause.path, f"{cause.reason}; a build holds lease {builds[0].key}, "
                             "so gc deleted nothing", cause.errno) from cause
    stale = _stale_temporaries(store, cutoff)
    _delete(store, "temporary", stale)
    return stale


def _freed_text(freed: list[ObjectInfo]) -> str:
    """What a gc that never got its lease did, for its error message."""
    done = (f"without a lease gc deleted only {len(freed)} stale temporaries ({sum(i.size for i in freed)} bytes) "
            "from tmp/" if freed else "gc found no temporaries in tmp/ older than the grace period")
    return f"{done} and deleted no objects or records (they need the lease): free space and run gc again"
