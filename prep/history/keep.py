"""Which input documents a snapshot kept, as keep flags indexed by input index.

Layout 1 recorded them: the dedup keep mask, memory-mapped. Layout 2 recorded only the kept
entries of each key bucket, so the flags are computed again with the rule the order stage
applies (keep the first occurrence of each text hash in input order) and written as a keep mask
into a work folder: the text hashes of the documents in buckets that dropped any are
hash-partitioned into spill files (duplicates share a hash, so they share a partition), and
each partition is decided on its own, so memory holds about `memory_rows` hashes at a time.
With near-duplicate removal, the documents its drops object names are cleared too (spilled by
part, so memory holds one part's).
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from prep.errors import IntegrityError
from prep.history.documents import (
    LAYOUT_POSITIONAL,
    SnapshotRecords,
    prove_intermediates,
    stage_manifest,
    task_batches,
    verified_object,
)
from prep.history.neardrops import NearDrops
from prep.storage.backend import Store
from prep.workfiles.intermediate import hash_pairs
from prep.workfiles.keepmask import MASK_COUNT_DTYPE, MASK_HEADER_BYTES, keep_mask, mask_bytes_for, mask_count, unpack_flags
from prep.workfiles.keys import bucket_of, order_keys

SCAN_BYTES = 1 << 22
MAX_PARTITIONS = 512
_SPILL_DTYPE = np.dtype([("hi", "<u8"), ("lo", "<u8"), ("index", "<i8")])


class KeepFlags(Protocol):
    """Keep flags of a snapshot's documents by input index."""

    count: int

    def slice(self, start: int, end: int) -> np.ndarray:
        """The keep flags of documents [start, end) as booleans."""
        ...

    def ones_between(self, start: int, end: int) -> int:
        """How many documents in [start, end) are kept."""
        ...


class AllKept:
    """Keep flags of a snapshot that dropped nothing."""

    def __init__(self, count: int) -> None:
        self.count = count

    def slice(self, start: int, end: int) -> np.ndarray:
        """The keep flags of documents [start, end): all true."""
        return np.ones(max(0, min(end, self.count) - start), dtype=bool)

    def ones_between(self, start: int, end: int) -> int:
        """How many documents in [start, end) are kept: all."""
        return max(0, min(end, self.count) - start)


class PackedMask:
    """A keep mask (layout: prep.workfiles.keepmask), memory-mapped: flag i keeps document i."""

    def __init__(self, path: Path) -> None:
        self.path = path
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
        """How many documents in [start, end) are kept."""
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


def recorded_mask(store: Store, records: SnapshotRecords) -> PackedMask:
    """The keep mask a layout-1 snapshot's dedup stage recorded, checked against its tokenize records."""
    mask_id = stage_manifest(store, records.snapshot, "dedup")["outputs"]["keep"]
    keep = PackedMask(verified_object(store, mask_id, f"the dedup keep mask of snapshot {records.snapshot.id[:19]}"))
    if keep.count != records.documents:
        raise IntegrityError(f"snapshot {records.snapshot.id}: keep mask covers {keep.count} documents, "
                             f"tokenize recorded {records.documents}")
    return keep


def keep_flags(store: Store, records: SnapshotRecords, work_dir: Path, memory_rows: int) -> KeepFlags:
    """The snapshot's keep flags: recorded (layout 1), or computed into `work_dir` (keyed layouts 2
    and 3: exact dedup's rule applied again, then near-duplicate removal's drops cleared)."""
    if records.layout == LAYOUT_POSITIONAL:
        return recorded_mask(store, records)
    ordered = stage_manifest(store, records.snapshot, "order")
    buckets = ordered["buckets"]
    near = NearDrops.load(store, records)
    if sum(int(bucket["duplicates_dropped"]) for bucket in buckets) == 0 and near is None:
        return AllKept(records.documents)
    folder = Path(tempfile.mkdtemp(prefix=f"keep-{records.snapshot.id.removeprefix('sha256:')[:12]}-", dir=work_dir))
    mask = _exact_mask(store, records, ordered, folder, memory_rows)
    if near is None:
        return mask
    expected = sum(int(bucket.get("near_duplicates_dropped", 0)) for bucket in buckets)
    cleared = clear_near_drops(records, near, mask.path, folder)
    if cleared != expected:
        raise IntegrityError(f"snapshot {records.snapshot.id[:19]}: its order stage dropped {expected} near "
                             f"duplicates, its drops object names {cleared} documents exact dedup kept")
    return PackedMask(mask.path)


