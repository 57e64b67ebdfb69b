"""What `prep log` reports: the generations a dataset's refs took (marking the snapshots that no
longer exist: collected), and its builds as their build logs (`logs/<dataset>/`) recorded them.

Reads only. A snapshot counts as present while its manifest object is stored
(prep.store.retention.snapshot_exists, what gc deletes); a build log is validated against its own
schema, manifests/build-log-1.schema.json or build-log-2.schema.json.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from prep.errors import IntegrityError, PrepError
from prep.manifest.schema import schema_path, validate
from prep.storage.backend import Store
from prep.store.layout import logs_prefix
from prep.store.refs import Ref, ref_history
from prep.store.retention import snapshot_exists
from prep.store.snapshots import Snapshot, load_snapshot

REPORT_SCHEMA = "prep.log-report/1"  # manifests/log-report-1.schema.json
BUILD_LOG_SCHEMAS = ("prep.build-log/1", "prep.build-log/2")
REF_SCHEMA = "prep.ref/1"  # manifests/ref-1.schema.json


@dataclass(frozen=True)
class Generation:
    """One generation of one ref, and whether its snapshot is still in the store."""

    ref: Ref
    collected: bool

    def to_json(self) -> dict[str, Any]:
        """The generation as log reports print it."""
        ref = self.ref
        return {"ref": ref.name, "generation": ref.generation, "time": ref.time, "snapshot": ref.snapshot,
                "previous": ref.previous, "deleted": ref.deleted, "collected": self.collected}


def generations(store: Store, dataset: str) -> list[Generation]:
    """Every generation of the dataset's refs, newest first, each checked for its snapshot once;
    IntegrityError for a value its schema refuses (a damaged record: say, one naming no snapshot id)."""
    present: dict[str, bool] = {}
    found = []
    for ref in ref_history(store, dataset):
        validate(ref.to_json(), REF_SCHEMA, f"{store.url}: generation {ref.generation} of {ref.dataset}@{ref.name}")
        if ref.snapshot not in present:
            present[ref.snapshot] = snapshot_exists(store, ref.snapshot)
        found.append(Generation(ref, not present[ref.snapshot]))
    return found


@dataclass(frozen=True)
class BuildRecord:
    """One build as its log recorded it (prep.build-log/1 or /2), with what its snapshot says
    while it is still there. Fields a log does not record are None (log/1 has no executor or
    workers); `skipped` counts every bad record skipped, `skip_reasons` the ones the log lists."""

    key: str
    log: dict[str, Any]
    collected: bool
    tokenizer_backend: str | None
    skipped: int
    skip_reasons: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        """The build as log reports print it."""
        log = self.log
        recorded = log.get("executor")
        executor: dict[str, Any] = recorded if isinstance(recorded, dict) else {}
        return {"log": self.key, "schema": log["schema"], "snapshot": log["snapshot"], "started": log["started"],
                "seconds": log["seconds"], "host": log["host"], "user": log.get("user"),
                "executor": executor.get("backend"), "workers": executor.get("workers"),
                "tokenizer_backend": self.tokenizer_backend, "collected": self.collected,
                "stages": {name: {"ran": int(run["ran"]), "cached": int(run["cached"])}
                           for name, run in sorted(log["stages"].items(), key=lambda item: _stage_rank(item[0]))},
                "skipped": self.skipped, "skip_reasons": list(self.skip_reasons),
                "recomputed": len(log.get("recomputed", []))}


def _stage_rank(name: str) -> tuple[int, str]:
    """Stages in build order (tokenize first, shard last; logs store them sorted by name)."""
    order = ("tokenize", "near_buckets", "near_route", "near_round", "near_drops", "near_clusters",
             "dedup", "shuffle", "route", "merge", "order", "shard")
    return (order.index(name) if name in order else len(order), name)


def _skips(log: dict[str, Any], manifest: dict[str, Any] | None) -> tuple[int, tuple[str, ...]]:
    """How many records the build skipped, and the reasons its log lists (`file:line: reason`)."""
    if isinstance(log.get("skipped"), dict):  # prep.build-log/2
        reasons = []
        for entry in log["skipped"].get("listed", []):
            where = f":{entry['line']}" if "line" in entry else (f": row {entry['row']}" if "row" in entry else "")
            reasons.append(f"{entry['file']}{where}: {entry['reason']}" if entry.get("file") else str(entry["reason"]))
        return int(log["skipped"].get("total", len(reasons))), tuple(reasons)
    reasons = [str(reason) for reason in log.get("bad_records", [])]
    total = int(manifest["stats"].get("bad_records_skipped", len(reasons))) if manifest else len(reasons)
    return total, tuple(reasons)


def _read_log(store: Store, key: str) -> dict[str, Any]:
    """One build log, parsed and validated against its own schema; IntegrityError naming its key otherwise."""
    source = f"{store.url}: build log {key}"
    try:
        data = json.loads(store.get_bytes(key))
    except (UnicodeDecodeError, ValueError) as exc:
        raise IntegrityError(f"{source} is not JSON ({exc})") from None
    schema = data.get("schema") if isinstance(data, dict) else None
    if schema not in BUILD_LOG_SCHEMAS:
        raise IntegrityError(f"{source}: schema {schema!r} is none of {', '.join(BUILD_LOG_SCHEMAS)}")
    if schema_path(str(schema)).is_file():
        validate(data, str(schema), source)
    missing = [field for field in ("snapshot", "started", "seconds", "host", "stages") if field not in data]
    if missing:
        raise IntegrityError(f"{source}: lacks {', '.join(missing)}")
    assert isinstance(data, dict)
    return data


def _snapshot(store: Store, snapshot_id: str) -> Snapshot | None:
    """The build's snapshot, None when it no longer exists (collected) or cannot be read."""
    if not snapshot_exists(store, snapshot_id):
        return None
    try:
        return load_snapshot(store, snapshot_id)
    except PrepError:
        return None


def _task_backends(log: dict[str, Any]) -> str | None:
    """The tokenizer backends the build's own tokenize tasks report (none when all were cached)."""
    names = sorted({str(task["backend"]) for task in log.get("tasks", {}).get("tokenize", {}).values()
                    if isinstance(task, dict) and "backend" in task})
    return ", ".join(names) or None


def builds(store: Store, dataset: str) -> list[BuildRecord]:
    """Every build log of `dataset`, newest first (log names start with the UTC start time)."""
    found = []
    for info in sorted(store.list(logs_prefix(dataset)), key=lambda info: info.key, reverse=True):
        log = _read_log(store, info.key)
        snapshot = _snapshot(store, str(log["snapshot"]))
        manifest = snapshot.manifest if snapshot is not None else None
        backend = _task_backends(log) or (manifest["config"].get("tokenizer", {}).get("backend") if manifest else None)
        skipped, reasons = _skips(log, manifest)
        found.append(BuildRecord(info.key, log, snapshot is None, backend, skipped, reasons))
    return found
