"""Near-duplicate removal read back (issue 42): the drops object a snapshot's near_clusters stage
stored, for `prep trace` (one order bucket of it per lookup) and `prep show --dropped near`
(streamed in its order, a chunk at a time), and how similar a dropped document is to the kept
document it duplicates, computed again from the two texts.

A drops object (prep.workfiles.drops) names documents by global number, `part ordinal << 32 |
row`, sorted by order key high word then number; a record's representative is its cluster's
first document in input order, the one the snapshot keeps. Exact copies reach the clusters too,
so a copy of a document is in the drops object beside it (the order stage counted the copy as an
exact duplicate). The similarity uses the `[dedup.near]` settings the snapshot recorded and the
running Python's Unicode version (a task key records the build's).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prep.errors import ConfigError, IntegrityError, UsageError
from prep.history.content import document_text
from prep.history.documents import (
    DocumentOrigin,
    NearDuplicate,
    Predicate,
    RecordedTask,
    Similarity,
    SnapshotRecords,
    Trace,
    load_records,
    origin_of_row,
    scan,
    stage_manifest,
    verified_object,
)
from prep.neardup.lsh import estimated_similarity, jaccard
from prep.neardup.settings import NearDupSettings, parse_settings
from prep.neardup.signatures import packed, shingle_sets, signatures
from prep.storage.backend import Store
from prep.store.snapshots import Snapshot
from prep.workfiles.drops import open_drops
from prep.workfiles.indexed import IndexedFile

NEAR = "near"
"""`prep show --dropped near`: near-duplicate removal, not a step (a step whose `use` is `near`
is named by its number)."""
NEAR_STAGE = "near_clusters"
CHUNK_DROPS = 1 << 16
"""Drop records read at once when listing (24 bytes each)."""
ROW_BITS = 32
MAX_SPILLS = 512
DROP_PAIR = np.dtype([("document", "<u8"), ("representative", "<u8")])
Array = np.ndarray[Any, Any]


def has_near_dedup(snapshot: Snapshot) -> bool:
    """Whether the snapshot's build ran near-duplicate removal."""
    return any(stage["name"] == NEAR_STAGE for stage in snapshot.manifest["stages"])


def recorded_settings(snapshot: Snapshot) -> NearDupSettings:
    """The `[dedup.near]` settings the snapshot recorded (its threshold as a decimal string)."""
    table = snapshot.manifest["config"].get("dedup", {}).get("near")
    try:
        return parse_settings({**table, "threshold": float(table["threshold"])}, f"snapshot {snapshot.id[:19]}")
    except (ConfigError, KeyError, TypeError, ValueError) as exc:
        raise IntegrityError(f"snapshot {snapshot.id[:19]}: its recorded dedup.near settings are unusable "
                             f"({exc})") from None


def number_of(origin: DocumentOrigin) -> int:
    """The document's global number, as drops objects name it."""
    return origin.part << ROW_BITS | origin.row


def origin_of_number(store: Store, records: SnapshotRecords, number: int) -> DocumentOrigin:
    """The document whose global number is `number`."""
    return origin_of_row(store, records, number >> ROW_BITS, number & ((1 << ROW_BITS) - 1))


def similarity(settings: NearDupSettings, first: bytes, second: bytes) -> Similarity:
    """The MinHash estimate and the exact Jaccard on shingles of two UTF-8 texts, as the build's
    signatures and `verify` compute them."""
    blob, offsets = packed([first, second])
    sigs = signatures(blob, offsets, settings.ngram, settings.permutations, settings.seed)
    sets = shingle_sets(blob, offsets, settings.ngram)
    return Similarity(estimated_similarity(sigs[0], sigs[1]), jaccard(sets[0], sets[1]), settings.threshold,
                      settings.ngram, settings.permutations)


