"""What lineage and document diffs share: a snapshot's tokenize records, the documents they hold,
and the traces lineage reports.

A snapshot's layout says how its global stages recorded where documents went: positional
(stages tokenize, dedup, shuffle, shard: a keep mask and a shuffle plan, shards named by
position) or keyed (stages tokenize, order, shard, with a route stage between the first two in
store layout 2: bucket objects of key-ordered entries, shards named by key range). The tokenize
records, and so every document's origin, read the same in all of them.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prep.errors import IntegrityError, NotFoundError, UsageError
from prep.formats import wds
from prep.history.selectors import is_decimal, is_text
from prep.manifest import canonical
from prep.storage.backend import Store
from prep.store import cas
from prep.store.localcopy import verified_local_file
from prep.store.snapshots import Snapshot
from prep.workfiles.columns import FALSE, row_of, scalar_of, to_numbers
from prep.workfiles.docnames import document_id, record_line
from prep.workfiles.intermediate import Intermediate

LAYOUT_POSITIONAL = 1
"""Stages tokenize, dedup, shuffle, shard; shards named by position (bin/00003.bin)."""
LAYOUT_KEYED = 2
"""Stages tokenize, (route,) order, shard; shards named by key range (bin/3a00000000000000.bin)."""
PROVE_THREADS = 8
_LAYOUT_STAGES = {LAYOUT_POSITIONAL: ("dedup", "shuffle"), LAYOUT_KEYED: ("order",)}


def snapshot_layout(snapshot: Snapshot) -> int:
    """The layout of `snapshot`'s global stages; IntegrityError when it is neither."""
    names = {stage["name"] for stage in snapshot.manifest["stages"]}
    for layout, stages in _LAYOUT_STAGES.items():
        if names.issuperset(stages):
            return layout
    raise IntegrityError(f"snapshot {snapshot.id[:19]} records stages {sorted(names)}: neither dedup and shuffle "
                         "(positional) nor order (keyed)")


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
    """The tokenize records of a snapshot, in input order (a task's position is its part ordinal)."""

    snapshot: Snapshot
    tasks: tuple[RecordedTask, ...]
    layout: int

    @property
    def id_field(self) -> str | None:
        """The input's id field, None when documents are named SOURCE:LINE."""
        value = self.snapshot.manifest["config"].get("input", {}).get("id_field")
        return None if value is None else str(value)

    @property
    def documents(self) -> int:
        """How many documents the tokenize stage read (kept or not)."""
        return sum(task.documents for task in self.tasks)

    def tasks_of(self, source: str) -> tuple[RecordedTask, ...]:
        """The tasks of input file `source`, in input order."""
        return tuple(task for task in self.tasks if task.source == source)

    def sources(self) -> list[str]:
        """Every input file, sorted."""
        return sorted({task.source for task in self.tasks})

    def part_at(self, index: int) -> int:
        """The ordinal of the task holding the document with input index `index`."""
        return bisect.bisect_right([task.first for task in self.tasks], index) - 1

    def task_at(self, index: int) -> RecordedTask:
        """The task holding the document with input index `index`."""
        return self.tasks[self.part_at(index)]


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
    """Load the tokenize records of `snapshot` (one small manifest) and find its layout."""
    tasks, first = [], 0
    for entry in stage_manifest(store, snapshot, "tokenize")["tasks"]:
        tasks.append(RecordedTask(entry["source"], entry["sha256"], entry["format"], entry["output"],
                                  int(entry["documents"]), first, int(entry["line_offset"])))
        first += int(entry["documents"])
    return SnapshotRecords(snapshot, tuple(tasks), snapshot_layout(snapshot))


def verified_object(store: Store, object_id: str, what: str) -> Path:
    """A local file of the object a snapshot names as `what`, proven to hash to its name (once per
    process); IntegrityError naming it when it is corrupt or missing."""
    try:
        return verified_local_file(store, object_id)
    except IntegrityError:
        raise IntegrityError(f"{store.url}: {what} (object {object_id}) does not hash to its name") from None
    except (NotFoundError, FileNotFoundError):
        raise IntegrityError(f"{store.url}: {what} (object {object_id}) is missing from the store") from None


def prove_intermediates(store: Store, tasks: Iterable[RecordedTask]) -> None:
    """Prove the tasks' intermediates (verified_object) on a few threads at once, before they are
    read one by one: hashing them dominates a document diff, and hashlib runs without the GIL."""
    unique = {task.output: task for task in tasks}  # two snapshots may share an intermediate
    with ThreadPoolExecutor(max_workers=min(PROVE_THREADS, os.cpu_count() or 1)) as pool:
        list(pool.map(lambda task: verified_object(store, task.output, f"the tokenize intermediate of {task.source}"),
                      unique.values()))