def _exact_mask(store: Store, records: SnapshotRecords, ordered: dict[str, Any], folder: Path,
                memory_rows: int) -> PackedMask:
    """The keep mask of exact dedup's rule (the order stage manifest `ordered` counts what it
    dropped), written into `folder`; all kept when it dropped none."""
    buckets = ordered["buckets"]
    dropped = sum(int(bucket["duplicates_dropped"]) for bucket in buckets)
    affected = np.array([int(bucket["duplicates_dropped"]) > 0 for bucket in buckets], dtype=bool)
    candidates = sum(int(bucket["documents_read"]) for bucket in buckets if int(bucket["duplicates_dropped"]))
    parts = min(MAX_PARTITIONS, max(1, math.ceil(candidates / max(1, memory_rows))))
    prove_intermediates(store, records.tasks)  # all of them are read: prove them in parallel first
    chunks = _candidates(store, records, int(records.snapshot.manifest["seed"]), int(ordered["bits"]), affected) \
        if dropped else iter(())
    mask, found = first_occurrence_mask(chunks, records.documents, parts, folder)
    if found != dropped:
        raise IntegrityError(f"snapshot {records.snapshot.id[:19]}: its order stage dropped {dropped} duplicates, "
                             f"the first-occurrence rule over its tokenize records drops {found}")
    return mask


def clear_near_drops(records: SnapshotRecords, near: NearDrops, path: Path, folder: Path) -> int:
    """Clear the keep flags (the mask at `path`) of every document the drops object names;
    returns how many were set (a drop exact dedup made already is not counted again, as the
    order stage counts). The drops' numbers are spilled into `folder` by part, then each part's
    rows are read once to turn its drops' rows into input indexes: memory holds one part's."""
    if records.documents == 0:
        return 0
    parts = min(MAX_PARTITIONS, len(records.tasks))
    spills = [folder / f"near-{part}.spill" for part in range(parts)]
    handles = [open(spill, "wb") for spill in spills]
    try:
        for chunk in near.chunks():
            numbers = chunk["document"].astype("<u8")
            partition = ((numbers >> np.uint64(32)) % np.uint64(parts)).astype(np.int64)
            for part in np.unique(partition).tolist():
                handles[part].write(numbers[partition == part].tobytes())
    finally:
        for handle in handles:
            handle.close()
    bits = np.memmap(path, dtype=np.uint8, mode="r+", offset=MASK_HEADER_BYTES, shape=(mask_bytes_for(records.documents),))
    try:
        return sum(_clear(bits, _near_indexes(near, records, np.unique(np.fromfile(spill, dtype="<u8"))))
                   for spill in spills)
    finally:
        bits.flush()
        del bits
        for spill in spills:
            spill.unlink(missing_ok=True)


def _near_indexes(near: NearDrops, records: SnapshotRecords, numbers: np.ndarray) -> np.ndarray:
    """The input indexes of documents with these sorted global numbers (their parts' rows read)."""
    found = []
    for ordinal in np.unique(numbers >> np.uint64(32)).tolist():
        if ordinal >= len(records.tasks):
            raise IntegrityError(f"drops object {near.object_id} names part {ordinal}, the snapshot has "
                                 f"{len(records.tasks)}")
        task = records.tasks[ordinal]
        rows = np.concatenate([batch.column("row").to_numpy() for batch in task_batches(near.store, task, ["row"])]
                              or [np.zeros(0, dtype=np.int64)])
        wanted = (numbers[(numbers >> np.uint64(32)) == ordinal] & np.uint64(0xFFFFFFFF)).astype(np.int64)
        at = np.searchsorted(rows, wanted)
        if bool((np.diff(rows) <= 0).any()) or bool((at >= len(rows)).any()) or bool((rows[at] != wanted).any()):
            raise IntegrityError(f"drops object {near.object_id} names rows of {task.source} its intermediate "
                                 "does not hold")
        found.append(task.first + at)
    return np.concatenate(found or [np.zeros(0, dtype=np.int64)])


