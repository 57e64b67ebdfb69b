"""Placements in layout-2 snapshots (shards named by key range).

A document's order key is a keyed permutation of its text hash (prep.workfiles.keys.order_keys),
so its bucket (the key's top `bits` bits) follows from the text alone. The bucket object holds
the bucket's kept entries sorted by (key, part, row): a binary search of it, a few positional
reads, finds the document, or the copy with its key that the order stage kept instead. The
shard whose slices cover that entry holds it, at the entry's index within the shard's slices.
Byte offsets come from the sizes of the entries before it in the shard, read in chunks, so
memory depends on neither the corpus nor the shard. A document in no bucket, with no earlier
copy there, was dropped by near-duplicate removal: the drops object's records of its bucket
name its cluster's kept first document (prep.history.neardrops).
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from prep.config import recorded_metadata_keys
from prep.errors import IntegrityError, NotFoundError, UsageError
from prep.formats import wds
from prep.formats.registry import ArtifactFormat, DocumentSizes
from prep.history.documents import (
    DocumentOrigin,
    SnapshotRecords,
    Trace,
    artifacts_of_shard,
    origin_of_row,
    stage_manifest,
    verified_object,
)
from prep.history.neardrops import NearDrops, number_of, origin_of_number
from prep.history.placing import Named, Needs, document_sizes, needs, placed_kinds, placements
from prep.storage.backend import Store
from prep.workfiles.docnames import document_id, record_line
from prep.workfiles.entries import ENTRY_DTYPE, NO_ID, EntryFile, metadata_spans
from prep.workfiles.keys import bucket_of, order_keys
from prep.workfiles.shardplan import ShardPlan

CHUNK_ENTRIES = 1 << 16
"""Entries read at once when summing the sizes of a shard's documents before a position."""

Probe = tuple[int, int, int, int]
"""(key_hi, key_lo, part, row): the order of a bucket object's entries."""


def order_key(text_hash: str, seed: int) -> tuple[int, int]:
    """The (hi, lo) order key of a text hash given as 32 hex digits."""
    hashes = np.frombuffer(bytes.fromhex(text_hash), dtype="<u8").reshape(1, 2)
    hi, lo = order_keys(hashes, seed)
    return int(hi[0]), int(lo[0])


def _probe(entry: np.void) -> Probe:
    return int(entry["key_hi"]), int(entry["key_lo"]), int(entry["part"]), int(entry["row"])


class BucketReader:
    """Positional reads of single entries from one bucket object (no ids, no whole-object read)."""

    def __init__(self, entries: EntryFile) -> None:
        self.entries = entries
        self.count = int(entries.header["count"])
        self._fd = os.open(entries.path, os.O_RDONLY)

    def __enter__(self) -> BucketReader:
        return self

    def __exit__(self, *_: object) -> None:
        os.close(self._fd)

    def at(self, index: int) -> np.void:
        """Entry `index` of the bucket."""
        raw = os.pread(self._fd, ENTRY_DTYPE.itemsize, self.entries.entries_at + index * ENTRY_DTYPE.itemsize)
        if len(raw) != ENTRY_DTYPE.itemsize:
            raise IntegrityError(f"{self.entries.path}: shorter than its header says")
        entry: np.void = np.frombuffer(raw, dtype=ENTRY_DTYPE)[0]
        return entry

    def lower_bound(self, probe: Probe) -> int:
        """The first index whose entry is not before `probe`."""
        low, high = 0, self.count
        while low < high:
            middle = (low + high) // 2
            if _probe(self.at(middle)) < probe:
                low = middle + 1
            else:
                high = middle
        return low


@dataclass(frozen=True)
class _SliceRef:
    """One slice of a shard, in the global (bucket, first entry) order of all slices."""

    shard: int
    bucket: int
    first: int
    count: int
    before: int  # documents of the shard in its earlier slices