def task_batches(store: Store, task: RecordedTask, columns: Sequence[str]) -> Iterator[pa.RecordBatch]:
    """The task's intermediate rows (all documents, kept or not), in input order, batch by batch."""
    path = verified_object(store, task.output, f"the tokenize intermediate of {task.source}")
    yield from Intermediate(path, list(columns)).batches()


@dataclass(frozen=True)
class DocumentOrigin:
    """One input document: its id as shards record it, where it was read, and its sizes; `part`
    (its task's ordinal) and `row` (as its intermediate records it) are its place in input order."""

    index: int
    id: str
    source: str
    line: int
    text_hash: str
    text_bytes: int
    tokens: int
    part: int
    row: int

    def to_json(self) -> dict[str, Any]:
        """The origin as reports print it."""
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

    def to_json(self) -> dict[str, Any]:
        """The placement as reports print it."""
        return {"path": self.path, "format": self.format, "shard": self.shard, "sequence": self.sequence,
                "offset": self.offset, "length": self.length}


@dataclass(frozen=True)
class Similarity:
    """How alike a near duplicate is to the kept document: the MinHash estimate (the share of equal
    signature values) and the exact Jaccard of their shingle sets, computed again with the
    snapshot's `[dedup.near]` settings (a member can be below `threshold`: clusters join pair by pair)."""

    estimated: float
    jaccard: float
    threshold: float
    ngram: int
    permutations: int

    def to_json(self) -> dict[str, Any]:
        """The similarity as reports print it, beside the documents it relates."""
        return {"estimated_similarity": self.estimated, "jaccard": self.jaccard, "threshold": self.threshold,
                "ngram": self.ngram, "permutations": self.permutations}


@dataclass(frozen=True)
class NearDuplicate:
    """What near-duplicate removal dropped a document for: the trace of its cluster's kept first
    document, and how similar the two are."""

    kept: Trace
    similarity: Similarity

    def to_json(self) -> dict[str, Any]:
        """The near duplicate as reports print it (manifests/trace-report-1.schema.json, `$defs/near`)."""
        return {"trace": self.kept.to_json(), **self.similarity.to_json()}


@dataclass(frozen=True)
class Trace:
    """A document's journey: its origin, and either its placements, the copy kept instead (exact
    dedup) or the near duplicate kept instead (near-duplicate removal).

    `position` is the global position in the shuffled order (layout 1) or the sequence within
    its shard (keyed layouts); `order_key` (keyed layouts only) is its 128-bit order key in 32 hex digits."""

    document: DocumentOrigin
    position: int | None
    placements: tuple[Placement, ...]
    duplicate_of: Trace | None = None
    order_key: str | None = None
    copy: int = 0  # keyed layouts, dedup off: the document's number among equal texts in its shard
    near_duplicate_of: NearDuplicate | None = None

    @property
    def sample_key(self) -> str | None:
        """The document's WebDataset sample key, None when it was dropped: its order key, whose
        low half is advanced by its copy number (prep.stages.shard), or its position (layout 1)."""
        if self.order_key is not None:
            low = (int(self.order_key[16:], 16) + self.copy) % (1 << 64)
            return f"{self.order_key[:16]}{low:016x}"
        return None if self.position is None else wds.sample_key(self.position)

    def to_json(self) -> dict[str, Any]:
        """The trace as reports print it (manifests/trace-report-1.schema.json, `$defs/trace`)."""
        return {"document": self.document.to_json(), "sample_key": self.sample_key, "order_key": self.order_key,
                "position": self.position, "placements": [place.to_json() for place in self.placements],
                "duplicate_of": None if self.duplicate_of is None else self.duplicate_of.to_json(),
                **({} if self.near_duplicate_of is None else {"near_duplicate_of": self.near_duplicate_of.to_json()})}


_ORIGIN_COLUMNS = ["row", "id", "text_hash", "text_bytes", "n_tokens"]


def _origin(records: SnapshotRecords, part: int, index: int, row: dict[str, Any]) -> DocumentOrigin:
    task = records.tasks[part]
    line = record_line(task.format, task.line_offset, int(row["row"]))
    return DocumentOrigin(index, document_id(row["id"], task.source, line), task.source, line,
                          bytes(row["text_hash"]).hex(), int(row["text_bytes"]), int(row["n_tokens"]), part,
                          int(row["row"]))


def origin_at(store: Store, records: SnapshotRecords, index: int) -> DocumentOrigin:
    """The document with input index `index`, reading one batch of its intermediate."""
    part = records.part_at(index)
    task = records.tasks[part]
    local = index - task.first
    seen = 0
    for batch in task_batches(store, task, _ORIGIN_COLUMNS):
        if local < seen + batch.num_rows:
            return _origin(records, part, index, row_of(batch, local - seen))
        seen += batch.num_rows
    raise IntegrityError(f"{task.output}: intermediate of {task.source} has {seen} rows, expected {task.documents}")


