"""Copy a snapshot from one store to another (`prep copy`), create-only and proven byte by byte.

What is copied is what garbage collection keeps for the snapshot (`prep.store.reach`, the walk gc
and fsck share): its manifest, artifacts, tokenizer file and whatever else the manifest names, its
stage manifests and every object they name. So the target passes `prep fsck` and its gc keeps the
snapshot whole; a snapshot without its stage manifests is one gc refuses to guess about. No commit
record is copied: a build on the target recomputes rather than trusting another store's records.

The order is what makes a killed copy safe to rerun (docs/pull-verify.md, "Copying a snapshot"):
1. Under a build lease on the target (its gc waits meanwhile), the source walk reads and proves
   the snapshot and stage manifests; a missing, corrupt or invalid one stops the copy before
   anything is written.
2. Objects already on the target are checked: a proven stamp (`prep.store.proven`, local stores)
   or a re-hash. One with other bytes stops the copy and is never overwritten.
3. Every missing object but the snapshot manifest is streamed into the target's staging folder,
   hashed on the way, and published create-only only when size and SHA-256 match its name;
   then the snapshot manifest, then its marker (the snapshot is listed on the target only now).
4. With refs, each moves by compare-and-swap from the generation read at the start.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from prep import hashing
from prep.errors import IntegrityError, PrepError, StaleRefError, StorageIOError, UsageError
from prep.faults import crash_point
from prep.progress import Progress
from prep.storage.backend import ObjectInfo, Store
from prep.store import cas, proven
from prep.store.layout import object_key, snapshot_marker_key
from prep.store.leases import build_lease
from prep.store.reach import CORRUPT, MISSING, Problem, Reach, parallel
from prep.store.refs import Mover, list_refs, read_ref, update_ref
from prep.store.snapshots import Snapshot
from prep.store.tags import RESERVED, tag_expectation
from prep.transfer.fetch import copy_object
from prep.transfer.verify import DEFAULT_JOBS as DEFAULT_JOBS
from prep.transfer.verify import ByteCounter, run_parallel

COPY_REPORT_SCHEMA = "prep.copy-report/1"


@dataclass(frozen=True)
class Item:
    """One object to copy: its SHA-256 and size on the source, what it is and what reached it."""

    sha: str
    size: int
    kind: str
    by: str

    @property
    def key(self) -> str:
        return object_key(self.sha)

    @property
    def id(self) -> str:
        return f"sha256:{self.sha}"


@dataclass(frozen=True)
class RefPlan:
    """A ref to move on the target, and the live generation it must still be at (0: absent)."""

    dataset: str
    name: str
    expect: int


@dataclass(frozen=True)
class MovedRef:
    """A ref as the copy left it on the target."""

    dataset: str
    name: str
    generation: int
    moved: bool

    def to_json(self) -> dict[str, Any]:
        return {"dataset": self.dataset, "name": self.name, "generation": self.generation, "moved": self.moved}


@dataclass(frozen=True)
class CopyResult:
    """What one copy did: objects copied, found already intact (re-hashed or proven by stamp), the
    marker written, the refs moved."""

    snapshot_id: str
    dataset: str
    source: str
    target: str
    objects: int
    bytes: int
    copied: int
    bytes_copied: int
    present: int
    bytes_present: int
    rehashed: int
    marker_written: bool
    refs: tuple[MovedRef, ...]
    seconds: float

    def to_json(self) -> dict[str, Any]:
        """The prep.copy-report/1 document (manifests/copy-report-1.schema.json)."""
        return {"schema": COPY_REPORT_SCHEMA, "snapshot": self.snapshot_id, "dataset": self.dataset,
                "source": self.source, "target": self.target,
                "objects": {"count": self.objects, "bytes": self.bytes},
                "copied": {"count": self.copied, "bytes": self.bytes_copied},
                "present": {"count": self.present, "bytes": self.bytes_present, "rehashed": self.rehashed},
                "marker_written": self.marker_written, "refs": [ref.to_json() for ref in self.refs],
                "seconds": round(self.seconds, 6)}


class _SourceWalk(Reach):
    """gc's walk over the source, refusing whatever it cannot follow with the object named."""

    def problem(self, found: Problem, required: bool, error: PrepError | None) -> None:
        """Stop the copy: a snapshot or stage manifest the source cannot prove is never copied."""
        what = {MISSING: "is missing", CORRUPT: "does not hash to its name"}.get(found.problem, "is invalid")
        detail = "" if found.problem in (MISSING, CORRUPT) else f" ({found.detail})"
        raise IntegrityError(f"{self.store.url}: {found.kind} sha256:{found.sha}, reached from {found.by}, "
                             f"{what}{detail}; copy refused, nothing was copied")


