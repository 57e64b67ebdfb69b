"""Lineage: where each document of a snapshot came from, and where it went.

Everything is read from what the stages recorded (tokenize intermediates, the dedup keep mask,
the shuffle plan), streamed or memory-mapped, so lookups work on corpora far larger than memory.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prep.errors import IntegrityError, NotFoundError, UsageError
from prep.formats import wds
from prep.formats.units import BIN, WDS, artifact_path
from prep.manifest import canonical
from prep.stages.dedup import MASK_HEADER_BYTES, mask_bytes_for, mask_count, unpack_flags
from prep.stages.intermediate import Intermediate
from prep.stages.shuffle import document_id, record_line
from prep.stages.specs import ShardSpec
from prep.storage.base import Store
from prep.store import cas
from prep.store.cache import local_file as fetch_local
from prep.store.snapshots import Snapshot

SCAN_BYTES = 1 << 22
SCAN_ROWS = 1 << 20


class PackedMask:
    """A keep mask (layout: prep.stages.dedup), memory-mapped: flag i keeps document i."""

    def __init__(self, path: Path) -> None:
        raw = np.memmap(path, dtype=np.uint8, mode="r")
        if len(raw) < MASK_HEADER_BYTES:
            raise IntegrityError(f"{path}: keep mask of {len(raw)} bytes has no {MASK_HEADER_BYTES}-byte header")
        self.count = mask_count(raw)
        self.bits = raw[MASK_HEADER_BYTES:]
        if len(self.bits) != mask_bytes_for(self.count):
            raise IntegrityError(f"{path}: keep mask of {self.count} documents has {len(self.bits)} bytes")

    def slice(self, start: int, end: int) -> np.ndarray:
        """The keep flags of documents [start, end) as booleans."""
        first = start // 8
        chunk = np.asarray(self.bits[first:(end + 7) // 8])
        return unpack_flags(chunk, end - first * 8)[start - first * 8:]

    def ones_before(self, index: int) -> int:
        """How many documents before `index` are kept (the plan row of a kept document)."""
        full, rest = divmod(index, 8)
        total = 0
        for begin in range(0, full, SCAN_BYTES):
            total += int(np.bitwise_count(np.asarray(self.bits[begin:min(full, begin + SCAN_BYTES)])).sum())
        if rest:
            total += int(unpack_flags(self.bits[full:full + 1], rest).sum())
        return total

    def ones_between(self, start: int, end: int) -> int:
        return int(self.slice(start, end).sum()) if end - start <= SCAN_BYTES else \
            self.ones_before(end) - self.ones_before(start)

    def nth_one(self, n: int) -> int:
        """The index of the n-th (0-based) kept document."""
        seen = 0
        for begin in range(0, len(self.bits), SCAN_BYTES):
            counts = np.bitwise_count(np.asarray(self.bits[begin:begin + SCAN_BYTES])).astype(np.int64)
            cumulative = np.cumsum(counts)
            if seen + int(cumulative[-1]) > n:
                byte = int(np.searchsorted(cumulative, n - seen, side="right"))
                before = seen + (int(cumulative[byte - 1]) if byte else 0)
                bits = np.flatnonzero(unpack_flags(self.bits[begin + byte:begin + byte + 1], 8))
                return (begin + byte) * 8 + int(bits[n - before])
            seen += int(cumulative[-1])
        raise IndexError(f"keep mask has only {seen} kept documents, not {n + 1}")


@dataclass(frozen=True)
class RecordedTask:
    """One tokenize task as its stage recorded it; `first` is its first document's input index."""

    source: str
    sha256: str
    format: str
    output: str
    documents: int
    first: int
    line_offset: int


