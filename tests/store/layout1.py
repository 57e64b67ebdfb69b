"""A layout-1 snapshot (tokenize, dedup, shuffle, shard), planted with the records and objects
builds wrote before the partitioned stages, so tests can check that old snapshots still validate
and that gc keeps what they need in a store that also holds layout-2 builds.

Like an older build of the same inputs, the snapshot has tokenize records and a tokenize stage
manifest of its own (its code identity differed, and so did its keys) that name the same
intermediates as a layout-2 snapshot already in the store: identical bytes are one object. Its
keep mask has the real layout (prep/workfiles/keepmask.py); the plan is a real `.npy` of the old row
type; shard files are filler bytes, which nothing here reads.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from prep.formats.units import artifact_path
from prep.manifest import canonical
from prep.storage.backend import Store
from prep.store import cas, records
from prep.store.refs import move_ref
from prep.store.snapshots import Snapshot, load_snapshot, publish_manifest
from prep.workfiles.keepmask import pack_mask

PLAN_DTYPE = np.dtype([("shard", "<i4"), ("pos", "<i8"), ("bin_off", "<i8"), ("tar_off", "<i8")])
SHARDS = 2
TOKENS_PER_DOCUMENT = 5
SUMMARY_FIELDS = ("documents", "tokens", "text_bytes", "lines", "bad_records", "bad_record_examples",
                  "special_token_documents")


@dataclass(frozen=True)
class Layout1:
    """The planted snapshot, and the objects only it needs (not the intermediates it shares)."""

    snapshot: Snapshot
    own_objects: frozenset[str]


def _key(*parts: Any) -> str:
    return records.content_key("layout-1 test store", *parts)


def _plan_bytes(specs: list[dict[str, Any]]) -> bytes:
    rows = np.zeros(sum(spec["documents"] for spec in specs), dtype=PLAN_DTYPE)
    rows["shard"] = np.repeat([spec["index"] for spec in specs], [spec["documents"] for spec in specs])
    rows["pos"] = np.arange(len(rows))
    rows["bin_off"] = np.concatenate([np.arange(spec["documents"]) * TOKENS_PER_DOCUMENT * 2 for spec in specs])
    buffer = io.BytesIO()
    np.save(buffer, rows, allow_pickle=False)
    return buffer.getvalue()


def _shard_specs(documents: int) -> list[dict[str, Any]]:
    counts = [documents // SHARDS + (index < documents % SHARDS) for index in range(SHARDS)]
    return [{"index": index, "first_pos": sum(counts[:index]), "documents": count,
             "tokens": count * TOKENS_PER_DOCUMENT, "bin_size": count * TOKENS_PER_DOCUMENT * 2,
             "tar_size": 10240 * (count + 1)} for index, count in enumerate(counts)]


def _shards(store: Store, specs: list[dict[str, Any]], salt: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Store each shard's files and commit its unit task records: (shard manifest entries, artifacts)."""
    entries: list[dict[str, Any]] = []
    artifacts: list[dict[str, Any]] = []
    for spec in specs:
        ids = {fmt: cas.put_bytes(store, f"layout-1 {salt} shard {spec['index']} {fmt}\n".encode() * (spec["index"] + 1))
               for fmt in ("bin", "idx", "wds")}
        sizes = {fmt: len(cas.get_bytes(store, digest.id)) for fmt, digest in ids.items()}
        for unit in (("bin", "idx"), ("wds",)):
            records.write_task_record(store, "shard", _key("shard", salt, spec["index"], unit),
                                      {fmt: ids[fmt].id for fmt in unit}, {"sizes": {fmt: sizes[fmt] for fmt in unit}})
        entries.append({**spec, "outputs": {fmt: digest.id for fmt, digest in ids.items()}, "sizes": sizes})
        artifacts.extend({"path": artifact_path(fmt, spec["index"]), "format": fmt, "shard": spec["index"],
                          "size": sizes[fmt], "sha256": ids[fmt].sha256, "documents": spec["documents"],
                          "tokens": spec["tokens"]} for fmt in ("bin", "idx", "wds"))
    return entries, sorted(artifacts, key=lambda artifact: artifact["path"])


def commit_stage_entry(store: Store, stage: str, key: str, manifest: dict[str, Any]) -> dict[str, str]:
    """Commit a stage manifest; its entry in a snapshot's `stages` (shared with tests.store.layout2)."""
    return {"name": stage, "key": key, "output": records.commit_stage(store, stage, key, manifest)}


def plant_tokenize(store: Store, base: Snapshot, key: Callable[..., str],
                   salt: str) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """A tokenize stage of an older layout (no `entries`) over the intermediates of `base`, with
    task records under keys of its own: its stage entry and parts (shared with tests.store.layout2)."""
    stage = next(stage for stage in base.manifest["stages"] if stage["name"] == "tokenize")
    parts = [{**{k: v for k, v in part.items() if k != "entries"}, "key": key("tokenize", salt, index)}
             for index, part in enumerate(canonical.loads(cas.get_bytes(store, stage["output"]))["tasks"])]
    for part in parts:
        summary = {name: part[name] for name in SUMMARY_FIELDS}
        records.write_task_record(store, "tokenize", part["key"], {"intermediate": part["output"]}, summary)
    return commit_stage_entry(store, "tokenize", key("tokenize stage", salt), {"tasks": parts}), parts


def plant_layout1(store: Store, base_id: str, ref: str | None = "old", salt: str = "") -> Layout1:
    """Commit tokenize, dedup, shuffle and shard records of layout 1 over the intermediates of
    snapshot `base_id`, publish the snapshot and move `<dataset>@<ref>` to it."""
    base = load_snapshot(store, base_id)
    before = {info.key for info in store.list(cas.OBJECTS_PREFIX)}
    tokenize, parts = plant_tokenize(store, base, _key, salt)
    read = sum(int(part["documents"]) for part in parts)
    keep = np.ones(read, dtype=bool)
    keep[-1:] = False  # the last document is a duplicate
    mask = cas.put_bytes(store, pack_mask(keep))
    dedup_key = _key("dedup", salt)  # single-task stages: the task key is the stage key
    dedup = {"documents_read": read, "duplicates_dropped": read - int(keep.sum())}
    records.write_task_record(store, "dedup", dedup_key, {"keep": mask.id}, dedup)
    specs = _shard_specs(int(keep.sum()))
    plan = cas.put_bytes(store, _plan_bytes(specs))
    shuffle_key = _key("shuffle", salt)
    records.write_task_record(store, "shuffle", shuffle_key, {"plan": plan.id}, {"shards": specs})
    entries, artifacts = _shards(store, specs, salt)
    stages = [tokenize, commit_stage_entry(store, "dedup", dedup_key, {"outputs": {"keep": mask.id}, **dedup}),
              commit_stage_entry(store, "shuffle", shuffle_key, {"outputs": {"plan": plan.id}, "shards": specs}),
              commit_stage_entry(store, "shard", _key("shard stage", salt), {"shards": entries})]
    stats = {**base.manifest["stats"], "duplicates_dropped": dedup["duplicates_dropped"],
             "documents_written": int(keep.sum()), "tokens_written": sum(spec["tokens"] for spec in specs)}
    snapshot = publish_manifest(store, {**base.manifest, "stages": stages, "artifacts": artifacts, "stats": stats})
    if ref is not None:
        move_ref(store, base.dataset, ref, snapshot.id)
    own = {info.key.rsplit("/", 1)[1] for info in store.list(cas.OBJECTS_PREFIX) if info.key not in before}
    return Layout1(snapshot, frozenset(own))
