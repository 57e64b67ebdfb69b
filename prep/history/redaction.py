"""`prep redact`: what of a dataset still holds the documents a deletion request lists, read-only.

It composes the store-wide search (prep.history.everywhere) with the refs, the ref history and
garbage collection's retention rules (prep.store.gc): every snapshot of the dataset holding a
listed document (or a copy of its text), every current ref and tag and every history entry naming
one, which rule keeps each such snapshot now, and the objects holding the texts or tokens (the
shards and intermediates) that gc would delete once no rule keeps a snapshot naming them. Pulled
copies are folders outside the store (prep pull records nothing in it): the report says so.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from prep.history.everywhere import Query, Sweep, sweep
from prep.inputs.exclusions import Entry
from prep.storage.backend import Store
from prep.store.gc import retention_roots
from prep.store.refs import Ref, list_refs, ref_history
from prep.store.retention import Kept
from prep.store.snapshots import load_snapshot

PULLED_COPIES = ("prep pull records nothing in the store: a folder pulled from one of these snapshots holds the "
                 "documents until it is deleted, or pulled again with --prune from a snapshot without them")


@dataclass(frozen=True)
class HeldObjects:
    """The objects holding the request's texts or tokens, and which of them a retention rule's
    snapshot still names (gc keeps those; the rest go once older than the grace period)."""

    all: tuple[str, ...]
    kept: tuple[str, ...]

    @property
    def removable(self) -> tuple[str, ...]:
        kept = set(self.kept)
        return tuple(object_id for object_id in self.all if object_id not in kept)


@dataclass(frozen=True)
class Redaction:
    """The report: the search, the refs and history entries naming holding snapshots, the rules
    keeping them, and the objects gc keeps or would delete."""

    dataset: str
    found: Sweep
    refs: tuple[Ref, ...]
    history: tuple[Ref, ...]
    rules: tuple[Kept, ...]
    objects: HeldObjects

    @property
    def clean(self) -> bool:
        """True when no snapshot of the dataset holds a listed document any more, none of the
        objects that held one are kept, and no ref or history entry names a holding snapshot."""
        return not self.found.holding and not self.objects.kept and not self.refs and not self.history

    def to_json(self) -> dict[str, Any]:
        return {"dataset": self.dataset, "clean": self.clean,
                "refs": [ref.to_json() for ref in self.refs], "history": [ref.to_json() for ref in self.history],
                "kept_by": [{"rule": kept.rule, **kept.to_json()} for kept in self.rules],
                "objects": {"holding": list(self.objects.all), "kept": list(self.objects.kept),
                            "removable": list(self.objects.removable)},
                "pulled_copies": PULLED_COPIES}


def redact(store: Store, entries: Sequence[Entry], dataset: str) -> Redaction:
    """What of `dataset` in `store` still holds the documents `entries` name; changes nothing."""
    found = sweep(store, Query.of(entries), dataset)
    holding = {entry.snapshot for entry in found.holding}
    refs = tuple(ref for ref in list_refs(store, dataset) if ref.snapshot in holding)
    history = tuple(ref for ref in ref_history(store, dataset) if ref.snapshot in holding)
    _, roots = retention_roots(store, None, time.time())
    rules = tuple(kept for kept in roots if kept.snapshot in holding)
    return Redaction(dataset, found, refs, history, rules, _held_objects(store, found, {kept.snapshot for kept in rules}))


def _held_objects(store: Store, found: Sweep, kept_snapshots: set[str]) -> HeldObjects:
    """The objects the holding snapshots' matches lie in, and those a kept holding snapshot names."""
    every: set[str] = set()
    kept: set[str] = set()
    for entry in found.holding:
        artifacts = {artifact["path"]: f"sha256:{artifact['sha256']}"
                     for artifact in load_snapshot(store, entry.snapshot).artifacts}
        objects = entry.objects(artifacts.__getitem__)
        every |= objects
        if entry.snapshot in kept_snapshots:
            kept |= objects
    return HeldObjects(tuple(sorted(every)), tuple(sorted(kept)))