@dataclass(frozen=True)
class NearDrops:
    """A snapshot's drops object (by id: it is proven and opened when first read) and settings."""

    store: Store
    records: SnapshotRecords
    object_id: str
    settings: NearDupSettings

    @classmethod
    def load(cls, store: Store, records: SnapshotRecords) -> NearDrops | None:
        """The snapshot's drops, from its near_clusters stage manifest; None without [dedup.near]."""
        snapshot = records.snapshot
        if not has_near_dedup(snapshot):
            return None
        object_id = stage_manifest(store, snapshot, NEAR_STAGE).get("drops")
        if not isinstance(object_id, str):
            raise IntegrityError(f"snapshot {snapshot.id[:19]}: its {NEAR_STAGE} stage names no drops object")
        return cls(store, records, object_id, recorded_settings(snapshot))

    def _opened(self) -> IndexedFile:
        what = f"the near-duplicate drops object of snapshot {self.records.snapshot.id[:19]}"
        return open_drops(verified_object(self.store, self.object_id, what))

    def in_bucket(self, bucket: int, bits: int) -> Array:
        """The drop records of order bucket `bucket` of `2**bits` (one read)."""
        return self._opened().read_bucket(bucket, bits)

    def chunks(self) -> Iterator[Array]:
        """Every drop record in the object's order, CHUNK_DROPS at a time, checked sorted."""
        drops = self._opened()
        count, last = int(drops.header["count"]), 0
        for first in range(0, count, CHUNK_DROPS):
            chunk = drops.read(first, min(CHUNK_DROPS, count - first))
            keys = np.concatenate([np.array([last], dtype=np.uint64), chunk["key_hi"]])
            if bool((keys[1:] < keys[:-1]).any()):
                raise IntegrityError(f"{drops.path}: its records are out of order")
            last = int(keys[-1])
            yield chunk

    def texts(self, *documents: DocumentOrigin) -> list[bytes]:
        """The documents' texts, read from their intermediates and checked."""
        return [document_text(self.store, self.records, document) for document in documents]

    def near_duplicate(self, origin: DocumentOrigin, kept: Trace) -> NearDuplicate:
        """`origin` as a near duplicate of the kept document `kept` traces, with their similarity."""
        return NearDuplicate(kept, similarity(self.settings, *self.texts(origin, kept.document)))


def no_near_dedup(snapshot: Snapshot, uses: list[str]) -> UsageError:
    """The error of `--dropped near` on a snapshot built without [dedup.near]."""
    step = f" (its step {uses.index(NEAR) + 1} has use {NEAR!r}: name it by its number)" if NEAR in uses else ""
    return UsageError(f"snapshot {snapshot.id[:19]} was built without [dedup.near]: it has no near-duplicate "
                      f"removal to list{step}")


