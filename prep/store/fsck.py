"""fsck: re-hash everything the store's snapshots and records declare, and say what is damaged.

Roots are every current ref, every generation in `history/` whose snapshot is still stored (gc
collects the rest by policy: those are counted, not findings), every snapshot marker, every hold,
and every task and stage record. From them `prep.store.reach` walks the ids typed records and
manifests declare; every object reached is then re-hashed (streaming, `jobs` at a time), and what
is missing, corrupt (bytes that do not hash to the name) or invalid (a record or manifest its
schema refuses) is a finding naming the object's kind, key and what reached it. Stored objects
nothing reaches are dangling: garbage for gc, not damage, so they do not fail fsck.

Task record packs (`prep.store.packs`: the driver commits tasks in groups, one pack a group, so
a pack may be the only copy of its records) are commit records and roots like task records: what
a record in one names is followed and checked. A pack must read: one that does not is a damaged
commit record (an invalid finding; a build ignores it and runs its tasks again), and a record in
one naming other outputs than another copy of it (a single record, or an earlier pack's) is
invalid too. `repair` deletes such packs, and packs naming a bad object, as it does task records:
their tasks run again and give the same objects.

Read-back records must read too (`prep tag` refuses an unreadable one), as must keys under
`snapshots/` and `holds/` be named by a SHA-256. A ref's history must hold every generation
below its current one, and a snapshot a current ref or a hold names must have its marker. Each
stage record is checked as a build checks it: the object it names must be that stage's own
manifest, else the record is invalid. An empty folder standing at a record key (a local store's,
found by `Store.folders_at_keys`) is invalid too.

`repair` (under the gc lease, so never beside a build or a gc) deletes the task and stage
records whose outputs are missing, corrupt or invalid, unreadable read-back records (the next
publish reads the snapshot back again), and the corrupt objects themselves, so the
next build recomputes them; it writes a lost marker again from its proven manifest. It never
touches a ref, history, a hold or a policy, nor a snapshot manifest a current ref names: those
findings are reported as unrepairable, each with what to do instead (`unrepairable_reason`).
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from prep import hashing
from prep.errors import IntegrityError, NotFoundError, PrepError, StoreError
from prep.faults import crash_point
from prep.progress import Progress, plural
from prep.storage.backend import Store
from prep.store import cas, packs, records
from prep.store.holds import scan_holds
from prep.store.layout import (
    HISTORY_PREFIX,
    HOLDS_PREFIX,
    OBJECTS_PREFIX,
    PACKS_PREFIX,
    READBACK_PREFIX,
    RECORD_SUFFIX,
    REFS_PREFIX,
    RETENTION_PREFIX,
    SNAPSHOTS_PREFIX,
    STAGES_PREFIX,
    TASKS_PREFIX,
    history_key,
    history_prefix,
    is_decimal,
    is_marker_key,
    is_sha_hex,
    marker_sha,
    object_key,
    object_sha,
    readback_sha,
    ref_key,
    refs_prefix,
    snapshot_marker_key,
    task_record_key,
)
from prep.store.leases import BUILD, GC, Lease, live_leases
from prep.store.reach import CORRUPT, INVALID, MISSING, Problem, Reach, Via, parallel
from prep.store.refs import Ref, read_history_record
from prep.store.retention import current_policy_key, stored_policy
from prep.store.snapshots import load_snapshot

REPORT_SCHEMA = "prep.fsck-report/1"
DEFAULT_JOBS = 8


@dataclass(frozen=True)
class Dangling:
    """A stored object nothing reaches (gc's to collect once past the grace period)."""

    key: str
    size: int


@dataclass(frozen=True)
class Repair:
    """What `--repair` deleted, and what it must not touch."""

    records: tuple[str, ...] = ()
    objects: tuple[str, ...] = ()
    unrepairable: tuple[str, ...] = ()
    restored: tuple[str, ...] = ()  # lost snapshot markers written again from their proven manifests

    def to_json(self) -> dict[str, list[str]]:
        return {"removed_records": list(self.records), "removed_objects": list(self.objects),
                "unrepairable": list(self.unrepairable), "restored": list(self.restored)}


@dataclass(frozen=True)
class FsckReport:
    """What fsck checked and found."""

    store: str
    dataset: str | None
    checked: dict[str, int]
    findings: tuple[Problem, ...]
    dangling: tuple[Dangling, ...] = ()
    collected: int = 0
    repair: Repair | None = None
    gc_running: str | None = None  # the key of a gc lease live during a plain check: its deletions show as missing

    @property
    def clean(self) -> bool:
        return not self.findings

    def count(self, problem: str) -> int:
        return sum(1 for found in self.findings if found.problem == problem)

    def to_json(self) -> dict[str, Any]:
        return {"schema": REPORT_SCHEMA, "store": self.store, "dataset": self.dataset, "clean": self.clean,
                "checked": self.checked,
                "summary": {name: self.count(name) for name in (CORRUPT, MISSING, INVALID)}
                | {"dangling": len(self.dangling), "collected": self.collected},
                "findings": [{"problem": f.problem, "kind": f.kind, "key": f.key, "reached_by": f.by,
                              "detail": f.detail} for f in self.findings],
                "dangling": [{"key": d.key, "size": d.size} for d in self.dangling],
                "repair": None if self.repair is None else self.repair.to_json()}


class FsckWalk(Reach):
    """The shared walk, recording what it cannot follow instead of refusing like gc."""

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self.problems: dict[str, Problem] = {}

    def problem(self, found: Problem, required: bool, error: PrepError | None) -> None:
        """Record the problem (the first one seen for each key)."""
        self.add(found)

    def add(self, found: Problem) -> None:
        """Record a problem unless its key already has one (the walk may meet a key twice)."""
        with self._lock:
            self.problems.setdefault(found.key, found)


@dataclass
class Records:
    """Every commit record: the object shas each one names, and the invalid ones."""

    names: dict[str, set[str]] = field(default_factory=dict)
    invalid: list[str] = field(default_factory=list)
    folders: list[str] = field(default_factory=list)  # empty folders at record keys (folders_at_records)


def _read_record(store: Store, key: str) -> records.TaskRecord | records.StageRecord | PrepError | None:
    """A record, None when it vanished, or the error that makes it invalid."""
    try:
        record = records.parse_record(key, store.get_bytes(key), f"{store.url}/{key}")
    except NotFoundError:
        return None
    except IntegrityError as exc:
        return exc
    return _foreign_manifest(store, record) if isinstance(record, records.StageRecord) else record


def _foreign_manifest(store: Store, record: records.StageRecord) -> records.StageRecord | IntegrityError:
    """The record, or why the object it names is not its stage's manifest (an intermediate, another
    stage's or key's manifest: a build refuses the record). An object that does not read is the walk's
    to report (missing or corrupt), as is what a readable manifest names."""
    try:
        raw = cas.get_bytes(store, record.output)
    except (NotFoundError, IntegrityError):
        return record
    try:
        records.stage_manifest(store, record, raw)
    except IntegrityError as exc:
        return exc
    return record


def walk_records(walk: FsckWalk, jobs: int, dataset: str | None) -> Records:
    """Follow every task and stage record (with `dataset`, only those naming what its snapshots reach)."""
    store = walk.store
    keys = [info.key for prefix in (TASKS_PREFIX, STAGES_PREFIX) for info in store.list(prefix)]
    found = Records()
    for key, record in zip(keys, parallel(lambda key: _read_record(store, key), keys, jobs)):
        kind = "task record" if key.startswith(TASKS_PREFIX) else "stage record"
        if isinstance(record, PrepError):
            walk.add(Problem(INVALID, kind, key, key, record.message))
            found.invalid.append(key)
            continue
        if record is None:
            continue
        named = record.names()
        shas = {hashing.parse_id(object_id) for object_id in named.objects | {r.object_id for r in named.manifests}}
        if dataset is not None and not shas & walk.kept:
            continue
        outputs = record.outputs if isinstance(record, records.TaskRecord) else {}
        for name, object_id in sorted(outputs.items()):
            walk.note(hashing.parse_id(object_id), f"{name} (output of task {record.stage})", key)
        for ref in sorted(named.manifests, key=lambda ref: ref.object_id):
            walk.stage_manifest(ref, key, required=True)
            shas |= walk.children.get(hashing.parse_id(ref.object_id), frozenset())
        found.names[key] = shas
    return found


def check_packs(walk: FsckWalk, found: Records) -> None:
    """Every task record pack must read and hold no record naming other outputs than another copy
    of it (`found` has every single record's names); each pack's records are followed as single
    records are and its names join `found`, so `repair` deletes a pack naming a bad object. An
    unusable pack is invalid, and so are both copies of a record that disagree."""
    listed = list(walk.store.list(PACKS_PREFIX))
    copies = {key: (shas, key) for key, shas in found.names.items() if key.startswith(TASKS_PREFIX)}
    for info, held in zip(listed, parallel(lambda info: packs.read_pack(walk.store, info.key), listed)):
        if isinstance(held, IntegrityError):
            _invalid_pack(walk, found, info.key, f"{held.message}: a damaged commit of task records (a build "
                                                 "ignores it and runs its tasks again; fsck --repair deletes it)")
            continue
        conflict = _conflict(held, info.key, copies)
        if conflict is not None:
            record, other = conflict
            detail = (f"{walk.store.url}/{info.key}: holds task {record.stage}/{record.key} naming other objects than "
                      f"its copy in {other} (a determinism bug); fsck --repair deletes both")
            _invalid_pack(walk, found, info.key, detail)
            walk.add(Problem(INVALID, "task pack" if other.startswith(PACKS_PREFIX) else "task record", other, other, detail))
            found.invalid.append(other)
            continue
        for record in held.values():
            for name, object_id in sorted(record.outputs.items()):
                walk.note(hashing.parse_id(object_id), f"{name} (output of task {record.stage})", info.key)
        found.names[info.key] = packs.pack_shas(held)


def _invalid_pack(walk: FsckWalk, found: Records, key: str, detail: str) -> None:
    walk.add(Problem(INVALID, "task pack", key, key, detail))
    found.invalid.append(key)


def _conflict(held: dict[str, records.TaskRecord], key: str,
              copies: dict[str, tuple[set[str], str]]) -> tuple[records.TaskRecord, str] | None:
    """A record in the pack at `key` naming other outputs than the first copy of it seen (a single
    record, or an earlier pack's: `copies` by record key, to which this pack's are added), and
    where that copy is; None when every record agrees."""
    for record in held.values():
        shas = packs.pack_shas({record.key: record})
        first, where = copies.setdefault(task_record_key(record.stage, record.key), (shas, key))
        if first != shas:
            return record, where
    return None


_RECORD_KINDS = ((TASKS_PREFIX, "task record", False), (STAGES_PREFIX, "stage record", False),
                 (REFS_PREFIX, "ref", True), (HISTORY_PREFIX, "history record", True),
                 (RETENTION_PREFIX, "retention policy", True), (HOLDS_PREFIX, "hold", False),
                 (READBACK_PREFIX, "read-back record", False))


def folders_at_records(walk: FsckWalk, dataset: str | None) -> list[str]:
    """Empty folders standing where a record, ref, policy, hold or read-back record is read (a local store's): no
    listing shows them, yet a build or command reading that key fails, so each is an INVALID
    finding, which --repair removes (it holds nothing). With `dataset`, only that dataset's refs,
    history and policies are looked at."""
    found = []
    for prefix, kind, per_dataset in _RECORD_KINDS:
        if dataset is not None and not per_dataset:
            continue
        for key in walk.store.folders_at_keys(f"{prefix}{dataset}/" if dataset else prefix, RECORD_SUFFIX):
            walk.add(Problem(INVALID, kind, key, key, f"{walk.store.url}/{key}: a folder stands where the {kind} "
                             "is read, not a file; fsck --repair removes it"))
            found.append(key)
    return found


def _ref_values(walk: FsckWalk, prefix: str, mutable: bool, listed: list[str] | None = None) -> list[Ref]:
    """Every ref value (or history record) under `prefix`, tombstones included, each key appended to
    `listed`; an unreadable one is an INVALID finding."""
    store, found = walk.store, []
    for info in store.list(prefix):
        if not info.key.endswith(RECORD_SUFFIX):
            continue
        if listed is not None:
            listed.append(info.key)
        try:
            if mutable:
                value = store.read_ref(info.key)
                if value is not None:
                    found.append(Ref.parse(value.body, f"{store.url}/{info.key}", info.key))
            else:
                found.append(read_history_record(store, info.key))
        except NotFoundError:
            continue
        except (ValueError, IntegrityError) as exc:
            walk.add(Problem(INVALID, "ref" if mutable else "history record", info.key, info.key,
                             f"{store.url}/{info.key}: unreadable ({exc})"))
    return found


def _walk_snapshots(walk: FsckWalk, dataset: str | None) -> tuple[set[str], int]:
    """Follow refs, retained history, holds and markers; (shas current refs name, generations collected)."""
    store = walk.store
    refs = _ref_values(walk, refs_prefix(dataset), mutable=True)
    named = {hashing.parse_id(ref.snapshot): f"{ref.dataset}@{ref.name}" for ref in refs if not ref.deleted}
    for ref in (ref for ref in refs if not ref.deleted):  # a tombstone (prep tag -d) names no snapshot
        walk.snapshot(hashing.parse_id(ref.snapshot), f"{ref.dataset}@{ref.name}", required=True)
        _check_ref_dataset(walk, ref)
    current = set(named)
    collected = _walk_history(walk, dataset, refs)
    for key, hold in scan_holds(store):
        if isinstance(hold, IntegrityError):  # one bad record is a finding, not an aborted scrub
            walk.add(Problem(INVALID, "hold", key, key, hold.message))
        elif dataset is None or hold.dataset == dataset:
            named.setdefault(hashing.parse_id(hold.snapshot), f"hold on {hold.snapshot}")
            walk.snapshot(hashing.parse_id(hold.snapshot), f"hold on {hold.snapshot}", required=True)
    markers = list(store.list(SNAPSHOTS_PREFIX))  # after the refs: a publish writes its marker before a ref moves
    for info in markers if dataset is None else ():
        if not is_marker_key(info.key):
            walk.add(Problem(INVALID, "snapshot marker", info.key, info.key,
                             f"{store.url}/{info.key}: not a snapshot marker (its name is no SHA-256); "
                             "prep gc deletes it"))
            continue
        walk.snapshot(marker_sha(info.key), info.key, required=True)
    _check_markers(walk, named, {marker_sha(info.key) for info in markers})
    return current, collected


def _walk_history(walk: FsckWalk, dataset: str | None, refs: list[Ref]) -> int:
    """Follow each history generation whose snapshot is still stored, and look for missing
    generations; returns how many generations gc collected."""
    store, collected = walk.store, 0
    listed: list[str] = []
    history = _ref_values(walk, history_prefix(dataset) if dataset else HISTORY_PREFIX, mutable=False, listed=listed)
    for entry in sorted(history, key=lambda ref: (ref.dataset, ref.name, -ref.generation)):
        sha = hashing.parse_id(entry.snapshot)
        if entry.deleted or sha in walk.kept:
            continue
        if store.head(object_key(sha)) is None and store.head(snapshot_marker_key(entry.snapshot)) is None:
            collected += 1  # gc collected it by policy: history outlives snapshots
            continue
        walk.snapshot(sha, f"{entry.dataset}@{entry.name} generation {entry.generation}", required=True)
    history_gaps(walk, listed, refs)
    return collected


def history_gaps(walk: FsckWalk, listed: list[str], refs: list[Ref]) -> None:
    """Every generation below a ref's newest must have its history record (the current one may
    lack it until the ref's next move records it): without one, DATASET@REF~N names nothing and gc
    knows the generation's snapshot only from the next generation's `previous`."""
    present: dict[tuple[str, str], set[int]] = defaultdict(set)
    for key in listed:
        if (found := _history_generation(key)) is not None:
            present[found[:2]].add(found[2])
    for ref in refs:
        present[(ref.dataset, ref.name)].add(ref.generation)
    live = {(ref.dataset, ref.name): ref.generation for ref in refs if not ref.deleted}
    for (dataset, name), generations in sorted(present.items()):
        spec = f"{dataset}@{name}"
        for missing in sorted(set(range(1, max(generations))) - generations):
            key = history_key(dataset, name, missing)
            back = live.get((dataset, name), 0) - missing
            back_text = f" ({spec}~{back} names nothing)" if back > 0 else ""
            walk.add(Problem(MISSING, "history record", key, spec,
                             f"{walk.store.url}/{key}: generation {missing} of {spec} is missing from its history"
                             f"{back_text}; restore the record from a copy of the store"))


def _history_generation(key: str) -> tuple[str, str, int] | None:
    """(dataset, name, generation) a history key names, or None for a stray key (reported as invalid)."""
    parts = key[len(HISTORY_PREFIX):].split("/")
    stem = parts[-1].removesuffix(RECORD_SUFFIX)
    return (parts[0], parts[1], int(stem)) if len(parts) == 3 and len(stem) == 16 and is_decimal(stem) else None


def _check_markers(walk: FsckWalk, named: dict[str, str], markers: set[str]) -> None:
    """The snapshot a current ref or a hold names must have its marker (`prep show PREFIX` and
    gc's keep_within find snapshots by them); a history generation's may be gone with a gc
    interrupted before its objects, so it is not looked for."""
    for sha, by in sorted(named.items()):
        if sha in walk.read and sha not in markers:
            key = snapshot_marker_key(f"sha256:{sha}")
            walk.add(Problem(MISSING, "snapshot marker", key, by,
                             f"{walk.store.url}/{key}: the marker of snapshot sha256:{sha} ({by}) is missing, so no "
                             "hex prefix finds it; fsck --repair writes it again from the manifest"))


def _check_ref_dataset(walk: FsckWalk, ref: Ref) -> None:
    """A ref must name a snapshot of its own dataset (commands refuse to follow one that does not)."""
    try:
        dataset = load_snapshot(walk.store, ref.snapshot).dataset
    except PrepError:
        return  # the walk has recorded why the manifest does not read
    if dataset != ref.dataset:
        key = ref_key(ref.dataset, ref.name)
        walk.add(Problem(INVALID, "ref", key, key, f"{walk.store.url}/{key}: names snapshot {ref.snapshot} of "
                         f"dataset {dataset!r}, not {ref.dataset!r}"))


def _check_policies(walk: FsckWalk, dataset: str | None) -> None:
    """Each dataset's current retention policy must read: gc refuses to run without it."""
    listed = walk.store.list(f"{RETENTION_PREFIX}{dataset}/" if dataset else RETENTION_PREFIX)
    for name in sorted({info.key.split("/")[1] for info in listed if info.key.endswith(RECORD_SUFFIX)}):
        try:
            stored_policy(walk.store, name)
        except IntegrityError as exc:
            key = current_policy_key(walk.store, name) or f"{RETENTION_PREFIX}{name}/"
            walk.add(Problem(INVALID, "retention policy", key, key, exc.message))


def _check_readbacks(walk: FsckWalk, dataset: str | None, found: Records) -> None:
    """Every read-back record (for `dataset`, those of snapshots it reaches) must read: `prep tag`
    and a publish refuse an unreadable one. An invalid one is a record `repair` may delete, since
    losing it only makes the next publish read the snapshot back again."""
    for info in walk.store.list(READBACK_PREFIX):
        sha = readback_sha(info.key)
        if dataset is not None and sha not in walk.kept:
            continue
        try:
            if not is_sha_hex(sha) or not info.key.endswith(RECORD_SUFFIX):
                raise IntegrityError(f"{walk.store.url}/{info.key}: not a read-back record (its name is no "
                                     "snapshot's SHA-256)")
            records.read_readback(walk.store, f"sha256:{sha}")
        except NotFoundError:
            continue
        except IntegrityError as exc:
            walk.add(Problem(INVALID, "read-back record", info.key, info.key, exc.message))
            found.invalid.append(info.key)


def _hash(store: Store, sha: str, on_bytes: Callable[[int], None]) -> str | None:
    """Stream an object through SHA-256: None when it matches its name, else MISSING or CORRUPT."""
    hasher = hashlib.sha256()
    try:
        with store.open(object_key(sha)) as stream:
            while chunk := stream.read(hashing.CHUNK):
                hasher.update(chunk)
                on_bytes(len(chunk))
    except NotFoundError:
        return MISSING
    return None if hasher.hexdigest() == sha else CORRUPT


def _hash_reached(walk: FsckWalk, sizes: dict[str, int], jobs: int, progress: Progress) -> int:
    """Re-hash every reached object the walk has not already read whole; returns the bytes hashed."""
    todo = sorted(walk.kept - walk.read)
    for sha in [sha for sha in todo if sha not in sizes]:
        _object_problem(walk, MISSING, sha, "is missing")
    present = [sha for sha in todo if sha in sizes]
    total = sum(sizes[sha] for sha in present)
    meter = progress.meter("fsck: hashing", len(present), total)

    def check(sha: str) -> None:
        status = _hash(walk.store, sha, meter.add)
        meter.file_done(sha)
        if status is not None:
            _object_problem(walk, status, sha, "is missing" if status == MISSING else "does not hash to its name")

    parallel(check, present, jobs)
    meter.finish()
    return total


def _object_problem(walk: FsckWalk, problem: str, sha: str, what: str) -> None:
    """Record a problem with a reached object, as what it was first reached as."""
    via = walk.via.get(sha, Via("object", "(unknown)"))
    walk.add(Problem(problem, via.kind, object_key(sha), via.by,
                     f"{walk.store.url}: {via.kind} sha256:{sha}, reached from {via.by}, {what}", sha))


def _require_store(store: Store, dataset: str | None) -> None:
    """StoreError (exit 2: fsck could not run) for a location holding no prep store, or no such dataset."""
    prefixes = (REFS_PREFIX, HISTORY_PREFIX, SNAPSHOTS_PREFIX, OBJECTS_PREFIX)
    if not any(next(iter(store.list(prefix)), None) for prefix in prefixes):
        raise StoreError(f"{store.url}: not a prep store (no refs, history, snapshots or objects)")
    if dataset is not None and not any(next(iter(store.list(prefix)), None)
                                       for prefix in (refs_prefix(dataset), history_prefix(dataset))):
        raise NotFoundError(f"{store.url}: no dataset {dataset!r} (no refs or history)")


def fsck(store: Store, dataset: str | None = None, jobs: int = DEFAULT_JOBS, progress: Progress | None = None,
         repair: bool = False) -> FsckReport:
    """Check the store (or one dataset's part of it); with `repair`, then delete what a rebuild recomputes."""
    progress = progress or Progress(quiet=True)
    _require_store(store, dataset)
    if not repair:
        running = live_leases(store, GC)
        report = _check(store, dataset, jobs, progress)[0]
        running = running or live_leases(store, GC)
        return replace(report, gc_running=running[0].key) if running else report
    with Lease(store, GC) as lease:
        builds = live_leases(store, BUILD, store_now=lease.store_now())
        if builds:
            raise StoreError(f"{store.url}: a build holds lease {builds[0].key}; fsck --repair deletes nothing "
                             "while builds run, try again later")
        report, found, current = _check(store, dataset, jobs, progress)
        done = _repair(store, report.findings, found, current)
        progress.info(f"fsck: repair removed {plural(len(done.records), 'record')} and "
                      f"{plural(len(done.objects), 'object')}, restored {plural(len(done.restored), 'snapshot marker')}; "
                      f"{len(done.unrepairable)} unrepairable")
        return FsckReport(report.store, dataset, report.checked, report.findings, report.dangling,
                          report.collected, done)


def _check(store: Store, dataset: str | None, jobs: int, progress: Progress) -> tuple[FsckReport, Records, set[str]]:
    """The walk, the hashing and the dangling objects: the report, the records, the current refs' shas."""
    walk = FsckWalk(store)
    progress.stage("fsck", "following refs, history, holds and records")
    current, collected = _walk_snapshots(walk, dataset)
    _check_policies(walk, dataset)
    found = walk_records(walk, jobs, dataset)
    if dataset is None:
        check_packs(walk, found)
    found.folders = folders_at_records(walk, dataset)
    _check_readbacks(walk, dataset, found)
    sizes = {object_sha(info.key): info.size for info in store.list(OBJECTS_PREFIX)}  # after the records
    hashed = _hash_reached(walk, sizes, jobs, progress)
    dangling = () if dataset else tuple(Dangling(object_key(sha), size) for sha, size in sorted(sizes.items())
                                        if sha not in walk.kept)
    findings = tuple(sorted(walk.problems.values(), key=lambda p: (p.problem, p.kind, p.key)))
    checked = {"objects": len(walk.kept & sizes.keys()), "bytes": hashed + sum(sizes.get(s, 0) for s in walk.read),
               "records": len(found.names) + len(found.invalid)}
    progress.done("fsck", f"{plural(checked['objects'], 'object')}, {plural(checked['records'], 'record')}, "
                          f"{plural(len(findings), 'finding')}")
    return FsckReport(store.url, dataset, checked, findings, dangling, collected), found, current


def _repair(store: Store, findings: tuple[Problem, ...], found: Records, current: set[str]) -> Repair:
    """Delete records naming bad objects (and invalid records), then corrupt objects no current ref's
    snapshot manifest is; records first, so no record is left naming a deleted object."""
    bad = {f.sha for f in findings if f.sha is not None}
    lost_markers = [f.key for f in findings if f.kind == "snapshot marker" and f.problem == MISSING]
    restored = tuple(key for key in lost_markers if _restore_marker(store, key))
    unrepairable = sorted({f.key for f in findings if f.sha in current
                           or (f.kind == "snapshot manifest" and f.problem != CORRUPT)
                           or (f.kind in _LEFT and f.key not in {*found.folders, *restored})})
    doomed = sorted({*found.invalid, *(key for key, shas in found.names.items() if shas & bad)})
    corrupt = sorted({f.sha for f in findings if f.problem == CORRUPT and f.sha is not None and f.sha not in current})
    for key in doomed:
        store.delete(key)
    for key in found.folders:
        store.remove_empty_folder(f"{key}/")
    crash_point("fsck.after_records")
    for sha in corrupt:
        store.delete(snapshot_marker_key(f"sha256:{sha}"))  # a no-op unless it was a snapshot manifest
        store.delete(object_key(sha))
    return Repair(tuple(sorted({*doomed, *found.folders})), tuple(object_key(sha) for sha in corrupt),
                  tuple(unrepairable), restored)


def _restore_marker(store: Store, key: str) -> bool:
    """Write a lost snapshot marker again once its manifest is proven: it hashes to its name and
    is a snapshot manifest. False when it is not."""
    try:
        load_snapshot(store, f"sha256:{marker_sha(key)}")
    except PrepError:
        return False
    store.put_bytes(key, b"")
    return True


_LEFT = {"ref": "fsck never rewrites a ref: restore it from a copy of the store, or remove it by hand",
         "history record": "fsck never rewrites history: restore it from a copy of the store",
         "hold": "restore it from a copy of the store, or remove it with prep release",
         "retention policy": "the dataset's next build records its policy again",
         "snapshot marker": "a marker of no snapshot: prep gc deletes it once past its grace period"}
"""The kinds of finding `repair` leaves as they are (never deleted), and what to do instead."""


def unrepairable_reason(found: Problem) -> str:
    """Why `repair` left what `found` names, and what to do about it."""
    if found.kind == "snapshot marker" and found.problem == MISSING:
        return "its snapshot manifest does not prove, so the marker is not written from it"
    if found.kind in _LEFT:
        return _LEFT[found.kind]
    return "a ref, hold or history generation names it: restore it from a copy of the store, or move the ref"