@dataclass(frozen=True)
class SnapshotRecords:
    """The stage records of a snapshot that say which document came from where."""

    snapshot: Snapshot
    tasks: tuple[RecordedTask, ...]
    keep: PackedMask
    plan_id: str
    shards: tuple[ShardSpec, ...]

    @property
    def id_field(self) -> str | None:
        value = self.snapshot.manifest["config"].get("input", {}).get("id_field")
        return None if value is None else str(value)

    def tasks_of(self, source: str) -> tuple[RecordedTask, ...]:
        return tuple(task for task in self.tasks if task.source == source)

    def sources(self) -> list[str]:
        return sorted({task.source for task in self.tasks})

    def task_at(self, index: int) -> RecordedTask:
        """The task holding the document with input index `index`."""
        position = bisect.bisect_right([task.first for task in self.tasks], index) - 1
        return self.tasks[position]


def stage_manifest(store: Store, snapshot: Snapshot, name: str) -> dict[str, Any]:
    """The output manifest a snapshot's stage `name` recorded."""
    for stage in snapshot.manifest["stages"]:
        if stage["name"] == name:
            try:
                manifest = canonical.loads(cas.get_bytes(store, stage["output"]))
            except NotFoundError:
                raise NotFoundError(f"{store.url}: the {name} stage manifest of snapshot {snapshot.id[:19]} is not "
                                    "in this store (another store, or collected)") from None
            if not isinstance(manifest, dict):
                raise IntegrityError(f"{store.url}: stage manifest {stage['output']} is not an object")
            return manifest
    raise IntegrityError(f"snapshot {snapshot.id} records no {name} stage")


def load_records(store: Store, snapshot: Snapshot) -> SnapshotRecords:
    """Load the tokenize, dedup and shuffle records of `snapshot` (small manifests, mapped mask)."""
    tasks, first = [], 0
    for entry in stage_manifest(store, snapshot, "tokenize")["tasks"]:
        tasks.append(RecordedTask(entry["source"], entry["sha256"], entry["format"], entry["output"],
                                  int(entry["documents"]), first, int(entry["line_offset"])))
        first += int(entry["documents"])
    keep = PackedMask(fetch_local(store, stage_manifest(store, snapshot, "dedup")["outputs"]["keep"]))
    if keep.count != first:
        raise IntegrityError(f"snapshot {snapshot.id}: keep mask covers {keep.count} documents, tokenize recorded {first}")
    shuffle = stage_manifest(store, snapshot, "shuffle")
    shards = tuple(ShardSpec.from_json(spec) for spec in shuffle["shards"])
    return SnapshotRecords(snapshot, tuple(tasks), keep, shuffle["outputs"]["plan"], shards)


def task_batches(store: Store, task: RecordedTask, columns: Sequence[str]) -> Iterator[pa.RecordBatch]:
    """The task's intermediate rows (all documents, kept or not), in input order, batch by batch."""
    yield from Intermediate(fetch_local(store, task.output), list(columns)).batches()


@dataclass(frozen=True)
class DocumentOrigin:
    """One input document: its id as shards record it, where it was read, and its sizes."""

    index: int
    id: str
    source: str
    line: int
    text_hash: str
    text_bytes: int
    tokens: int

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "source": self.source, "line": self.line, "text_hash": self.text_hash,
                "text_bytes": self.text_bytes, "tokens": self.tokens}


@dataclass(frozen=True)
class Placement:
    """Where a document sits in one artifact: sequence number in the shard and byte range."""

    path: str
    format: str
    shard: int
    sequence: int
    offset: int | None
    length: int | None


@dataclass(frozen=True)
class Trace:
    """A document's journey: its origin, and either its placements or the copy kept instead."""

    document: DocumentOrigin
    position: int | None
    placements: tuple[Placement, ...]
    duplicate_of: Trace | None = None


_ORIGIN_COLUMNS = ["row", "id", "text_hash", "text_bytes", "n_tokens"]


def _origin(task: RecordedTask, index: int, row: dict[str, Any]) -> DocumentOrigin:
    line = record_line(task.format, task.line_offset, int(row["row"]))
    return DocumentOrigin(index, document_id(row["id"], task.source, line), task.source, line,
                          bytes(row["text_hash"]).hex(), int(row["text_bytes"]), int(row["n_tokens"]))