@dataclass(frozen=True)
class NearDropped:
    """One document near-duplicate removal dropped, the kept document it duplicates (its cluster's
    first), their similarity, the earlier copy of its text when it has one (then exact dedup
    removed it first, and the build counted it as an exact duplicate), and, when asked, both texts."""

    document: DocumentOrigin
    kept: DocumentOrigin
    similarity: Similarity
    exact_copy_of: DocumentOrigin | None
    text: str | None = None
    kept_text: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The document as `prep show --dropped near --json` prints it (near-dropped-report-1)."""
        texts = {} if self.text is None else {"text": self.text, "kept_text": self.kept_text}
        return {"document": self.document.to_json(), "kept": self.kept.to_json(), **self.similarity.to_json(),
                "exact_copy_of": None if self.exact_copy_of is None else self.exact_copy_of.to_json(), **texts}


def near_dropped(drops: NearDrops, with_text: bool) -> Iterator[NearDropped]:
    """Every document of the drops object, in its order (by order key), with what it duplicates.
    Copies of one text share an order key, so the earlier copy of a document, when it has one, is
    its representative or a record before it with the same key high word (held for that run only)."""
    run_key, run = -1, dict[str, DocumentOrigin]()
    for chunk in drops.chunks():
        for key_hi, number, representative in zip(chunk["key_hi"].tolist(), chunk["document"].tolist(),
                                                  chunk["representative"].tolist()):
            if not representative < number:
                raise IntegrityError(f"drops object {drops.object_id}: document {number} has representative "
                                     f"{representative}, not an earlier document")
            origin = origin_of_number(drops.store, drops.records, number)
            kept = origin_of_number(drops.store, drops.records, representative)
            if key_hi != run_key:
                run_key, run = key_hi, {}
            copy = kept if kept.text_hash == origin.text_hash else run.get(origin.text_hash)
            run.setdefault(origin.text_hash, origin)
            texts = drops.texts(origin, kept)
            shown = [text.decode("utf-8", "surrogateescape") for text in texts] if with_text else [None, None]
            yield NearDropped(origin, kept, similarity(drops.settings, *texts), copy, *shown)


def rows_in(rows: Array) -> Predicate:
    """Rows of a part whose `row` is one of `rows`."""
    wanted = pa.array(np.asarray(rows, dtype=np.int64))

    def predicate(batch: pa.RecordBatch, task: RecordedTask) -> pa.Array:
        """The matching rows of `batch`."""
        return pc.is_in(batch.column("row"), value_set=wanted)
    return predicate


class NearLookup:
    """Why a snapshot lacks a document of one of its input files when near-duplicate removal
    dropped it: `dropped as a near duplicate of ID (SOURCE line N)`. On first use the drops
    object is spilled into `work_dir` by part (one pass); changes come file by file, so one
    file's drops are held at a time, their documents and representatives found by one scan of
    each part they are in."""

    def __init__(self, store: Store, snapshot: Snapshot, work_dir: Path) -> None:
        self.store, self.snapshot, self.work_dir = store, snapshot, work_dir
        self._spills: list[Path] | None = None
        self._drops: NearDrops | None = None
        self._source: str | None = None
        self._why: dict[str, str] = {}

    def why(self, source: str, doc_id: str) -> str | None:
        """`dropped as a near duplicate of ...` for document `doc_id` of `source`, else None."""
        if not has_near_dedup(self.snapshot):
            return None
        if source != self._source:
            self._source, self._why = source, self._file_whys(source)
        return self._why.get(doc_id)

    def _file_whys(self, source: str) -> dict[str, str]:
        """Why each document of `source` that near-duplicate removal dropped is missing, by id."""
        drops, spills = self._spilled()
        records = drops.records
        ordinals = [ordinal for ordinal, task in enumerate(records.tasks) if task.source == source]
        found = [np.fromfile(spills[ordinal % len(spills)], dtype=DROP_PAIR) for ordinal in dict.fromkeys(
            ordinal % len(spills) for ordinal in ordinals)]
        pairs = np.concatenate(found or [np.zeros(0, dtype=DROP_PAIR)])
        pairs = pairs[np.isin(pairs["document"] >> np.uint64(ROW_BITS), np.array(ordinals, dtype=np.uint64))]
        named = self._origins(records, np.concatenate([pairs["document"], pairs["representative"]]))
        why = {}
        for number, representative in zip(pairs["document"].tolist(), pairs["representative"].tolist()):
            dropped, kept = named[number], named[representative]
            how = "an exact" if dropped.text_hash == kept.text_hash else "a near"
            why[dropped.id] = f"dropped as {how} duplicate of {kept.id} ({kept.source} line {kept.line})"
        return why

    def _origins(self, records: SnapshotRecords, numbers: Array) -> dict[int, DocumentOrigin]:
        """The documents with these global numbers, by number: one scan of each part they are in."""
        numbers = np.unique(numbers)
        found = {}
        for ordinal in np.unique(numbers >> np.uint64(ROW_BITS)).tolist():
            rows = numbers[(numbers >> np.uint64(ROW_BITS)) == ordinal] & np.uint64((1 << ROW_BITS) - 1)
            for origin in scan(self.store, records, [ordinal], rows_in(rows)):
                found[number_of(origin)] = origin
        missing = set(numbers.tolist()) - set(found)
        if missing:
            raise IntegrityError(f"drops object {self._spilled()[0].object_id} names document {min(missing)}, "
                                 "which no intermediate of the snapshot holds")
        return found

    def _spilled(self) -> tuple[NearDrops, list[Path]]:
        """The drops, and their (document, representative) pairs spilled by part ordinal modulo the spill count."""
        if self._drops is None or self._spills is None:
            drops = NearDrops.load(self.store, load_records(self.store, self.snapshot))
            assert drops is not None  # has_near_dedup
            count = min(MAX_SPILLS, len(drops.records.tasks))
            folder = Path(tempfile.mkdtemp(prefix="near-", dir=self.work_dir))
            spills = [folder / f"{index}.spill" for index in range(count)]
            handles = [open(spill, "wb") for spill in spills]
            try:
                for chunk in drops.chunks():
                    pairs = np.empty(len(chunk), dtype=DROP_PAIR)
                    pairs["document"], pairs["representative"] = chunk["document"], chunk["representative"]
                    spill = ((pairs["document"] >> np.uint64(ROW_BITS)) % np.uint64(count)).astype(np.int64)
                    for index in np.unique(spill).tolist():
                        handles[index].write(pairs[spill == index].tobytes())
            finally:
                for handle in handles:
                    handle.close()
            self._drops, self._spills = drops, spills
        return self._drops, self._spills
