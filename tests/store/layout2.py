"""A layout-2 snapshot (tokenize, route, order, shard), planted with the records and objects builds
wrote before tokenize tasks wrote their parts' entries themselves, so tests can check that such
snapshots still validate, that gc and fsck keep and check what they need, and that the history
commands read them.

Like an older build of the same inputs, the snapshot has tokenize records and a tokenize stage
manifest of its own (no `entries`), and a route stage whose objects are real route entries (each
part's entries, grouped by bucket, with its ordinal and per-bucket counts, as route tasks wrote
them). Its order and shard stages are those of the layout-3 snapshot it is planted over: what
route and order computed is the same, and identical bytes are one object.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from prep.manifest import canonical
from prep.storage.backend import Store
from prep.store import cas, records
from prep.store.localcopy import local_file
from prep.store.refs import move_ref
from prep.store.snapshots import Snapshot, load_snapshot, publish_manifest
from prep.workfiles.entries import PART_COLUMNS, part_entries, write_entries
from prep.workfiles.intermediate import read_columns
from prep.workfiles.keys import bucket_of
from tests.store.layout1 import commit_stage_entry, plant_tokenize


@dataclass(frozen=True)
class Layout2:
    """The planted snapshot and the route objects only it names."""

    snapshot: Snapshot
    route_objects: frozenset[str]


def _key(*parts: object) -> str:
    return records.content_key("layout-2 test store", *parts)


def _route_object(store: Store, intermediate: str, ordinal: int, seed: int, bits: int, folder_key: str) -> str:
    """Store the route entries a route task wrote for part `ordinal`: its entries in key order
    (which groups the buckets), the part's ordinal in each, and each bucket's count."""
    entries, ids = part_entries(read_columns(local_file(store, intermediate), list(PART_COLUMNS)), seed)
    entries["part"] = ordinal
    counts = np.bincount(bucket_of(entries["key_hi"], bits), minlength=1 << bits)
    path = local_file(store, intermediate).with_name(f"route-{folder_key}-{ordinal}")
    try:
        digest = write_entries(path, {"schema": "prep.entries/1", "kind": "route", "bits": bits,
                                      "buckets": counts.tolist()}, entries, ids)
        return cas.put_file(store, path, digest).id
    finally:
        path.unlink(missing_ok=True)


def plant_layout2(store: Store, base_id: str, ref: str | None = "layout2", salt: str = "") -> Layout2:
    """Commit tokenize and route records of layout 2 over the layout-3 snapshot `base_id` (a
    local store), publish the snapshot with `base_id`'s order and shard stages and move
    `<dataset>@<ref>` to it."""
    base = load_snapshot(store, base_id)
    by_name = {stage["name"]: stage for stage in base.manifest["stages"]}
    seed = int(base.manifest["seed"])
    bits = int(canonical.loads(cas.get_bytes(store, by_name["order"]["output"]))["bits"])
    tokenize, parts = plant_tokenize(store, base, _key, salt)
    route_tasks: list[dict[str, object]] = []
    outputs: set[str] = set()
    for ordinal, part in enumerate(parts):
        key = _key("route", salt, ordinal)
        output = _route_object(store, part["output"], ordinal, seed, bits, salt or "base")
        records.write_task_record(store, "route", key, {"route": output}, {"documents": int(part["documents"])})
        route_tasks.append({"part": ordinal, "key": key, "output": output})
        outputs.add(output)
    stages = [tokenize, commit_stage_entry(store, "route", _key("route stage", salt), {"bits": bits, "tasks": route_tasks}),
              by_name["order"], by_name["shard"]]
    snapshot = publish_manifest(store, {**base.manifest, "stages": stages})
    if ref is not None:
        move_ref(store, base.dataset, ref, snapshot.id)
    return Layout2(snapshot, frozenset(outputs))
