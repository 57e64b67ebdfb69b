"""Document-level diff of two snapshots: which documents were added, removed, or changed text.

A document is named by its input file's relative path and its id when both snapshots have an
id field, else by its file and the hash of its text (an edited text is then removed + added).
Only documents a snapshot contains (kept by dedup) count: its keep flags come from its keep
mask (layout 1) or are computed again from its text hashes (keyed layouts, prep.history.keep), so
snapshots of either layout compare with each other. Files whose documents are provably the
same are skipped without reading; the others are compared file by file from the tokenize
intermediates, in memory when small, else hash-partitioned into spill files so that at most
about `memory_rows` documents are held at once. Changes stream to a JSON Lines file.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from prep.errors import InputError
from prep.history.documents import RecordedTask, SnapshotRecords, load_records, prove_intermediates, task_batches
from prep.history.keep import SCAN_BYTES, KeepFlags, keep_flags
from prep.storage.backend import Store
from prep.store.snapshots import Snapshot
from prep.workfiles.columns import bool_column, int_column, to_numbers, to_strings
from prep.workfiles.docnames import document_id, record_line
from prep.workfiles.intermediate import hash_pairs

KEYED_BY_ID = "id"
KEYED_BY_TEXT = "text_hash"
DEFAULT_MEMORY_ROWS = 1_000_000
MAX_PARTITIONS = 512
CHANGES_FILE = "document-changes.jsonl"
SIDES = ("a", "b")


@dataclass(frozen=True)
class DocumentVersion:
    """A document as one snapshot holds it: its id in shards, its line and its text hash (hex)."""

    id: str
    line: int
    text_hash: str

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "line": self.line, "text_hash": self.text_hash}


@dataclass(frozen=True)
class DocumentChange:
    """One difference: `added` (only new), `removed` (only old) or `changed` (both, other text).

    `copies` counts repeats of one text within a file (only when keyed by text hash)."""

    change: str
    source: str
    old: DocumentVersion | None
    new: DocumentVersion | None
    copies: int = 1
    why: str | None = None  # for a removed (added) document, the step of the new (old) snapshot that dropped it

    def to_json(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"change": self.change, "source": self.source, "copies": self.copies}
        for name, version in (("old", self.old), ("new", self.new)):
            if version is not None:
                entry[name] = version.to_json()
        if self.why is not None:
            entry["why"] = self.why
        return entry

    @classmethod
    def from_json(cls, entry: dict[str, Any]) -> DocumentChange:
        versions = {name: DocumentVersion(**entry[name]) if name in entry else None for name in ("old", "new")}
        return cls(entry["change"], entry["source"], versions["old"], versions["new"], entry["copies"], entry.get("why"))


@dataclass(frozen=True)
class DocumentSummary:
    """Counts of a document diff; `unchanged` counts documents present in both with equal text."""

    keyed_by: str
    added: int
    removed: int
    changed: int
    unchanged: int
    files_compared: int
    files_skipped: int

    @property
    def differs(self) -> bool:
        return bool(self.added or self.removed or self.changed)

    def to_json(self) -> dict[str, Any]:
        return {"keyed_by": self.keyed_by, "added": self.added, "removed": self.removed,
                "changed": self.changed, "unchanged": self.unchanged,
                "files_compared": self.files_compared, "files_skipped": self.files_skipped}


@dataclass(frozen=True)
class DocumentDiff:
    """A finished document diff: its counts and the spill file holding every change in order."""

    summary: DocumentSummary
    changes_path: Path

    def changes(self) -> Iterator[DocumentChange]:
        with open(self.changes_path, encoding="utf-8") as lines:
            for line in lines:
                yield DocumentChange.from_json(json.loads(line))


@dataclass
class _Counts:
    added: int = 0
    removed: int = 0
    changed: int = 0
    unchanged: int = 0
    compared: int = 0
    skipped: int = 0
    out: TextIO | None = field(default=None, repr=False)

    def emit(self, change: DocumentChange) -> None:
        setattr(self, change.change, getattr(self, change.change) + change.copies)
        assert self.out is not None
        self.out.write(json.dumps(change.to_json(), ensure_ascii=False) + "\n")


@dataclass(frozen=True)
class _Side:
    """One snapshot's documents of one file: its records and keep flags, its tasks of that file, a label."""

    records: SnapshotRecords
    keep: KeepFlags
    tasks: tuple[RecordedTask, ...]
    label: str

    @property
    def documents(self) -> int:
        return sum(task.documents for task in self.tasks)

    @property
    def span(self) -> tuple[int, int]:
        """The input indexes of this file's documents (its tasks are consecutive)."""
        return (self.tasks[0].first, self.tasks[0].first + self.documents) if self.tasks else (0, 0)


