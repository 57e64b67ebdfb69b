"""fsck's walk, and the commit records it follows: each task record's outputs, each stage record's
manifest, which must be that stage's own (the build refuses any other), else the record is invalid;
and the generations missing from a ref's history."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from prep import hashing
from prep.errors import IntegrityError, NotFoundError, PrepError
from prep.storage.base import Store
from prep.store import cas, records
from prep.store.layout import (
    HISTORY_PREFIX,
    HOLDS_PREFIX,
    READBACK_PREFIX,
    RECORD_SUFFIX,
    REFS_PREFIX,
    RETENTION_PREFIX,
    STAGES_PREFIX,
    TASKS_PREFIX,
    history_key,
    is_decimal,
)
from prep.store.reach import INVALID, MISSING, Problem, Reach, parallel
from prep.store.refs import Ref


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