@dataclass(frozen=True)
class KeyedPlacer:
    """Traces and locates documents of a layout-2 snapshot."""

    store: Store
    records: SnapshotRecords
    seed: int
    bits: int
    buckets: tuple[dict[str, Any], ...]
    shards: dict[int, ShardPlan]
    slices: tuple[_SliceRef, ...]
    starts: tuple[tuple[int, int], ...]  # (bucket, first) of each of `slices`
    near: NearDrops | None = None  # with [dedup.near]: the drops of near-duplicate removal

    @classmethod
    def load(cls, store: Store, records: SnapshotRecords) -> KeyedPlacer:
        """Read the order and shard stage manifests (no bucket object is read)."""
        snapshot = records.snapshot
        ordered = stage_manifest(store, snapshot, "order")
        bits, buckets = int(ordered["bits"]), tuple(ordered["buckets"])
        if [int(bucket["bucket"]) for bucket in buckets] != list(range(1 << bits)):
            raise IntegrityError(f"snapshot {snapshot.id[:19]}: its order stage does not list buckets 0..{(1 << bits) - 1}")
        shards = {plan.index: plan for plan in map(ShardPlan.from_json, stage_manifest(store, snapshot, "shard")["shards"])}
        slices = []
        for plan in shards.values():
            before = 0
            for bucket, first, count in plan.slices:
                slices.append(_SliceRef(plan.index, bucket, first, count, before))
                before += count
        slices.sort(key=lambda ref: (ref.bucket, ref.first))
        return cls(store, records, int(snapshot.manifest["seed"]), bits, buckets, shards, tuple(slices),
                   tuple((ref.bucket, ref.first) for ref in slices), NearDrops.load(store, records))

    def _bucket(self, bucket: int) -> EntryFile:
        recorded = self.buckets[bucket]
        entries = EntryFile.open(verified_object(self.store, recorded["output"], f"the order bucket object of bucket {bucket}"))
        header = entries.header
        if header.get("kind") != "bucket" or header.get("bucket") != bucket or header["count"] != int(recorded["documents"]):
            raise IntegrityError(f"{recorded['output']}: not the bucket object of bucket {bucket} "
                                 f"({recorded['documents']} documents)")
        return entries

    def _entry(self, bucket: int, index: int) -> np.void:
        with BucketReader(self._bucket(bucket)) as reader:
            if not 0 <= index < reader.count:
                raise IntegrityError(f"bucket {bucket} has {reader.count} entries, a shard names entry {index}")
            return reader.at(index)

    def trace_origin(self, origin: DocumentOrigin) -> Trace:
        """Where `origin` went: its shard placements, the trace of the copy kept instead, or the
        near duplicate kept instead."""
        hi, lo = order_key(origin.text_hash, self.seed)
        bucket = int(bucket_of(np.array([hi], dtype=np.uint64), self.bits)[0])
        with BucketReader(self._bucket(bucket)) as reader:
            index = reader.lower_bound((hi, lo, origin.part, origin.row))
            first = reader.lower_bound((hi, lo, 0, 0))
            if index < reader.count and _probe(reader.at(index)) == (hi, lo, origin.part, origin.row):
                return self._kept(origin, (hi, lo), bucket, index, first)
            kept = reader.at(first) if first < reader.count else None
        if kept is None or _probe(kept)[:2] != (hi, lo) or _probe(kept)[2:] > (origin.part, origin.row):
            return self._near_dropped(origin, hi, bucket)
        copy = origin_of_row(self.store, self.records, int(kept["part"]), int(kept["row"]))
        return Trace(origin, None, (), self.trace_origin(copy))

    def _near_dropped(self, origin: DocumentOrigin, hi: int, bucket: int) -> Trace:
        """The trace of a document in no bucket: near-duplicate removal dropped it, or the earlier
        copy of its text that exact dedup kept before dropping it too (whose trace follows); the
        drops of the document's order bucket say which (one read of the drops object)."""
        number = number_of(origin)
        lost = f"snapshot {self.records.snapshot.id[:19]}: document {origin.id!r} is not in bucket {bucket}, " \
            "and no earlier copy of its text is"
        if self.near is None:
            raise IntegrityError(lost)
        drops = self.near.in_bucket(bucket, self.bits)
        mine = drops[drops["document"] == number]
        if len(mine) != 1:
            raise IntegrityError(f"{lost}, nor do the drops of near-duplicate removal name it")
        for earlier in drops["document"][(drops["key_hi"] == hi) & (drops["document"] < number)].tolist():
            copy = origin_of_number(self.store, self.records, int(earlier))
            if copy.text_hash == origin.text_hash:
                return Trace(origin, None, (), self.trace_origin(copy))
        representative = int(mine["representative"][0])
        if not representative < number:
            raise IntegrityError(f"snapshot {self.records.snapshot.id[:19]}: the near-duplicate drop of "
                                 f"{origin.id!r} names a representative that is not an earlier document")
        kept = self.trace_origin(origin_of_number(self.store, self.records, representative))
        if kept.position is None:
            raise IntegrityError(f"snapshot {self.records.snapshot.id[:19]}: {origin.id!r} was dropped as a near "
                                 f"duplicate of {kept.document.id!r}, which the snapshot does not hold")
        return Trace(origin, None, (), near_duplicate_of=self.near.near_duplicate(origin, kept))

    def _slice_of(self, bucket: int, index: int) -> _SliceRef:
        """The shard slice holding entry `index` of `bucket`."""
        at = bisect.bisect_right(self.starts, (bucket, index)) - 1
        ref = self.slices[at] if at >= 0 else None
        if ref is None or ref.bucket != bucket or index >= ref.first + ref.count:
            raise IntegrityError(f"snapshot {self.records.snapshot.id[:19]}: no shard holds entry {index} "
                                 f"of bucket {bucket}")
        return ref

    def _covering(self, bucket: int, index: int) -> tuple[ShardPlan, int]:
        """The shard holding entry `index` of `bucket`, and the entry's sequence within it."""
        ref = self._slice_of(bucket, index)
        return self.shards[ref.shard], ref.before + index - ref.first

    def _kept(self, origin: DocumentOrigin, key: tuple[int, int], bucket: int, index: int, first: int) -> Trace:
        """The placements of kept entry `index`; `first` is the bucket's first entry with its key
        (with dedup off, its copy number within its shard is how far after the key's first there)."""
        plan, sequence = self._covering(bucket, index)
        copy = index - max(first, self._slice_of(bucket, index).first)
        artifacts = artifacts_of_shard(self.records.snapshot, plan.index)
        kinds = placed_kinds(artifacts)
        need = needs(kinds, self.with_metadata)
        offsets = self._offsets(plan, sequence, kinds, need)
        found = placements(artifacts, plan.index, sequence, offsets, self._sizes(*self._bucket(bucket).read(index, 1), need))
        return Trace(origin, sequence, found, order_key=wds.order_key_name(*key), copy=copy)

    @property
    def dtype(self) -> np.dtype[Any]:
        """The snapshot's token dtype."""
        return np.dtype(str(self.records.snapshot.manifest["tokenizer"]["dtype"]))

    @property
    def with_metadata(self) -> bool:
        """Whether the build had metadata fields (its `.json` members and MDS samples carry metadata)."""
        return bool(recorded_metadata_keys(self.records.snapshot.manifest["config"]))

    def _entries_before(self, plan: ShardPlan, sequence: int) -> Iterator[tuple[np.ndarray, bytes]]:
        """The shard's first `sequence` entries (and their ids), in chunks of CHUNK_ENTRIES."""
        left = sequence
        for bucket, first, count in plan.slices:
            if left <= 0:
                return
            entries = self._bucket(bucket)
            for start in range(first, first + min(count, left), CHUNK_ENTRIES):
                yield entries.read(start, min(CHUNK_ENTRIES, first + min(count, left) - start))
            left -= count

    def _offsets(self, plan: ShardPlan, sequence: int, kinds: list[ArtifactFormat], need: Needs) -> dict[str, int]:
        """Where sequence `sequence` of `plan` starts in each artifact kind of `kinds`."""
        offsets = {kind.name: kind.head(plan.documents, self.dtype, need.metadata) for kind in kinds}
        for entries, ids in self._entries_before(plan, sequence):
            sizes = self._sizes(entries, ids, need)
            for kind in kinds:
                assert kind.spans is not None
                offsets[kind.name] += int(kind.spans(sizes).sum())
        return offsets

    def _sizes(self, entries: np.ndarray, ids: bytes, need: Needs) -> DocumentSizes:
        """The sizes of these entries' documents in the shard's artifacts."""
        named = list(self._documents(entries, ids, need.metadata)) if need.json or need.ids else []
        return document_sizes(entries["n_tokens"].astype(np.int64) + 1, entries["text_bytes"], named, self.dtype, need)

    def _documents(self, entries: np.ndarray, ids: bytes, with_metadata: bool) -> Iterator[Named]:
        """Each entry's document as its `.json` member and MDS sample name it (its metadata too
        `with_metadata`: after its id in the ids blob)."""
        view = memoryview(ids)
        starts, lengths = metadata_spans(entries)
        for part, row, id_offset, id_len, tokens, start, length in zip(
                entries["part"].tolist(), entries["row"].tolist(), entries["id_offset"].tolist(),
                entries["id_len"].tolist(), entries["n_tokens"].tolist(), starts.tolist(), lengths.tolist()):
            task = self.records.tasks[part]
            line = record_line(task.format, task.line_offset, row)
            doc_id = None if id_len == NO_ID else bytes(view[id_offset:id_offset + id_len]).decode("utf-8", "surrogatepass")
            metadata = bytes(view[start:start + length]) if with_metadata else None
            yield Named(document_id(doc_id, task.source, line), task.source, line, tokens + 1, metadata)

    def locate(self, artifact: dict[str, Any], sequence: int) -> Trace:
        """The document stored as sequence `sequence` of `artifact`'s shard."""
        plan = self.shards[int(artifact["shard"])]
        if not 0 <= sequence < plan.documents:
            raise UsageError(f"{artifact['path']} holds {plan.documents} sequences (0..{plan.documents - 1}); "
                             f"got {sequence}")
        before = 0
        for bucket, first, count in plan.slices:
            if sequence < before + count:
                entry = self._entry(bucket, first + sequence - before)
                break
            before += count
        else:
            raise IntegrityError(f"shard {plan.name}: its slices hold fewer than {plan.documents} documents")
        traced = self.trace_origin(origin_of_row(self.store, self.records, int(entry["part"]), int(entry["row"])))
        if traced.position != sequence or any(place.shard != plan.index for place in traced.placements):
            raise IntegrityError(f"snapshot {self.records.snapshot.id[:19]}: sequence {sequence} of shard {plan.name} "
                                 "traces back to another place")
        return traced

    def locate_key(self, key: str) -> Trace:
        """The document whose sample key is `key` (32 hex digits): its order key, plus its copy
        number within its shard when dedup was off. A binary search of the key's bucket finds the
        last order key not after it; the shard is the one whose slices cover the entry."""
        hi, lo = int(key[:16], 16), int(key[16:], 16)
        bucket = int(bucket_of(np.array([hi], dtype=np.uint64), self.bits)[0])
        with BucketReader(self._bucket(bucket)) as reader:
            below = reader.lower_bound((hi, lo, 1 << 64, 0)) - 1  # the last entry whose key is not after `key`
            probe = _probe(reader.at(below)) if below >= 0 else None
            if probe is None or probe[0] != hi:
                raise NotFoundError(f"snapshot {self.records.snapshot.id[:19]} has no document with sample key {key}")
            first = reader.lower_bound((hi, probe[1], 0, 0))
            index = self._copy_index(bucket, first, below + 1, lo - probe[1])
            if index is None:
                raise NotFoundError(f"snapshot {self.records.snapshot.id[:19]} has no document with sample key {key}")
            entry = reader.at(index)
        traced = self.trace_origin(origin_of_row(self.store, self.records, int(entry["part"]), int(entry["row"])))
        if traced.sample_key != key:
            raise IntegrityError(f"snapshot {self.records.snapshot.id[:19]}: the entry of sample key {key} traces "
                                 f"to sample key {traced.sample_key}")
        return traced

    def _copy_index(self, bucket: int, first: int, end: int, copy: int) -> int | None:
        """The entry among `first..end` (one order key's entries) that is copy `copy` in its shard."""
        index = first
        while index < end:
            ref = self._slice_of(bucket, index)
            target = max(first, ref.first) + copy
            if target < min(end, ref.first + ref.count):
                return target
            index = ref.first + ref.count
        return None
