"""Placements in layout-1 snapshots (shards named by position): the dedup keep mask says which
documents were kept, the shuffle plan (one row per kept document, in input order: shard, global
position, byte offsets) where each went. Both are memory-mapped: a document's plan row is the
number of kept documents before it (a popcount), and the reverse is a scan of the plan for the
position followed by a select in the mask.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from prep.errors import IntegrityError, NotFoundError, UsageError
from prep.history.documents import (
    DocumentOrigin,
    Placement,
    SnapshotRecords,
    Trace,
    artifacts_of_shard,
    column_is,
    origin_at,
    scan,
    stage_manifest,
    verified_object,
)
from prep.history.keep import PackedMask, recorded_mask
from prep.history.placing import needs, origin_sizes, placed_kinds, placements
from prep.storage.backend import Store
from prep.workfiles.columns import scalar_of
from prep.workfiles.shardplan import ShardSpec

SCAN_ROWS = 1 << 20


@dataclass(frozen=True)
class PositionalPlacer:
    """Traces and locates documents of a layout-1 snapshot."""

    store: Store
    records: SnapshotRecords
    keep: PackedMask
    plan_id: str
    shards: tuple[ShardSpec, ...]

    @classmethod
    def load(cls, store: Store, records: SnapshotRecords) -> PositionalPlacer:
        """Open the keep mask and read the shuffle manifest (its shard specs; the plan stays unread)."""
        keep = recorded_mask(store, records)
        shuffle = stage_manifest(store, records.snapshot, "shuffle")
        shards = tuple(ShardSpec.from_json(spec) for spec in shuffle["shards"])
        return cls(store, records, keep, shuffle["outputs"]["plan"], shards)

    def _plan(self) -> np.ndarray:
        path = verified_object(self.store, self.plan_id, f"the shuffle plan of snapshot {self.records.snapshot.id[:19]}")
        return np.load(path, mmap_mode="r", allow_pickle=False)  # type: ignore[no-any-return]

    def _first_copy(self, origin: DocumentOrigin) -> DocumentOrigin:
        """The kept document with the same text as `origin` (dedup keeps the first in input order)."""
        same_text = column_is("text_hash", scalar_of(bytes.fromhex(origin.text_hash), pa.binary(16)))
        for candidate in scan(self.store, self.records, range(len(self.records.tasks)), same_text):
            if self.keep.slice(candidate.index, candidate.index + 1)[0]:
                return candidate
        raise IntegrityError(f"snapshot {self.records.snapshot.id[:19]}: document {origin.id!r} was dropped, "
                             "but no kept copy exists")

    def trace_origin(self, origin: DocumentOrigin) -> Trace:
        """Where `origin` went: its shard placements, or the trace of the copy dedup kept instead."""
        if not self.keep.slice(origin.index, origin.index + 1)[0]:
            return Trace(origin, None, (), self.trace_origin(self._first_copy(origin)))
        plan_row = self._plan()[self.keep.ones_before(origin.index)]
        return Trace(origin, int(plan_row["pos"]), self._placements(origin, plan_row))

    def _placements(self, origin: DocumentOrigin, plan_row: np.void) -> tuple[Placement, ...]:
        """Each artifact's byte range of `origin`, at the offset the plan recorded for its kind."""
        dtype = np.dtype(self.records.snapshot.manifest["tokenizer"]["dtype"])
        shard, position = int(plan_row["shard"]), int(plan_row["pos"])
        artifacts = artifacts_of_shard(self.records.snapshot, shard)
        kinds = [kind for kind in placed_kinds(artifacts) if kind.layout1_offset in (plan_row.dtype.names or ())]
        offsets = {kind.name: int(plan_row[kind.layout1_offset]) for kind in kinds if kind.layout1_offset}
        one = origin_sizes(origin, dtype, needs(kinds))
        return placements(artifacts, shard, position - self.shards[shard].first_pos, offsets, one)

    def locate(self, artifact: dict[str, Any], sequence: int) -> Trace:
        """The document stored as sequence `sequence` of `artifact`'s shard."""
        spec = self.shards[int(artifact["shard"])]
        if not 0 <= sequence < spec.documents:
            raise UsageError(f"{artifact['path']} holds {spec.documents} sequences (0..{spec.documents - 1}); "
                             f"got {sequence}")
        plan = self._plan()
        target = spec.first_pos + sequence
        for begin in range(0, len(plan), SCAN_ROWS):
            hits = np.flatnonzero(plan["pos"][begin:begin + SCAN_ROWS] == target)
            if len(hits):
                index = self.keep.nth_one(begin + int(hits[0]))
                return self.trace_origin(origin_at(self.store, self.records, index))
        raise IntegrityError(f"snapshot {self.records.snapshot.id[:19]}: no planned document at position {target}")

    def locate_key(self, key: str) -> Trace:
        """The document whose sample key (its global position, 10 decimal digits) is `key`."""
        position = int(key)
        for spec in self.shards:
            if spec.first_pos <= position < spec.first_pos + spec.documents:
                artifact = artifacts_of_shard(self.records.snapshot, spec.index)[0]
                return self.locate(artifact, position - spec.first_pos)
        raise NotFoundError(f"snapshot {self.records.snapshot.id[:19]} has no document with sample key {key}")
