"""Read back before a ref moves (docs/history.md, "Read-back before publish").

Before `prep build` or `prep tag` points a ref at a snapshot, every object the snapshot names
(its manifest object and every artifact) is read from the store and hashed to its name, in
parallel and streaming (`cas.check`), unless it has already passed a read-back. Then a
create-only `prep.readback/1` record is written under the snapshot id. A corrupt or missing
object is an IntegrityError (exit 3) naming the object and its artifact path, raised before any
ref moves.

The record is keyed by snapshot id: one HEAD tells a republish of the same snapshot that nothing
needs reading, however many artifacts it has. A snapshot that shares objects with the one its
ref names skips those when that one has a record (and this build did not rewrite them).
"""

from __future__ import annotations

import datetime as dt
import socket
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from prep import hashing
from prep.errors import IntegrityError, PrepError
from prep.progress import human_bytes, plural
from prep.storage.backend import Store
from prep.store import cas, proven, records
from prep.store.snapshots import Snapshot, load_snapshot

Checker = Callable[[Sequence[str]], list[str]]
"""Re-hash stored objects in parallel; returns the missing or corrupt ones."""

MANIFEST = "snapshot manifest"
THREADS = 8  # reads on the driver (prep tag) wait on the store, not on a core


@dataclass(frozen=True)
class Readback:
    """What the read-back before a publish did, for the build log and the progress line."""

    ran: bool
    skipped: str = ""  # why it did not run: "--no-readback", or "no ref moves"
    objects: int = 0
    checked: int = 0
    bytes_read: int = 0
    seconds: float = 0.0
    recorded_before: bool = False
    when_written: int = 0  # objects their writer read back from the store's file on disk
    bytes_when_written: int = 0

    def to_json(self) -> dict[str, Any]:
        skipped = {"skipped": self.skipped} if self.skipped else {}
        written = {"when_written": self.when_written, "bytes_when_written": self.bytes_when_written} if self.ran else {}
        return {"ran": self.ran, **skipped, "objects": self.objects, "checked": self.checked,
                "bytes_read": self.bytes_read, "seconds": round(self.seconds, 3), "recorded_before": self.recorded_before,
                **written}

    def summary(self) -> str:
        if not self.ran:
            return f"read-back skipped ({self.skipped or 'not asked for'})"
        if self.recorded_before:
            return (f"read-back: all {plural(self.objects, 'object')} were already read back by an earlier build or tag; "
                    "not read again")
        written = (f", {self.when_written} more ({human_bytes(self.bytes_when_written)}) from the disk as they "
                   "were written" if self.when_written else "")
        return (f"read back {self.checked} of {plural(self.objects, 'object')} ({human_bytes(self.bytes_read)}) "
                f"in {self.seconds:.2f} s{written}")


def snapshot_objects(snapshot: Snapshot) -> dict[str, tuple[str, int]]:
    """Every object a snapshot names, by id: (what it is, size)."""
    named = {snapshot.id: (MANIFEST, len(snapshot.raw))}
    for artifact in snapshot.artifacts:
        named.setdefault(f"sha256:{artifact['sha256']}", (str(artifact["path"]), int(artifact["size"])))
    return named


def thread_checker(store: Store, threads: int = THREADS) -> Checker:
    """Check on threads of this process (prep tag has no workers)."""
    def check(object_ids: Sequence[str]) -> list[str]:
        with ThreadPoolExecutor(max_workers=max(1, min(threads, len(object_ids)))) as pool:
            intact = list(pool.map(lambda object_id: cas.check(store, object_id), object_ids))
        return [object_id for object_id, ok in zip(object_ids, intact) if not ok]
    return check


def passed_before(store: Store, snapshot_id: str | None) -> set[str]:
    """The objects of `snapshot_id` when it has a read-back record (nothing when it has none or is unreadable)."""
    if snapshot_id is None:
        return set()
    try:
        if records.read_readback(store, snapshot_id) is None:
            return set()
        return set(snapshot_objects(load_snapshot(store, snapshot_id)))
    except PrepError:  # a broken earlier snapshot only means reading more now
        return set()


def read_back(store: Store, snapshot: Snapshot, check: Checker, known: Iterable[str] = (),
              rewritten: Iterable[str] = (), when_written: Mapping[str, cas.FileStamp] | None = None) -> Readback:
    """Prove every object of `snapshot` reads back intact, except those in `known` (passed before);
    then record it. Objects in `rewritten` (stored by this publisher, perhaps again after gc) are
    read even when a record or `known` says they passed. Objects in `when_written` were read back
    from the disk by their writer in this build: they are not read again while their file keeps
    the stamp it had once stored (any change to the file is read back). IntegrityError naming the
    first bad object and its path; no record then."""
    started = time.monotonic()
    named = snapshot_objects(snapshot)
    fresh = set(rewritten) & set(named)
    recorded = records.read_readback(store, snapshot.id) is not None
    checked_early = {object_id for object_id, stamp in (when_written or {}).items()
                     if object_id in named and cas.file_stamp(store, object_id) == stamp}
    todo = sorted((fresh if recorded else set(named) - (set(known) - fresh)) - checked_early)
    bad, stamps = proven.check_stamped(store, todo, check)
    proven.record(store, stamps)
    if bad:
        raise _failure(store, snapshot, named, bad)
    early, early_bytes = len(checked_early), sum(named[object_id][1] for object_id in checked_early)
    if recorded and not todo:
        return Readback(True, objects=len(named), recorded_before=True, when_written=early,
                        bytes_when_written=early_bytes)
    size = sum(named[object_id][1] for object_id in todo)
    if not recorded:
        stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        records.write_readback(store, records.ReadbackRecord(snapshot.id, len(named), len(todo) + early,
                                                             size + early_bytes, stamp, socket.gethostname()))
    return Readback(True, objects=len(named), checked=len(todo), bytes_read=size,
                    seconds=time.monotonic() - started, recorded_before=recorded, when_written=early,
                    bytes_when_written=early_bytes)


def _failure(store: Store, snapshot: Snapshot, named: dict[str, tuple[str, int]], bad: list[str]) -> IntegrityError:
    """The error for the objects that failed: the first named by path, object id and what is wrong."""
    first = next((object_id for object_id in bad if named[object_id][0] == MANIFEST), bad[0])
    what = "missing" if store.head(cas.object_key(hashing.parse_id(first))) is None else "corrupt (does not hash to its name)"
    more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
    return IntegrityError(f"{store.url}: read-back before publishing {snapshot.id}: {named[first][0]} "
                          f"(object {first}) is {what}{more}; no ref moved")