def plan_objects(source: Store, snapshot: Snapshot, label: str, jobs: int = DEFAULT_JOBS) -> list[Item]:
    """Every object the snapshot keeps alive on the source (gc's set), with its size there; the
    snapshot manifest last. IntegrityError naming the first object that is missing or unreadable."""
    walk = _SourceWalk(source)
    root = hashing.parse_id(snapshot.id)
    walk.snapshot(root, label, required=True)
    shas = sorted(walk.kept - {root}) + [root]
    infos: list[ObjectInfo | None] = parallel(lambda sha: source.head(object_key(sha)), shas, jobs)
    items = []
    for sha, info in zip(shas, infos):
        via = walk.via[sha]
        if info is None:
            raise IntegrityError(f"{source.url}: {via.kind} sha256:{sha}, reached from {via.by}, is missing; "
                                 "copy refused, nothing was copied")
        items.append(Item(sha, info.size, via.kind, via.by))
    return items


def _conflict(target: Store, item: Item, why: str) -> IntegrityError:
    """The error for an object the target holds with other bytes than its name says."""
    return IntegrityError(f"{target.url}: {item.kind} sha256:{item.sha} is already there with other bytes ({why}); "
                          f"prep copy never overwrites an object: delete {target.url}/{item.key} (prep fsck --repair "
                          "on the target does, when a snapshot there reaches it) and copy again")


def check_present(target: Store, items: Sequence[Item], jobs: int) -> tuple[list[Item], int]:
    """(the items the target already holds intact, how many of them were re-hashed): a local
    target's proven stamps spare the hashing. IntegrityError (never an overwrite) for one whose
    size or bytes are not its name's."""
    infos: list[ObjectInfo | None] = parallel(lambda item: target.head(item.key), items, jobs)
    present = [item for item, info in zip(items, infos) if info is not None]
    for item, info in zip(items, infos):
        if info is not None and info.size != item.size:
            raise _conflict(target, item, f"{info.size} bytes, not {item.size}")
    ids = [item.id for item in present]
    trusted = proven.unchanged(target, ids, proven.load(target))
    todo = [object_id for object_id in ids if object_id not in trusted]

    def rehash(batch: Sequence[str]) -> list[str]:
        intact = parallel(partial(cas.check, target), batch, jobs)
        return [object_id for object_id, ok in zip(batch, intact) if not ok]

    bad, stamps = proven.check_stamped(target, todo, rehash)
    proven.record(target, stamps)
    if bad:
        item = next(item for item in present if item.id == bad[0])
        raise _conflict(target, item, "it does not hash to its name")
    return present, len(todo)


def copy_item(source: Store, target: Store, item: Item, on_bytes: ByteCounter, stop: threading.Event) -> bool:
    """Stream one object from the source into the target's staging folder, hashing it, and publish
    it create-only once it proves to be its name; False when another writer stored it meanwhile
    (checked). IntegrityError naming the object for source bytes that are not its name's."""
    temp = target.staging_dir() / f"copy-{uuid.uuid4().hex}.part"
    try:
        try:
            digest = copy_object(source, item.key, temp, on_bytes, stop, size=item.size)
        except OSError as exc:  # a write or a read on an open file (a full disk, EIO) names no path
            if exc.filename is not None:
                raise
            raise StorageIOError(f"copying {item.id} into", temp, exc.strerror or str(exc), exc.errno) from None
        if digest != hashing.Digest(item.sha, item.size):
            raise IntegrityError(f"{source.url}: {item.kind} sha256:{item.sha}, reached from {item.by}, does not "
                                 f"hash to its name (read {digest.size} bytes with sha256 {digest.sha256}); "
                                 f"copy refused, nothing of it was written to {target.url}")
        created = target.put_file(item.key, temp)
    finally:
        temp.unlink(missing_ok=True)
    if not created and not cas.check(target, item.id):
        raise _conflict(target, item, "it does not hash to its name")
    crash_point("copy.after_object")  # tests kill a copy here: some objects stored, no marker
    return created