def origin_at(store: Store, records: SnapshotRecords, index: int) -> DocumentOrigin:
    """The document with input index `index`, reading one batch of its intermediate."""
    task = records.task_at(index)
    local = index - task.first
    seen = 0
    for batch in task_batches(store, task, _ORIGIN_COLUMNS):
        if local < seen + batch.num_rows:
            return _origin(task, index, batch.slice(local - seen, 1).to_pylist()[0])
        seen += batch.num_rows
    raise IntegrityError(f"{task.output}: intermediate of {task.source} has {seen} rows, expected {task.documents}")


Predicate = Callable[[pa.RecordBatch, RecordedTask], pa.Array]
"""Which rows of a batch of a task's intermediate match (a boolean array, nulls count as no)."""


def _scan(store: Store, tasks: Sequence[RecordedTask], predicate: Predicate) -> Iterator[DocumentOrigin]:
    """Every document of `tasks` whose row satisfies `predicate`, in input order."""
    for task in tasks:
        seen = 0
        for batch in task_batches(store, task, _ORIGIN_COLUMNS):
            matches = pc.fill_null(predicate(batch, task), False).to_numpy(zero_copy_only=False)
            for hit in np.flatnonzero(matches):
                yield _origin(task, task.first + seen + int(hit), batch.slice(int(hit), 1).to_pylist()[0])
            seen += batch.num_rows


def _line_is(line: int) -> Predicate:
    def predicate(batch: pa.RecordBatch, task: RecordedTask) -> pa.Array:
        return pc.equal(batch.column("row"), line - record_line(task.format, task.line_offset, 0))
    return predicate


def _column_is(column: str, value: pa.Scalar) -> Predicate:
    def predicate(batch: pa.RecordBatch, task: RecordedTask) -> pa.Array:
        return pc.equal(batch.column(column), value)
    return predicate


def find_documents(store: Store, records: SnapshotRecords, spec: str) -> list[DocumentOrigin]:
    """Every input document named by `spec`: an id (unique across files), SOURCE:ID, or, without
    an id field, SOURCE:LINE. Raises NotFoundError, or UsageError when ambiguous."""
    sources = records.sources()
    prefixed = [(source, spec[len(source) + 1:]) for source in sources if spec.startswith(source + ":")]
    found: list[DocumentOrigin] = []
    if records.id_field is None:
        for source, rest in prefixed:
            if rest.isdigit():
                found.extend(_scan(store, records.tasks_of(source), _line_is(int(rest))))
        if not prefixed:
            raise UsageError(f"{spec!r}: snapshot {records.snapshot.id[:19]} has no id field, so documents "
                             "are named SOURCE:LINE")
    else:
        found.extend(_scan(store, records.tasks, _column_is("id", pa.scalar(spec, pa.string()))))
        for source, rest in prefixed:
            found.extend(_scan(store, records.tasks_of(source), _column_is("id", pa.scalar(rest, pa.string()))))
    unique = {origin.index: origin for origin in found}
    named = sorted({(origin.source, origin.id) for origin in unique.values()})
    if not named:
        raise NotFoundError(f"snapshot {records.snapshot.id[:19]} has no document {spec!r}")
    if len(named) > 1:
        choices = ", ".join(f"{source}:{doc_id}" for source, doc_id in named[:10])
        raise UsageError(f"{spec!r} is ambiguous: name one of {choices}")
    return [unique[index] for index in sorted(unique)]


def _artifacts_of_shard(records: SnapshotRecords, shard: int) -> list[dict[str, Any]]:
    return sorted((a for a in records.snapshot.artifacts if a["shard"] == shard), key=lambda a: a["path"])