def _clear(bits: np.ndarray, indexes: np.ndarray) -> int:
    """Clear the keep flags of distinct `indexes`; returns how many were set."""
    masks = np.uint8(0x80) >> (indexes & 7).astype(np.uint8)
    were = int(np.count_nonzero(bits[indexes >> 3] & masks))
    np.bitwise_and.at(bits, indexes >> 3, ~masks)
    return were


HashChunks = Iterable[tuple[np.ndarray, np.ndarray]]
"""Chunks of documents: their (n, 2) text hashes and their input indexes (increasing)."""


def _candidates(store: Store, records: SnapshotRecords, seed: int, bits: int, affected: np.ndarray) -> HashChunks:
    """The text hashes and input indexes of the documents routed to an affected bucket."""
    for task in records.tasks:
        index = task.first
        for batch in task_batches(store, task, ["text_hash"]):
            hashes = hash_pairs(batch.column("text_hash"))
            chosen = affected[bucket_of(order_keys(hashes, seed)[0], bits)]
            yield hashes[chosen], np.arange(index, index + len(hashes), dtype=np.int64)[chosen]
            index += len(hashes)


def first_occurrence_mask(chunks: HashChunks, count: int, parts: int, folder: Path) -> tuple[PackedMask, int]:
    """Write `folder`/keep.mask for `count` documents: all kept but those of `chunks` whose text
    hash an earlier one of `chunks` has. Spills `parts` hash partitions into `folder` on the
    way, so memory holds one partition. Returns the mask and how many documents it drops."""
    spills = [folder / f"{part}.spill" for part in range(parts)]
    path = folder / "keep.mask"
    try:
        _spill(chunks, spills)
        dropped = _write_mask(path, count, spills)
    finally:
        for spill in spills:
            spill.unlink(missing_ok=True)
    return PackedMask(path), dropped


def _spill(chunks: HashChunks, spills: list[Path]) -> None:
    """Append each document's (text hash, input index) to the spill file of its hash's partition."""
    handles = [open(path, "wb") for path in spills]
    try:
        for hashes, indexes in chunks:
            spilled = np.zeros(len(indexes), dtype=_SPILL_DTYPE)
            spilled["hi"], spilled["lo"], spilled["index"] = hashes[:, 0], hashes[:, 1], indexes
            partition = (spilled["lo"] % np.uint64(len(spills))).astype(np.int64)
            for part in np.unique(partition).tolist():
                handles[part].write(spilled[partition == part].tobytes())
    finally:
        for handle in handles:
            handle.close()


def _write_mask(path: Path, count: int, spills: list[Path]) -> int:
    """Write a keep mask of `count` documents, all kept but the repeats found in `spills`; returns
    how many were dropped."""
    with open(path, "wb") as out:
        out.write(np.array([count], dtype=MASK_COUNT_DTYPE).tobytes())
        full, rest = divmod(count, 8)
        for begin in range(0, full, SCAN_BYTES):
            out.write(b"\xff" * (min(full, begin + SCAN_BYTES) - begin))
        if rest:
            out.write(bytes([(0xFF << (8 - rest)) & 0xFF]))
    if count == 0:
        return 0
    dropped = 0
    bits = np.memmap(path, dtype=np.uint8, mode="r+", offset=MASK_HEADER_BYTES, shape=(mask_bytes_for(count),))
    for spill in spills:
        entries = np.fromfile(spill, dtype=_SPILL_DTYPE)
        if len(entries) < 2:
            continue
        entries = entries[np.argsort(entries["index"], kind="stable")]  # input order: the rule's tie-break
        indexes = entries["index"][~keep_mask([np.stack([entries["hi"], entries["lo"]], axis=1)], exact=True)]
        dropped += _clear(bits, indexes)
    bits.flush()
    del bits
    return dropped