def _schema(by_id: bool) -> pa.Schema:
    return pa.schema([("key", pa.string() if by_id else pa.binary(16)), ("text_hash", pa.binary(16)),
                      ("line", pa.int64())])


def _kept_batches(store: Store, side: _Side, by_id: bool) -> Iterator[pa.RecordBatch]:
    """The file's kept documents as (key, text_hash, line) batches, in input order."""
    schema = _schema(by_id)
    for task in side.tasks:
        offset = task.first
        for batch in task_batches(store, task, ["row", "text_hash"] + (["id"] if by_id else [])):
            keep = side.keep.slice(offset, offset + batch.num_rows)
            offset += batch.num_rows
            if not keep.any():
                continue
            kept = batch.filter(bool_column(keep))
            rows: Any = to_numbers(kept.column("row"))
            lines = np.asarray(record_line(task.format, task.line_offset, rows), dtype=np.int64)
            key = (kept.column("id") if by_id else kept.column("text_hash")).cast(schema.field("key").type)
            yield pa.record_batch([key, kept.column("text_hash"), int_column(lines, pa.int64())], schema=schema)


def _partition_of(keys: pa.Array, parts: int) -> np.ndarray:
    """A partition number per key, the same for equal keys in both snapshots."""
    if pa.types.is_fixed_size_binary(keys.type):
        words = hash_pairs(keys)[:, 0]
    else:
        words = np.fromiter((xxhash.xxh3_64_intdigest(key.encode()) for key in keys.to_pylist()),
                            dtype=np.uint64, count=len(keys))
    return (words % np.uint64(parts)).astype(np.int64)


def _spill(store: Store, side: _Side, by_id: bool, parts: int, folder: Path) -> None:
    """Write the file's kept documents of one snapshot into `parts` Arrow files by key hash."""
    writers: dict[int, pa.ipc.RecordBatchFileWriter] = {}
    try:
        for batch in _kept_batches(store, side, by_id):
            partition = _partition_of(batch.column("key"), parts)
            order = np.argsort(partition, kind="stable")
            ordered = batch.take(int_column(order, pa.int64()))
            bounds = np.searchsorted(partition[order], np.arange(parts + 1))
            for part in range(parts):
                start, end = int(bounds[part]), int(bounds[part + 1])
                if end > start:
                    if part not in writers:
                        writers[part] = pa.ipc.new_file(folder / f"{part}.arrow", _schema(by_id))
                    writers[part].write_batch(ordered.slice(start, end - start))
    finally:
        for writer in writers.values():
            writer.close()


def _read_spill(path: Path, by_id: bool) -> pa.Table:
    if not path.exists():
        return _schema(by_id).empty_table()
    with pa.memory_map(str(path)) as source:
        return pa.ipc.open_file(source).read_all()


def _whole(store: Store, side: _Side, by_id: bool) -> pa.Table:
    return pa.Table.from_batches(list(_kept_batches(store, side, by_id)), _schema(by_id))


def _file_tables(store: Store, a: _Side, b: _Side, by_id: bool, memory_rows: int,
                 work_dir: Path) -> Iterator[tuple[pa.Table, pa.Table]]:
    """The file's kept documents of both snapshots, whole or one key-hash partition at a time."""
    parts = min(MAX_PARTITIONS, max(1, math.ceil((a.documents + b.documents) / max(1, memory_rows))))
    if parts == 1:
        yield _whole(store, a, by_id), _whole(store, b, by_id)
        return
    folders = [work_dir / f"spill-{name}" for name in SIDES]
    for side, folder in zip((a, b), folders):
        folder.mkdir()
        _spill(store, side, by_id, parts, folder)
    try:
        for part in range(parts):
            yield _read_spill(folders[0] / f"{part}.arrow", by_id), _read_spill(folders[1] / f"{part}.arrow", by_id)
    finally:
        for folder in folders:
            for path in folder.glob("*.arrow"):
                path.unlink()
            folder.rmdir()