def _placements(records: SnapshotRecords, origin: DocumentOrigin, plan_row: np.void) -> tuple[Placement, ...]:
    dtype = np.dtype(records.snapshot.manifest["tokenizer"]["dtype"])
    shard, position = int(plan_row["shard"]), int(plan_row["pos"])
    sequence = position - records.shards[shard].first_pos
    tokens = origin.tokens + 1  # every sequence ends with EOS
    found = []
    for artifact in _artifacts_of_shard(records, shard):
        offset: int | None
        length: int | None
        if artifact["format"] == BIN:
            offset, length = int(plan_row["bin_off"]), tokens * dtype.itemsize
        elif artifact["format"] == WDS:
            json_size = len(wds.sample_json(origin.id, origin.source, origin.line, tokens))
            offset = int(plan_row["tar_off"])
            length = wds.sample_span(json_size, wds.npy_size(tokens, dtype), origin.text_bytes)
        else:  # idx: the sequence's entries in the index; no byte range of its own
            offset, length = None, None
        found.append(Placement(artifact["path"], artifact["format"], shard, sequence, offset, length))
    return tuple(found)


def _plan(store: Store, records: SnapshotRecords) -> np.ndarray:
    return np.load(fetch_local(store, records.plan_id), mmap_mode="r", allow_pickle=False)  # type: ignore[no-any-return]


def _first_copy(store: Store, records: SnapshotRecords, origin: DocumentOrigin) -> DocumentOrigin:
    """The kept document with the same text as `origin` (dedup keeps the first in input order)."""
    same_text = _column_is("text_hash", pa.scalar(bytes.fromhex(origin.text_hash), pa.binary(16)))
    for candidate in _scan(store, records.tasks, same_text):
        if records.keep.slice(candidate.index, candidate.index + 1)[0]:
            return candidate
    raise IntegrityError(f"snapshot {records.snapshot.id[:19]}: document {origin.id!r} was dropped, but no kept copy exists")


def trace_origin(store: Store, records: SnapshotRecords, origin: DocumentOrigin) -> Trace:
    """Where `origin` went: its shard placements, or the trace of the copy dedup kept instead."""
    if not records.keep.slice(origin.index, origin.index + 1)[0]:
        kept = _first_copy(store, records, origin)
        return Trace(origin, None, (), trace_origin(store, records, kept))
    plan_row = _plan(store, records)[records.keep.ones_before(origin.index)]
    return Trace(origin, int(plan_row["pos"]), _placements(records, origin, plan_row))


def trace(store: Store, snapshot: Snapshot, spec: str) -> list[Trace]:
    """Traces of every document `spec` names (several when an id repeats within its file)."""
    records = load_records(store, snapshot)
    return [trace_origin(store, records, origin) for origin in find_documents(store, records, spec)]


def parse_at(spec: str) -> tuple[str, int]:
    """`bin/00000.bin:17` -> ("bin/00000.bin", 17)."""
    path, _, number = spec.rpartition(":")
    if not path or not number.isdigit():
        raise UsageError(f"--at {spec!r}: expected ARTIFACT_PATH:N, e.g. {artifact_path(BIN, 0)}:0")
    return path, int(number)


def locate(store: Store, snapshot: Snapshot, path: str, sequence: int) -> Trace:
    """The document stored as sequence `sequence` (0-based) of the shard artifact at `path`."""
    artifact = next((a for a in snapshot.artifacts if a["path"] == path), None)
    if artifact is None:
        paths = ", ".join(a["path"] for a in snapshot.artifacts[:3])
        raise NotFoundError(f"snapshot {snapshot.id[:19]} has no artifact {path!r} (artifacts are like {paths})")
    records = load_records(store, snapshot)
    spec = records.shards[int(artifact["shard"])]
    if not 0 <= sequence < spec.documents:
        raise UsageError(f"{path} holds {spec.documents} sequences (0..{spec.documents - 1}); got {sequence}")
    plan = _plan(store, records)
    target = spec.first_pos + sequence
    for begin in range(0, len(plan), SCAN_ROWS):
        hits = np.flatnonzero(plan["pos"][begin:begin + SCAN_ROWS] == target)
        if len(hits):
            index = records.keep.nth_one(begin + int(hits[0]))
            return trace_origin(store, records, origin_at(store, records, index))
    raise IntegrityError(f"snapshot {snapshot.id[:19]}: no planned document at position {target}")
