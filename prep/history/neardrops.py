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

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from prep.errors import ConfigError, IntegrityError, UsageError
from prep.history.content import document_text
from prep.history.documents import (
    DocumentOrigin,
    NearDuplicate,
    Similarity,
    SnapshotRecords,
    Trace,
    origin_of_row,
    stage_manifest,
    verified_object,
)
from prep.neardup.lsh import estimated_similarity, jaccard
from prep.neardup.settings import NearDupSettings, parse_settings
from prep.neardup.signatures import shingle_sets, signatures
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
    offsets = np.array([0, len(first), len(first) + len(second)], dtype=np.int64)
    blob = first + second
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
