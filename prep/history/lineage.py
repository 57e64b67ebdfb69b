"""Lineage: where each document of a snapshot came from, and where it went.

Everything is read from what the stages recorded, streamed, memory-mapped or read by position,
so lookups work on corpora far larger than memory. Documents are found through the tokenize
records (prep.history.documents); where a kept document sits depends on the snapshot's layout:
layout 1 (keep mask and shuffle plan, prep.history.placement_v1) or keyed layouts 2 and 3 (bucket objects and
key-range shards, prep.history.placement_v2).
"""

from __future__ import annotations

from typing import Any, Protocol

from prep.errors import NotFoundError, UsageError
from prep.formats import wds
from prep.history.documents import (
    LAYOUT_POSITIONAL,
    DocumentOrigin,
    Placement,
    SnapshotRecords,
    Trace,
    find_documents,
    load_records,
)
from prep.history.keep import PackedMask
from prep.history.naming import AT_EXAMPLES, KEY_HEX_DIGITS
from prep.history.placement_v1 import PositionalPlacer
from prep.history.placement_v2 import KeyedPlacer
from prep.history.selectors import is_decimal
from prep.storage.backend import Store
from prep.store.snapshots import Snapshot
from prep.workfiles.keepmask import MASK_HEADER_BYTES, mask_bytes_for, mask_count, unpack_flags

__all__ = ["AT_EXAMPLES", "DocumentOrigin", "Placement", "Placer", "Trace", "locate", "locate_at", "locate_key",
           "parse_at", "placer_for", "trace",
           # the memory-mapped keep-mask reader (prep.history.keep) and the one mask definition it reads by
           "MASK_HEADER_BYTES", "PackedMask", "mask_bytes_for", "mask_count", "unpack_flags"]

class Placer(Protocol):
    """Where a snapshot's documents went, for one layout."""

    @property
    def records(self) -> SnapshotRecords:
        """The snapshot's tokenize records."""
        ...

    def trace_origin(self, origin: DocumentOrigin) -> Trace:
        """Where `origin` went: its placements, or the trace of the copy kept instead."""
        ...

    def locate(self, artifact: dict[str, Any], sequence: int) -> Trace:
        """The document stored as sequence `sequence` of `artifact`'s shard."""
        ...

    def locate_key(self, key: str) -> Trace:
        """The document whose WebDataset sample key is `key` (NotFoundError when none is)."""
        ...


def placer_for(store: Store, snapshot: Snapshot) -> Placer:
    """The placer of `snapshot`'s layout, with its small records loaded."""
    records = load_records(store, snapshot)
    if records.layout == LAYOUT_POSITIONAL:
        return PositionalPlacer.load(store, records)
    return KeyedPlacer.load(store, records)


def trace(store: Store, snapshot: Snapshot, spec: str) -> list[Trace]:
    """Traces of every document `spec` names (several when an id repeats within its file)."""
    placer = placer_for(store, snapshot)
    return [placer.trace_origin(origin) for origin in find_documents(store, placer.records, spec)]


def is_sample_key(spec: str) -> bool:
    """True for a WebDataset sample key: 32 hex digits (keyed layouts) or 10 decimal digits (layout 1)."""
    return len(spec) in (KEY_HEX_DIGITS, wds.KEYDECIMAL_WIDTH) and all(c in "0123456789abcdef" for c in spec) \
        and (len(spec) == KEY_HEX_DIGITS or spec.isdigit())


def parse_at(spec: str) -> tuple[str, int]:
    """`bin/3a00000000000000.bin:17` -> ("bin/3a00000000000000.bin", 17); any artifact path."""
    path, _, number = spec.rpartition(":")
    if not path or not is_decimal(number):
        raise UsageError(f"--at {spec!r}: expected a WebDataset sample key (32 hex digits; 10 decimal digits in "
                         f"older snapshots) or ARTIFACT_PATH:N, e.g. {AT_EXAMPLES}")
    return path, int(number)


def locate(store: Store, snapshot: Snapshot, path: str, sequence: int) -> Trace:
    """The document stored as sequence `sequence` (0-based) of the shard artifact at `path`."""
    artifact = next((a for a in snapshot.artifacts if a["path"] == path), None)
    if artifact is None:
        paths = ", ".join(a["path"] for a in snapshot.artifacts[:3])
        raise NotFoundError(f"snapshot {snapshot.id[:19]} has no artifact {path!r} (artifacts are like {paths})")
    return placer_for(store, snapshot).locate(artifact, sequence)


def locate_key(store: Store, snapshot: Snapshot, key: str) -> Trace:
    """The document whose WebDataset sample key is `key`: its order key (keyed layouts; the shard is
    the one whose key range holds it) or its 10-digit global position (layout 1)."""
    placer = placer_for(store, snapshot)
    expected = wds.KEYDECIMAL_WIDTH if placer.records.layout == LAYOUT_POSITIONAL else KEY_HEX_DIGITS
    if len(key) != expected:
        raise UsageError(f"--at {key!r}: the sample keys of snapshot {snapshot.id[:19]} are {expected} "
                         + ("decimal digits (its shards are named by position)" if expected != KEY_HEX_DIGITS
                            else "hex digits (its shards are named by key range)"))
    return placer.locate_key(key.lower())


def locate_at(store: Store, snapshot: Snapshot, spec: str) -> Trace:
    """The document `--at SPEC` names: a WebDataset sample key, or ARTIFACT_PATH:N."""
    if is_sample_key(spec.lower()):
        return locate_key(store, snapshot, spec)
    return locate(store, snapshot, *parse_at(spec))
