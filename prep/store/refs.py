"""Named refs (`dataset@name`) that point at published snapshots, moved by compare-and-swap.

A ref body carries a generation number that only grows. Every generation a ref takes is also
recorded create-only under `history/`, so no published generation is lost without trace even
when builders race for one ref.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from prep.errors import IntegrityError, RefConflictError
from prep.manifest import canonical
from prep.storage.base import Store
from prep.store.layout import HISTORY_PREFIX as HISTORY_PREFIX  # re-exported for callers of refs
from prep.store.layout import RECORD_SUFFIX, history_key, history_prefix, ref_key, refs_prefix
from prep.store.layout import check_name as check_name

MAX_SWAP_ATTEMPTS = 50


@dataclass(frozen=True)
class Ref:
    """One value of a ref: which snapshot it names, at which generation, since when."""

    dataset: str
    name: str
    snapshot: str
    generation: int
    time: str
    previous: str | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "schema": "prep.ref/1",
            "dataset": self.dataset,
            "name": self.name,
            "snapshot": self.snapshot,
            "generation": self.generation,
            "time": self.time,
            "previous": self.previous,
        }

    @classmethod
    def from_json(cls, data: dict[str, object], source: str) -> Ref:
        try:
            return cls(
                dataset=str(data["dataset"]),
                name=str(data["name"]),
                snapshot=str(data["snapshot"]),
                generation=int(data["generation"]),  # type: ignore[call-overload]
                time=str(data["time"]),
                previous=None if data.get("previous") is None else str(data["previous"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise IntegrityError(f"{source}: malformed ref record ({exc})") from None


def read_ref(store: Store, dataset: str, name: str) -> Ref | None:
    key = ref_key(dataset, name)
    value = store.read_ref(key)
    if value is None:
        return None
    return Ref.from_json(canonical.loads(value.body), f"{store.url}/{key}")


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def move_ref(store: Store, dataset: str, name: str, snapshot: str) -> Ref:
    """Point `dataset@name` at `snapshot` by compare-and-swap, retrying lost races.

    The caller must only pass snapshots whose manifest and artifacts are already stored.
    """
    key = ref_key(dataset, name)
    for _ in range(MAX_SWAP_ATTEMPTS):
        current = store.read_ref(key)
        old = Ref.from_json(canonical.loads(current.body), key) if current else None
        new = Ref(
            dataset=dataset,
            name=name,
            snapshot=snapshot,
            generation=(old.generation + 1) if old else 1,
            time=_now(),
            previous=old.snapshot if old else None,
        )
        body = canonical.dumps(new.to_json())
        if old is not None and current is not None:
            # Idempotent: records the generation we replace in case its own writer died first.
            store.put_bytes(history_key(dataset, name, old.generation), current.body)
        if store.swap_ref(key, body, current.token if current else None):
            # Create-only: a generation is won by exactly one swap, so this key is ours.
            store.put_bytes(history_key(dataset, name, new.generation), body)
            return new
    raise RefConflictError(f"{dataset}@{name}: the ref kept moving; gave up after {MAX_SWAP_ATTEMPTS} attempts")


def list_refs(store: Store, dataset: str | None = None) -> list[Ref]:
    """Every ref in the store (or of one dataset), sorted by dataset and name."""
    refs = []
    for info in store.list(refs_prefix(dataset)):
        if not info.key.endswith(RECORD_SUFFIX):
            continue
        value = store.read_ref(info.key)
        if value is not None:
            refs.append(Ref.from_json(canonical.loads(value.body), info.key))
    return sorted(refs, key=lambda ref: (ref.dataset, ref.name))


def ref_history(store: Store, dataset: str) -> list[Ref]:
    """Every generation any ref of `dataset` has taken, newest first."""
    entries = []
    for info in store.list(history_prefix(dataset)):
        entries.append(Ref.from_json(canonical.loads(store.get_bytes(info.key)), info.key))
    # Refs that moved but crashed before their history record still count.
    seen = {(ref.name, ref.generation) for ref in entries}
    entries.extend(ref for ref in list_refs(store, dataset) if (ref.name, ref.generation) not in seen)
    return sorted(entries, key=lambda ref: (ref.time, ref.generation, ref.name), reverse=True)