def _sorted(table: pa.Table, keys: list[tuple[str, str]]) -> pa.Table:
    """`table` sorted by `keys`, as one chunk per column."""
    return table.take(pc.sort_indices(table, sort_keys=keys)).combine_chunks()


def _same_as_next(keys: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """For each key of a sorted column, whether the next one equals it (False for the last)."""
    column = keys.combine_chunks() if isinstance(keys, pa.ChunkedArray) else keys
    same = np.zeros(len(column), dtype=bool)
    if len(column) > 1:
        same[:-1] = to_numbers(pc.equal(column.slice(0, len(column) - 1), column.slice(1)))
    return same


def _reject_repeated_ids(table: pa.Table, source: str, label: str) -> None:
    """InputError naming the smallest id that repeats in this file, with its first five lines."""
    ordered = _sorted(table, [("key", "ascending"), ("line", "ascending")])
    same = _same_as_next(ordered.column("key"))
    if not same.any():
        return
    first = end = int(np.argmax(same))
    while same[end]:  # the last of the run is followed by another key (or is the last row)
        end += 1
    lines = to_numbers(ordered.column("line").slice(first, end + 1 - first)).tolist()
    doc_id = to_strings(ordered.column("key").slice(first, 1))[0]
    raise InputError(f"{label}: {source}: id {doc_id!r} appears {len(lines)} times (lines "
                     f"{', '.join(map(str, lines[:5]))}); ids must be unique within a file")


def _sides(a: pa.Table, b: pa.Table) -> pa.Table:
    """Both tables in one, with a `side` column (0 for `a`, 1 for `b`), sorted by key then side."""
    tagged = [table.append_column("side", int_column(np.full(table.num_rows, side), pa.int8()))
              for side, table in enumerate((a, b))]
    return _sorted(pa.concat_tables(tagged), [("key", "ascending"), ("side", "ascending")])


def _compare_by_id(a: pa.Table, b: pa.Table, source: str, counts: _Counts) -> None:
    """Pairs of equal ids (each unique within its side) sit next to each other in key order."""
    rows = _sides(a, b)
    paired = _same_as_next(rows.column("key"))
    second = np.roll(paired, 1) if len(paired) else paired
    hashes = hash_pairs(rows.column("text_hash"))
    edited = paired.copy()
    if len(paired):
        edited[:-1] &= (hashes[:-1] != hashes[1:]).any(axis=1)
        edited[-1] = False
    counts.unchanged += int(paired.sum() - edited.sum())
    keys, lines, sides = to_strings(rows.column("key")), to_numbers(rows.column("line")), to_numbers(rows.column("side"))
    def version(at: int) -> DocumentVersion:
        return DocumentVersion(str(keys[at]), int(lines[at]), hashes[at].tobytes().hex())

    for index in map(int, np.flatnonzero(edited | ~(paired | second))):
        if edited[index]:
            counts.emit(DocumentChange("changed", source, version(index), version(index + 1)))
        elif sides[index] == 0:
            counts.emit(DocumentChange("removed", source, version(index), None))
        else:
            counts.emit(DocumentChange("added", source, None, version(index)))


def _copies(table: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The distinct text hashes (16-byte values, sorted), each with its first line and its
    number of copies."""
    hashes = hash_pairs(table.column("key")).copy().view("V16").reshape(-1)
    lines = to_numbers(table.column("line")).astype(np.int64)
    by_line = np.argsort(lines, kind="stable")
    distinct, first, copies = np.unique(hashes[by_line], return_index=True, return_counts=True)
    return distinct, lines[by_line][first], copies


def _on_side(keys: np.ndarray, side: tuple[np.ndarray, np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """For each of `keys`, its copies on `side` (0 if none) and its first line there (-1 if none)."""
    distinct, first_line, copies = side
    if not len(distinct):
        return np.zeros(len(keys), dtype=np.int64), np.full(len(keys), -1, dtype=np.int64)
    at = np.minimum(np.searchsorted(distinct, keys), len(distinct) - 1)
    present = distinct[at] == keys
    return np.where(present, copies[at], 0), np.where(present, first_line[at], -1)


def _compare_by_text(a: pa.Table, b: pa.Table, source: str, counts: _Counts) -> None:
    """Copies of each text counted on both sides: more in `b` is added, fewer is removed; the
    changes in order of the text's first line (in `b` when it is there), then of its hash."""
    side_a, side_b = _copies(a), _copies(b)
    keys = np.union1d(side_a[0], side_b[0])
    (count_a, line_a), (count_b, line_b) = _on_side(keys, side_a), _on_side(keys, side_b)
    counts.unchanged += int(np.minimum(count_a, count_b).sum())
    differ = np.flatnonzero(count_a != count_b)
    ordering = np.where(line_b >= 0, line_b, line_a)[differ]
    for index in differ[np.lexsort((differ, ordering))]:  # keys are sorted: the index is the hash's rank
        extra = int(count_b[index] - count_a[index])
        line = int(line_b[index] if extra > 0 else line_a[index])
        version = DocumentVersion(document_id(None, source, line), line, keys[index].tobytes().hex())
        if extra > 0:
            counts.emit(DocumentChange("added", source, None, version, extra))
        else:
            counts.emit(DocumentChange("removed", source, version, None, -extra))


def _same_documents(a: _Side, b: _Side) -> bool:
    """True when both snapshots provably hold the same documents of this file, without reading it:
    the same file bytes read the same way (same intermediates, or same code and input settings),
    and the same dedup decisions."""
    if not a.tasks or not b.tasks or a.tasks[0].sha256 != b.tasks[0].sha256 or a.documents != b.documents:
        return False
    same_rows = [t.output for t in a.tasks] == [t.output for t in b.tasks]
    if not same_rows:
        manifests = a.records.snapshot.manifest, b.records.snapshot.manifest
        same_rows = (manifests[0]["code"]["sha256"] == manifests[1]["code"]["sha256"]
                     and manifests[0]["config"].get("input") == manifests[1]["config"].get("input")
                     and [t.format for t in a.tasks] == [t.format for t in b.tasks])
    if not same_rows:
        return False
    (start_a, end_a), (start_b, _) = a.span, b.span
    step = SCAN_BYTES * 8
    for begin in range(0, end_a - start_a, step):
        length = min(step, end_a - start_a - begin)
        if not np.array_equal(a.keep.slice(start_a + begin, start_a + begin + length),
                              b.keep.slice(start_b + begin, start_b + begin + length)):
            return False
    return True


def diff_documents(store: Store, a: Snapshot, b: Snapshot, work_dir: Path,
                   memory_rows: int = DEFAULT_MEMORY_ROWS, labels: Sequence[str] = SIDES) -> DocumentDiff:
    """Compare the documents of snapshots `a` and `b` file by file; changes go to `work_dir`.

    Raises InputError when an id repeats within one file of either snapshot."""
    records = load_records(store, a), load_records(store, b)
    flags: dict[str, KeepFlags] = {}
    for side in records:
        if side.snapshot.id not in flags:
            flags[side.snapshot.id] = keep_flags(store, side, work_dir, memory_rows)
    keeps = tuple(flags[side.snapshot.id] for side in records)
    by_id = all(r.id_field is not None for r in records)
    compare = _compare_by_id if by_id else _compare_by_text
    counts = _Counts()
    files = {source: tuple(_Side(r, keep, r.tasks_of(source), label) for r, keep, label in zip(records, keeps, labels))
             for source in sorted(set(records[0].sources()) | set(records[1].sources()))}
    skipped = {source for source, (side_a, side_b) in files.items() if _same_documents(side_a, side_b)}
    prove_intermediates(store, [task for source, sides in files.items() if source not in skipped
                                for side in sides for task in side.tasks])
    path = work_dir / CHANGES_FILE
    with open(path, "w", encoding="utf-8") as out:
        counts.out = out
        for source, (side_a, side_b) in files.items():
            if source in skipped:
                counts.skipped += 1
                counts.unchanged += side_a.keep.ones_between(*side_a.span)
                continue
            counts.compared += 1
            for table_a, table_b in _file_tables(store, side_a, side_b, by_id, memory_rows, work_dir):
                if by_id:
                    _reject_repeated_ids(table_a, source, side_a.label)
                    _reject_repeated_ids(table_b, source, side_b.label)
                compare(table_a, table_b, source, counts)
    summary = DocumentSummary(KEYED_BY_ID if by_id else KEYED_BY_TEXT, counts.added, counts.removed,
                              counts.changed, counts.unchanged, counts.compared, counts.skipped)
    return DocumentDiff(summary, path)
