"""Which input documents a snapshot kept, as keep flags indexed by input index.

Layout 1 recorded them: the dedup keep mask, memory-mapped. Layout 2 recorded only the kept
entries of each key bucket, so the flags are computed again with the rule the order stage
applies (keep the first occurrence of each text hash in input order) and written as a keep mask
into a work folder: the text hashes of the documents in buckets that dropped any are
hash-partitioned into spill files (duplicates share a hash, so they share a partition), and
each partition is decided on its own, so memory holds about `memory_rows` hashes at a time.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

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
    """The snapshot's keep flags: recorded (layout 1), or computed into `work_dir` (keyed layouts 2 and 3)."""
    if records.layout == LAYOUT_POSITIONAL:
        return recorded_mask(store, records)
    ordered = stage_manifest(store, records.snapshot, "order")
    buckets = ordered["buckets"]
    dropped = sum(int(bucket["duplicates_dropped"]) for bucket in buckets)
    if dropped == 0:
        return AllKept(records.documents)
    bits = int(ordered["bits"])
    affected = np.array([int(bucket["duplicates_dropped"]) > 0 for bucket in buckets], dtype=bool)
    candidates = sum(int(bucket["documents_read"]) for bucket in buckets if int(bucket["duplicates_dropped"]))
    parts = min(MAX_PARTITIONS, max(1, math.ceil(candidates / max(1, memory_rows))))
    folder = Path(tempfile.mkdtemp(prefix=f"keep-{records.snapshot.id.removeprefix('sha256:')[:12]}-", dir=work_dir))
    prove_intermediates(store, records.tasks)  # all of them are read: prove them in parallel first
    chunks = _candidates(store, records, int(records.snapshot.manifest["seed"]), bits, affected)
    mask, found = first_occurrence_mask(chunks, records.documents, parts, folder)
    if found != dropped:
        raise IntegrityError(f"snapshot {records.snapshot.id[:19]}: its order stage dropped {dropped} duplicates, "
                             f"the first-occurrence rule over its tokenize records drops {found}")
    return mask


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
        np.bitwise_and.at(bits, indexes >> 3, ~(np.uint8(0x80) >> (indexes & 7).astype(np.uint8)))
        dropped += len(indexes)
    bits.flush()
    del bits
    return dropped
