"""Commit records and stage keys, typed, and the object ids each record or manifest names.

Task records (`prep.task/1`) live at `layout.task_record_key`, stage records
(`prep.stage-record/1`) at `layout.stage_record_key`; both are create-only and are validated
against their schemas in manifests/ when read. Keys are SHA-256 over canonical JSON of what
determines the output (stage name, resolved settings, code identity, input ids), never paths or
mtimes. Garbage collection follows the ids these records and manifests declare (`names`,
`stage_manifest_names`, `snapshot_names`); any other shape is an IntegrityError.

A store may hold snapshots of three layouts (`LAYOUTS`): layout 1 (tokenize, dedup, shuffle,
shard), which builds wrote before the partitioned stages, layout 2 (tokenize, route, order, shard),
and layout 3 (tokenize, order, shard: tokenize tasks write their parts' entries themselves; with
[dedup.near], near_buckets and near_clusters after tokenize). A
snapshot names each stage manifest as a stage of its layout (`ManifestRef`), a stage record as its
own stage; a manifest of another stage or layout than it is named as is refused (`check_named`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from prep.errors import IntegrityError, NotFoundError
from prep.manifest import canonical
from prep.manifest.schema import validate
from prep.storage.backend import Store
from prep.store import cas
from prep.store.layout import STAGES_PREFIX as STAGES_PREFIX  # re-exported for callers of records
from prep.store.layout import TASKS_PREFIX as TASKS_PREFIX
from prep.store.layout import readback_key, stage_record_key, task_record_key

TASK_SCHEMA = "prep.task/1"
STAGE_RECORD_SCHEMA = "prep.stage-record/1"
STAGE_SCHEMA = "prep.stage/1"
SNAPSHOT_SCHEMA = "prep.snapshot/1"
READBACK_SCHEMA = "prep.readback/1"

LAYOUTS: dict[int, tuple[str, ...]] = {1: ("tokenize", "dedup", "shuffle", "shard"),
                                       2: ("tokenize", "route", "order", "shard"),
                                       3: ("tokenize", "order", "shard")}
"""The stages of a snapshot of each layout, in the order its `stages` lists them."""
NEAR_STAGES = ("near_buckets", "near_clusters")
"""The stages a layout-3 build with [dedup.near] lists between tokenize and order."""


def layout_stages(layout: int) -> tuple[tuple[str, ...], ...]:
    """Every list of stages a snapshot of `layout` may have: its own, and in layout 3 with NEAR_STAGES."""
    stages = LAYOUTS[layout]
    return (stages, (stages[0], *NEAR_STAGES, *stages[1:])) if layout == 3 else (stages,)


@dataclass(frozen=True)
class ManifestRef:
    """A stage manifest as something names it: its id, the stage it must be, and the layout it
    must belong to (None when the namer does not say: a stage record)."""

    object_id: str
    stage: str
    layout: int | None = None


@dataclass(frozen=True)
class Names:
    """The object ids a record or manifest names; `manifests` are stage manifests, naming more in turn."""

    objects: frozenset[str] = frozenset()
    manifests: frozenset[ManifestRef] = frozenset()


@dataclass(frozen=True)
class TaskRecord:
    """One committed task (`prep.task/1`): the objects it stored and what later steps need to know."""

    stage: str
    key: str
    outputs: dict[str, str]
    summary: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"schema": TASK_SCHEMA, "stage": self.stage, "key": self.key, "outputs": self.outputs,
                "summary": self.summary}

    @classmethod
    def from_json(cls, data: Any, source: str) -> TaskRecord:
        """A validated task record; IntegrityError naming `source` when `data` breaks the schema."""
        validate(data, TASK_SCHEMA, source)
        return cls(str(data["stage"]), str(data["key"]), dict(data["outputs"]), dict(data["summary"]))

    def names(self) -> Names:
        return Names(objects=frozenset(self.outputs.values()))


@dataclass(frozen=True)
class StageRecord:
    """One committed stage (`prep.stage-record/1`): the id of its output manifest."""

    stage: str
    key: str
    output: str

    def to_json(self) -> dict[str, Any]:
        return {"schema": STAGE_RECORD_SCHEMA, "stage": self.stage, "key": self.key, "output": self.output}

    @classmethod
    def from_json(cls, data: Any, source: str) -> StageRecord:
        """A validated stage record; IntegrityError naming `source` when `data` breaks the schema."""
        validate(data, STAGE_RECORD_SCHEMA, source)
        return cls(str(data["stage"]), str(data["key"]), str(data["output"]))

    def names(self) -> Names:
        return Names(manifests=frozenset({ManifestRef(self.output, self.stage)}))


@dataclass(frozen=True)
class ReadbackRecord:
    """Every object of a snapshot (manifest and artifacts) was read back from the store and hashed
    to its name (`prep.readback/1`, at `layout.readback_key`): a later publish of the snapshot
    need not read it again. `checked` objects were read by that publish, `known` ones had passed before."""

    snapshot: str
    objects: int
    checked: int
    bytes_read: int
    time: str
    host: str

    def to_json(self) -> dict[str, Any]:
        return {"schema": READBACK_SCHEMA, "snapshot": self.snapshot, "objects": self.objects,
                "checked": self.checked, "bytes_read": self.bytes_read, "time": self.time, "host": self.host}

    @classmethod
    def from_json(cls, data: Any, source: str) -> ReadbackRecord:
        """A validated read-back record; IntegrityError naming `source` when `data` breaks the schema."""
        validate(data, READBACK_SCHEMA, source)
        return cls(str(data["snapshot"]), int(data["objects"]), int(data["checked"]), int(data["bytes_read"]),
                   str(data["time"]), str(data["host"]))


def read_readback(store: Store, snapshot_id: str) -> ReadbackRecord | None:
    """The read-back record of a snapshot, or None when it never passed one."""
    key = readback_key(snapshot_id)
    if store.head(key) is None:
        return None
    record = ReadbackRecord.from_json(_loads(store.get_bytes(key), f"{store.url}/{key}"), f"{store.url}/{key}")
    if record.snapshot != snapshot_id:
        raise IntegrityError(f"{store.url}/{key}: the read-back record of {record.snapshot} is filed under another snapshot")
    return record


def write_readback(store: Store, record: ReadbackRecord) -> None:
    """Store a snapshot's read-back record, create-only (a concurrent publisher's equal record wins)."""
    ReadbackRecord.from_json(record.to_json(), f"new read-back record of {record.snapshot}")
    store.put_bytes(readback_key(record.snapshot), canonical.dumps(record.to_json()))


def content_key(*parts: Any) -> str:
    """SHA-256 hex over the canonical JSON of `parts`."""
    return hashlib.sha256(canonical.dumps(list(parts))).hexdigest()


def _loads(raw: bytes, source: str) -> Any:
    try:
        return canonical.loads(raw)
    except ValueError as exc:
        raise IntegrityError(f"{source}: unreadable commit record ({exc})") from None


def parse_record(key: str, raw: bytes, source: str) -> TaskRecord | StageRecord:
    """The record stored at `key` (under tasks/ or stages/), validated, filed under its own key."""
    data = _loads(raw, source)
    record: TaskRecord | StageRecord
    if key.startswith(TASKS_PREFIX):
        record = TaskRecord.from_json(data, source)
        own_key = task_record_key(record.stage, record.key)
    elif key.startswith(STAGES_PREFIX):
        record = StageRecord.from_json(data, source)
        own_key = stage_record_key(record.stage, record.key)
    else:
        raise IntegrityError(f"{source}: {key!r} is no commit record key")
    if own_key != key:
        raise IntegrityError(f"{source}: the record belongs at {own_key}")
    return record


def _read(store: Store, key: str) -> TaskRecord | StageRecord | None:
    """The record at `key`, None when there is none: one GET (a missing key is the store's NotFoundError)."""
    try:
        raw = store.get_bytes(key)
    except NotFoundError:
        return None
    return parse_record(key, raw, f"{store.url}/{key}")


def read_task_record(store: Store, stage: str, key: str) -> TaskRecord | None:
    record = _read(store, task_record_key(stage, key))
    assert record is None or isinstance(record, TaskRecord)
    return record


def read_stage_record(store: Store, stage: str, key: str) -> StageRecord | None:
    record = _read(store, stage_record_key(stage, key))
    assert record is None or isinstance(record, StageRecord)
    return record


def _put_task_record(store: Store, record: TaskRecord) -> bool:
    """Store a task record create-only (one PUT), validated first: never store an invalid one.
    False when the key was taken."""
    TaskRecord.from_json(record.to_json(), f"new task record {record.stage}/{record.key}")
    return store.put_bytes(task_record_key(record.stage, record.key), canonical.dumps(record.to_json()))


def write_task_record(store: Store, stage: str, key: str, outputs: dict[str, str],
                      summary: dict[str, Any]) -> TaskRecord:
    """Commit a task: its outputs (object ids, already stored) and summary become reachable. One
    create-only PUT; only when another writer committed the key first is its record read back."""
    record = TaskRecord(stage, key, outputs, summary)
    if _put_task_record(store, record):
        return record
    # Another writer committed first: its record must name the same outputs.
    existing = read_task_record(store, stage, key)
    if existing is None or existing.outputs != outputs:
        raise IntegrityError(f"{store.url}: task {stage}/{key} was committed with different outputs")
    return existing


def write_alias_record(store: Store, stage: str, key: str, outputs: dict[str, str]) -> None:
    """Commit a record naming objects another task stored (a step's outcomes under its own key):
    create-only, so when one exists already the first one stays; one PUT."""
    _put_task_record(store, TaskRecord(stage, key, outputs, {}))


def read_stage(store: Store, stage: str, key: str) -> dict[str, Any] | None:
    """The committed output manifest of a stage, or None when the stage is not committed."""
    record = read_stage_record(store, stage, key)
    if record is None:
        return None
    return stage_manifest(store, record, cas.get_bytes(store, record.output))


def stage_manifest(store: Store, record: StageRecord, raw: bytes) -> dict[str, Any]:
    """The manifest a stage record names, from its (checked) bytes; IntegrityError unless it is
    that stage's own (stage and key): a record naming any other object is wrong, not rebuildable."""
    try:
        manifest = canonical.loads(raw)
    except ValueError:
        manifest = None
    if not isinstance(manifest, dict) or manifest.get("stage") != record.stage or manifest.get("key") != record.key:
        raise IntegrityError(f"{store.url}/{stage_record_key(record.stage, record.key)}: names {record.output}, "
                             f"which is not the manifest of that {record.stage} stage (prep fsck --repair removes the record)")
    return manifest


def commit_stage(store: Store, stage: str, key: str, manifest: dict[str, Any]) -> str:
    """Store a stage's output manifest, then its stage record; returns the manifest id."""
    body = {"schema": STAGE_SCHEMA, "stage": stage, "key": key, **manifest}
    digest = cas.put_bytes(store, canonical.dumps(body))
    store.put_bytes(stage_record_key(stage, key), canonical.dumps(StageRecord(stage, key, digest.id).to_json()))
    return digest.id


def stage_output_id(store: Store, stage: str, key: str) -> str:
    record = read_stage_record(store, stage, key)
    if record is None:
        raise IntegrityError(f"{store.url}: stage {stage}/{key} is not committed")
    return record.output


# ------------------------------------------------------------------ what a manifest names

def _table(manifest: dict[str, Any]) -> tuple[str, ...]:
    """The packed tables a stage's jobs named by id that its manifest records: the part table,
    and an order manifest's id check tables."""
    return ((manifest["parts_table"],) if "parts_table" in manifest else ()) + tuple(manifest.get("id_checks", ()))


_STAGE_NAMES: dict[str, Callable[[dict[str, Any]], Iterable[str]]] = {
    "tokenize": lambda manifest: (oid for task in manifest["tasks"]
                                  for oid in (task["output"], task.get("entries"), task.get("dropped"),
                                              task.get("bands"),
                                              *task.get("step_outcomes", ())) if oid is not None),
    "near_buckets": lambda manifest: (manifest["table"], *(bucket["pairs"] for bucket in manifest["buckets"])),
    "near_clusters": lambda manifest: (manifest["drops"],),
    "dedup": lambda manifest: manifest["outputs"].values(),
    "shuffle": lambda manifest: manifest["outputs"].values(),
    "route": lambda manifest: (task["output"] for task in manifest["tasks"]),
    "order": lambda manifest: (*(bucket["output"] for bucket in manifest["buckets"]), *_table(manifest)),
    "shard": lambda manifest: (*(oid for shard in manifest["shards"] for oid in shard["outputs"].values()),
                               *_table(manifest)),
}


def stage_manifest_names(manifest: Any, source: str) -> Names:
    """What a `prep.stage/1` manifest names by stage: tokenize tasks[].output and .entries, route
    tasks[].output, dedup and shuffle outputs, order buckets[].output, shard shards[].outputs,
    and the parts_table of order and shard (and an order manifest's id_checks tables)."""
    validate(manifest, STAGE_SCHEMA, source)
    names = _STAGE_NAMES.get(manifest["stage"])
    if names is None:
        raise IntegrityError(f"{source}: stage manifest of unknown stage {manifest['stage']!r}")
    return Names(objects=frozenset(str(object_id) for object_id in names(manifest)))


@dataclass(frozen=True)
class StageShape:
    """What a validated stage manifest is: its stage, and the layouts it can be part of."""

    stage: str
    layouts: frozenset[int]


def stage_shape(manifest: dict[str, Any]) -> StageShape:
    """The stage and layouts of a manifest `stage_manifest_names` accepted. A shard manifest's
    layout is its entries' (the schema allows one layout per manifest: positional, or keyed for
    layouts 2 and 3); one without shards, like a tokenize manifest, fits every layout of its stage."""
    stage = str(manifest["stage"])
    layouts = frozenset(layout for layout in LAYOUTS if any(stage in stages for stages in layout_stages(layout)))
    if stage == "shard" and manifest["shards"]:
        layouts = frozenset({1} if "first_pos" in manifest["shards"][0] else {2, 3})
    return StageShape(stage, layouts)


def check_named(shape: StageShape, ref: ManifestRef, source: str) -> None:
    """IntegrityError unless the manifest of `shape` is what `ref` names it as."""
    if shape.stage != ref.stage:
        raise IntegrityError(f"{source}: a {shape.stage} stage manifest, named as the {ref.stage} stage")
    if ref.layout is not None and ref.layout not in shape.layouts:
        raise IntegrityError(f"{source}: a {shape.stage} stage manifest of layout "
                             f"{' or '.join(map(str, sorted(shape.layouts)))}, named by a layout {ref.layout} snapshot")


def snapshot_layout(manifest: dict[str, Any], source: str) -> int:
    """The layout of a validated snapshot manifest, from its stages; IntegrityError for any other list."""
    stages = tuple(stage["name"] for stage in manifest["stages"])
    for layout in LAYOUTS:
        if stages in layout_stages(layout):
            return layout
    known = [", ".join(expected) for layout in LAYOUTS for expected in layout_stages(layout)]
    raise IntegrityError(f"{source}: stages {', '.join(stages) or '(none)'} are no snapshot layout ({'; '.join(known)})")


def snapshot_names(manifest: Any, source: str) -> Names:
    """What a `prep.snapshot/1` manifest names: its artifacts' sha256, the files it carries (its
    tokenizer file's object and its step sources', in snapshots built since they are stored) and,
    as manifests of its layout's stages, its stages' outputs."""
    validate(manifest, SNAPSHOT_SCHEMA, source)
    layout = snapshot_layout(manifest, source)
    return Names(objects=frozenset([f"sha256:{artifact['sha256']}" for artifact in manifest["artifacts"]]
                                   + carried_objects(manifest)),
                 manifests=frozenset(ManifestRef(str(stage["output"]), str(stage["name"]), layout)
                                     for stage in manifest["stages"]))


def carried_objects(manifest: dict[str, Any]) -> list[str]:
    """The objects of the files a snapshot manifest carries besides its artifacts: its tokenizer
    file and its step sources (each absent in snapshots built before it was stored)."""
    tokenizer = manifest["tokenizer"].get("object")
    return ([str(tokenizer)] if tokenizer else []) + [str(entry["object"]) for entry in manifest.get("step_sources", ())]