Predicate = Callable[[pa.RecordBatch, RecordedTask], pa.Array]
"""Which rows of a batch of a task's intermediate match (a boolean array, nulls count as no)."""


def scan(store: Store, records: SnapshotRecords, parts: Sequence[int], predicate: Predicate) -> Iterator[DocumentOrigin]:
    """Every document of the tasks `parts` (ordinals) whose row satisfies `predicate`, in input order."""
    for part in parts:
        task = records.tasks[part]
        seen = 0
        for batch in task_batches(store, task, _ORIGIN_COLUMNS):
            matches = to_numbers(pc.fill_null(predicate(batch, task), FALSE))
            for hit in np.flatnonzero(matches):
                yield _origin(records, part, task.first + seen + int(hit), row_of(batch, int(hit)))
            seen += batch.num_rows


def line_is(line: int) -> Predicate:
    """Rows read from 1-based line (or record) `line` of their file."""
    def predicate(batch: pa.RecordBatch, task: RecordedTask) -> pa.Array:
        """The matching rows of `batch`."""
        return pc.equal(batch.column("row"), scalar_of(line - record_line(task.format, task.line_offset, 0), pa.int64()))
    return predicate


def column_is(column: str, value: pa.Scalar) -> Predicate:
    """Rows whose `column` equals `value`."""
    def predicate(batch: pa.RecordBatch, task: RecordedTask) -> pa.Array:
        """The matching rows of `batch`."""
        return pc.equal(batch.column(column), value)
    return predicate


def origin_of_row(store: Store, records: SnapshotRecords, part: int, row: int) -> DocumentOrigin:
    """The document of task `part` (ordinal) whose intermediate records row `row`."""
    if not 0 <= part < len(records.tasks):
        raise IntegrityError(f"snapshot {records.snapshot.id[:19]} has no tokenize part {part}")
    for found in scan(store, records, [part], column_is("row", scalar_of(row, pa.int64()))):
        return found
    raise IntegrityError(f"snapshot {records.snapshot.id[:19]}: part {part} ({records.tasks[part].source}) "
                         f"has no row {row}")


def _parts_of(records: SnapshotRecords, source: str | None = None) -> list[int]:
    return [part for part, task in enumerate(records.tasks) if source is None or task.source == source]


_NO_SUCH_LINE = 1 << 62
"""Line numbers from here on name no document (rows are int64; comparing with a larger number fails)."""


def find_documents(store: Store, records: SnapshotRecords, spec: str) -> list[DocumentOrigin]:
    """Every input document named by `spec`: an id (unique across files), SOURCE:ID, or SOURCE:LINE
    (with or without an id field: when SOURCE:N names both the document with id N and another
    on line N, it is ambiguous). Raises NotFoundError, or UsageError when ambiguous."""
    if not is_text(spec):  # an argument of bytes that are no UTF-8 (os.fsdecode's surrogates): Arrow cannot hold it
        raise NotFoundError(f"snapshot {records.snapshot.id[:19]} has no document {spec!r} (it is not UTF-8 text)")
    sources = records.sources()
    prefixed = [(source, spec[len(source) + 1:]) for source in sources if spec.startswith(source + ":")]
    found: list[DocumentOrigin] = []
    for source, rest in prefixed:
        if is_decimal(rest) and 0 < int(rest) < _NO_SUCH_LINE:
            found.extend(scan(store, records, _parts_of(records, source), line_is(int(rest))))
    if records.id_field is None:
        if not prefixed:
            raise UsageError(f"{spec!r}: snapshot {records.snapshot.id[:19]} has no id field, so documents "
                             "are named SOURCE:LINE")
    else:
        found.extend(scan(store, records, _parts_of(records), column_is("id", scalar_of(spec, pa.string()))))
        for source, rest in prefixed:
            found.extend(scan(store, records, _parts_of(records, source),
                              column_is("id", scalar_of(rest, pa.string()))))
    unique = {origin.index: origin for origin in found}
    named = sorted({(origin.source, origin.id) for origin in unique.values()})
    if not named:
        raise NotFoundError(f"snapshot {records.snapshot.id[:19]} has no document {spec!r}")
    if len(named) > 1:
        choices = ", ".join(f"{source}:{doc_id}" for source, doc_id in named[:10])
        raise UsageError(f"{spec!r} is ambiguous: name one of {choices}")
    return [unique[index] for index in sorted(unique)]


def artifacts_of_shard(snapshot: Snapshot, shard: int) -> list[dict[str, Any]]:
    """The artifacts of shard `shard` (its index), by path."""
    return sorted((a for a in snapshot.artifacts if a["shard"] == shard), key=lambda a: a["path"])
