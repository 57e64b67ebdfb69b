"""The end of a build: the snapshot manifest assembled from the committed stages, and the
build log (what may differ between two builds of one snapshot, so none of it is in the id)."""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import dataclass
from typing import Any

from prep import hashing
from prep.formats.units import named_artifact_path, unit_formats, units_for
from prep.inputs.sources import SourceFile
from prep.storage.base import Store
from prep.store.layout import log_key
from prep.store.refs import Ref
from prep.store.snapshots import Snapshot

SNAPSHOT_SCHEMA = "prep.snapshot/1"  # manifests/snapshot-1.schema.json


@dataclass
class StageRun:
    """What one stage did in this build: tasks run and tasks served from commit records."""

    name: str
    key: str = ""
    ran: int = 0
    cached: int = 0
    output: str = ""


def artifacts(shards: list[dict[str, Any]], formats: tuple[str, ...]) -> list[dict[str, Any]]:
    """The snapshot's artifact list: every file of every shard, sorted by path."""
    listed = []
    for shard in shards:
        for fmt in (fmt for unit in units_for(formats) for fmt in unit_formats(unit)):
            listed.append({
                "path": named_artifact_path(fmt, shard["name"]), "format": fmt, "shard": shard["index"],
                "size": shard["sizes"][fmt], "sha256": hashing.parse_id(shard["outputs"][fmt]),
                "documents": shard["documents"], "tokens": shard["tokens"],
            })
    return sorted(listed, key=lambda a: a["path"])


def build_stats(entries: list[dict[str, Any]], duplicates_dropped: int, shards: list[dict[str, Any]]) -> dict[str, int]:
    """The snapshot's `stats`: documents and tokens in and out."""
    return {
        "documents_read": sum(int(e["documents"]) for e in entries),
        "duplicates_dropped": duplicates_dropped,
        "documents_written": sum(s["documents"] for s in shards),
        "tokens_written": sum(s["tokens"] for s in shards),
        "bad_records_skipped": sum(int(e.get("bad_records", 0)) for e in entries),
        "special_token_documents": sum(int(e.get("special_token_documents", 0)) for e in entries),
    }


def snapshot_manifest(*, dataset: str, seed: int, version: str, sources: list[SourceFile], code: dict[str, Any],
                      tokenizer: dict[str, Any], config: dict[str, Any], stages: list[StageRun],
                      shards: list[dict[str, Any]], formats: tuple[str, ...], stats: dict[str, int]) -> dict[str, Any]:
    """The `prep.snapshot/1` manifest of a build (schema: manifests/snapshot-1.schema.json)."""
    return {
        "schema": SNAPSHOT_SCHEMA,
        "dataset": dataset,
        "seed": seed,
        "inputs": {"version": version, "files": [s.to_json() for s in sources]},
        "code": code,
        "tokenizer": tokenizer,
        "config": config,
        "stages": [{"name": run.name, "key": run.key, "output": run.output} for run in stages],
        "artifacts": artifacts(shards, formats),
        "stats": stats,
    }


def write_log(store: Store, dataset: str, snapshot: Snapshot, stages: dict[str, StageRun], sources: list[SourceFile],
              entries: list[dict[str, Any]], started: float, moved: list[Ref], extra: dict[str, Any]) -> str:
    """Store a build's log record (`prep.build-log/1`) under a fresh name; returns its key."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(started))
    key = log_key(dataset, stamp, uuid.uuid4().hex[:12])
    record = {
        "schema": "prep.build-log/1",
        "snapshot": snapshot.id,
        "dataset": dataset,
        "started": stamp,
        "seconds": int(time.time() - started),
        "host": os.uname().nodename,
        "stages": {n: {"key": r.key, "ran": r.ran, "cached": r.cached} for n, r in stages.items()},
        "inputs": [{"path": s.rel, "location": s.location, "etag": s.etag, "version_id": s.version_id}
                   for s in sources],
        "refs": [{"name": ref.name, "generation": ref.generation, "previous": ref.previous} for ref in moved],
        "bad_records": [reason for e in entries for reason in e.get("bad_record_examples", [])],
        **extra,
    }
    store.put_bytes(key, json.dumps(record, sort_keys=True, indent=1).encode())
    return key
