"""`prep trace --all`: every snapshot of a store that holds a document or a copy of its text.

A query names documents by id and texts by hash (prep.inputs.exclusions spells both). Each
snapshot's tokenize intermediates are scanned for rows whose id or text hash matches; the text
hash of every document found by id joins the query, so a copy of its text kept under another id
(in any dataset, dedup off, or another file) is found too. Each match is traced with the
snapshot's own placer (prep.history.lineage), so its shards and positions are the ones
`prep trace` reports, and the intermediate that holds its text is named beside them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from prep.errors import PrepError
from prep.history.documents import DocumentOrigin, Predicate, RecordedTask, SnapshotRecords, Trace, scan
from prep.history.lineage import Placer, placer_for
from prep.inputs.exclusions import HASH_BYTES, Entry, parse_entry
from prep.storage.backend import Store
from prep.store.refs import list_refs
from prep.store.snapshots import Snapshot, list_snapshot_ids, load_snapshot
from prep.workfiles.columns import fixed_binary_column_of, string_column


@dataclass(frozen=True)
class Query:
    """What to look for: document ids and text hashes (32 hex digits each)."""

    ids: frozenset[str] = frozenset()
    texts: frozenset[str] = frozenset()

    @classmethod
    def of(cls, entries: Iterable[Entry]) -> Query:
        """The query of a request's entries."""
        listed = list(entries)
        return cls(frozenset(entry.value for entry in listed if entry.kind == "id"),
                   frozenset(entry.value for entry in listed if entry.kind == "text"))

    @classmethod
    def parse(cls, spec: str) -> Query:
        """`id:ID`, `text:HASH`, or a bare argument: an id, and a text hash too when it is 32 hex
        digits (a document id may look like one); ValueError for a malformed `text:`."""
        if spec.startswith(("id:", "text:")):
            entry = parse_entry(spec)
            assert entry is not None
            return cls.of([entry])
        as_hash = spec.lower()
        hashed = len(as_hash) == 2 * HASH_BYTES and all(c in "0123456789abcdef" for c in as_hash)
        return cls(frozenset([spec]), frozenset([as_hash]) if hashed else frozenset())

    def predicate(self) -> Predicate:
        """Rows whose id or text hash the query names."""
        ids = string_column(sorted(self.ids))
        texts = fixed_binary_column_of(b"".join(bytes.fromhex(h) for h in sorted(self.texts)), HASH_BYTES,
                                       len(self.texts))

        def matches(batch: pa.RecordBatch, task: RecordedTask) -> pa.Array:
            """The matching rows of `batch`."""
            hit = pc.is_in(batch.column("text_hash"), value_set=texts)
            return pc.or_(hit, pc.is_in(batch.column("id"), value_set=ids)) if len(ids) else hit
        return matches

    def __bool__(self) -> bool:
        return bool(self.ids or self.texts)


@dataclass(frozen=True)
class Hit:
    """One document of a snapshot the query names: its trace, what matched (`id` or `text`) and
    the tokenize intermediate holding its text."""

    trace: Trace
    matched: str
    intermediate: str

    def to_json(self) -> dict[str, Any]:
        return {**self.trace.to_json(), "matched": self.matched, "intermediate": self.intermediate}


@dataclass(frozen=True)
class SnapshotHits:
    """What one snapshot holds of the query (`skipped`: why it was not searched)."""

    snapshot: str
    dataset: str
    refs: tuple[str, ...]
    hits: tuple[Hit, ...] = ()
    skipped: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"snapshot": self.snapshot, "dataset": self.dataset, "refs": list(self.refs),
                "documents": [hit.to_json() for hit in self.hits],
                **({"skipped": self.skipped} if self.skipped else {})}

    def objects(self, artifacts: Callable[[str], str]) -> set[str]:
        """Every object id holding a hit's text or tokens: its intermediate and the artifacts of its
        placements (and those of the copies kept instead), `artifacts` mapping a path to its id."""
        found: set[str] = set()
        for hit in self.hits:
            found.add(hit.intermediate)
            found.update(artifacts(place.path) for place in _placements(hit.trace))
        return found


@dataclass
class Sweep:
    """The snapshots searched, in store order, and the query as it grew."""

    query: Query
    snapshots: list[SnapshotHits] = field(default_factory=list)

    @property
    def holding(self) -> list[SnapshotHits]:
        return [found for found in self.snapshots if found.hits]


def _placements(trace: Trace) -> Iterable[Any]:
    """The placements of a trace and of the copies it names as kept instead."""
    yield from trace.placements
    if trace.duplicate_of is not None:
        yield from _placements(trace.duplicate_of)
    if trace.near_duplicate_of is not None:
        yield from _placements(trace.near_duplicate_of.kept)


def _matched(origin: DocumentOrigin, query: Query) -> str:
    return "id" if origin.id in query.ids else "text"


def _search(store: Store, placer: Placer, query: Query) -> list[DocumentOrigin]:
    records: SnapshotRecords = placer.records
    return list(scan(store, records, range(len(records.tasks)), query.predicate()))


def _refs_by_snapshot(store: Store) -> dict[str, list[str]]:
    named: dict[str, list[str]] = {}
    for ref in list_refs(store):
        named.setdefault(ref.snapshot, []).append(f"{ref.dataset}@{ref.name}")
    return named


def sweep(store: Store, query: Query, dataset: str | None = None, snapshot_ids: Sequence[str] | None = None) -> Sweep:
    """Search every snapshot of the store (of `dataset` only, when given) for the query's documents.
    Two passes: the first finds the documents the query names; the text hashes of those found by
    id join the query, and the second finds every copy of those texts too."""
    ids = list(snapshot_ids) if snapshot_ids is not None else list_snapshot_ids(store)
    refs = _refs_by_snapshot(store)
    loaded: list[tuple[Snapshot, Placer | None, str | None]] = []
    unreadable: list[SnapshotHits] = []
    for snapshot_id in ids:
        try:
            snapshot = load_snapshot(store, snapshot_id)
        except PrepError as exc:  # a marker whose manifest is gone or corrupt: named, never guessed at
            unreadable.append(SnapshotHits(snapshot_id, "", (), (), f"its manifest cannot be read: {exc}"))
            continue
        if dataset is not None and snapshot.dataset != dataset:
            continue
        try:
            loaded.append((snapshot, placer_for(store, snapshot), None))
        except PrepError as exc:  # collected stage manifests, an unknown layout: say so, search the rest
            loaded.append((snapshot, None, str(exc)))
    found: dict[str, list[DocumentOrigin]] = {}
    for snapshot, placer, _ in loaded:
        if placer is not None and query:
            found[snapshot.id] = _search(store, placer, query)
    grown = Query(query.ids, query.texts | {o.text_hash for origins in found.values() for o in origins})
    if grown.texts != query.texts:
        extra = Query(texts=grown.texts - query.texts)
        for snapshot, placer, _ in loaded:
            if placer is not None:
                seen = {origin.index for origin in found[snapshot.id]}
                found[snapshot.id] += [o for o in _search(store, placer, extra) if o.index not in seen]
    result = Sweep(grown, unreadable)
    for snapshot, placer, skipped in loaded:
        origins = sorted(found.get(snapshot.id, []), key=lambda origin: origin.index)
        hits = tuple(Hit(placer.trace_origin(origin), _matched(origin, query),
                         placer.records.tasks[origin.part].output) for origin in origins) if placer else ()
        result.snapshots.append(SnapshotHits(snapshot.id, snapshot.dataset, tuple(sorted(refs.get(snapshot.id, []))),
                                             hits, skipped))
    return result