def plan_refs(source: Store, target: Store, snapshot: Snapshot) -> list[RefPlan]:
    """The source's refs that name the snapshot, each with the target generation its move must
    find: a tag (anything but `latest`) must be absent there or name this snapshot already."""
    names = sorted(ref.name for ref in list_refs(source, snapshot.dataset) if ref.snapshot == snapshot.id)
    if not names:
        raise UsageError(f"--refs: no ref of {snapshot.dataset} on {source.url} names {snapshot.id}, so none to "
                         "move (copy without --refs, then prep tag on the target)")
    plans = []
    for name in names:
        current = read_ref(target, snapshot.dataset, name)
        expect = current.generation if current is not None else 0
        if name not in RESERVED:  # tags stay put on the target too
            expect = tag_expectation(current, snapshot.id, force=False, expect=None) or 0
        plans.append(RefPlan(snapshot.dataset, name, expect))
    return plans


def move_refs(target: Store, snapshot: Snapshot, plans: Sequence[RefPlan]) -> tuple[MovedRef, ...]:
    """Move each planned ref by compare-and-swap; StaleRefError when one moved since the start."""
    moved = []
    for plan in plans:
        try:
            move = update_ref(target, plan.dataset, plan.name, snapshot.id, expect=plan.expect,
                              mover=Mover.here("copy"))
        except StaleRefError as exc:
            raise StaleRefError(f"{target.url}: {exc.message} (moved while prep copy ran; the snapshot is copied: "
                                "prep copy --refs again moves it from where it is now)") from None
        moved.append(MovedRef(plan.dataset, plan.name, move.ref.generation, move.moved))
    return tuple(moved)


def copy_missing(source: Store, target: Store, missing: Sequence[Item], root: str, jobs: int,
                 on_bytes: ByteCounter, on_file: Callable[[Item], None] | None) -> list[Item]:
    """Copy `missing`, `jobs` at a time, the snapshot manifest (`root`) only after all the rest;
    the items this call stored (not those another writer stored meanwhile)."""

    def work(item: Item, stop: threading.Event) -> bool:
        return copy_item(source, target, item, on_bytes, stop)

    created: dict[str, bool] = {}
    for batch in ([item for item in missing if item.sha != root], [item for item in missing if item.sha == root]):
        created.update(zip((item.sha for item in batch), run_parallel(work, batch, jobs, on_file)))
    return [item for item in missing if created[item.sha]]


def copy_snapshot(source: Store, target: Store, snapshot: Snapshot, *, label: str, refs: bool = False,
                  jobs: int = DEFAULT_JOBS, progress: Progress | None = None,
                  on_file: Callable[[Item], None] | None = None,
                  on_wait: Callable[[str], None] | None = None) -> CopyResult:
    """Copy `snapshot` (named `label` in messages) from `source` to `target` in the order the module
    describes, metering the bytes on `progress`; `on_file` hears each object stored."""
    if source.url == target.url:
        raise UsageError(f"{target.url}: the store copied from and to is the same")
    started, progress = time.monotonic(), progress or Progress(quiet=True)
    with build_lease(target, on_wait=on_wait):
        ref_plans = plan_refs(source, target, snapshot) if refs else []
        items = plan_objects(source, snapshot, label, jobs)
        present, rehashed = check_present(target, items, jobs)
        have = {item.sha for item in present}
        missing = [item for item in items if item.sha not in have]
        meter = progress.meter("copy", len(missing), sum(item.size for item in missing))

        def done(item: Item) -> None:
            meter.file_done(item)
            if on_file is not None:
                on_file(item)

        try:
            copied = copy_missing(source, target, missing, hashing.parse_id(snapshot.id), jobs, meter.add, done)
        finally:
            meter.finish()
        marker = target.put_bytes(snapshot_marker_key(snapshot.id), b"")
        moved = move_refs(target, snapshot, ref_plans)
    stored = {item.sha for item in copied}
    already = [*present, *(item for item in missing if item.sha not in stored)]
    return CopyResult(snapshot.id, snapshot.dataset, source.url, target.url, len(items), sum(i.size for i in items),
                      len(copied), sum(i.size for i in copied), len(already), sum(i.size for i in already),
                      rehashed, marker, moved, time.monotonic() - started)
