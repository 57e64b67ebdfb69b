"""What `prep log` reports: the generations a dataset's refs took (marking the snapshots that no
longer exist: collected), and its builds as their build logs (`logs/<dataset>/`) recorded them.

Reads only. A snapshot counts as present when both its marker and its manifest object exist
(prep.store.layout); a build log is validated against manifests/build-log-1.schema.json.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from prep import hashing
from prep.errors import IntegrityError, PrepError
from prep.manifest.schema import validate
from prep.storage.base import Store
from prep.store import cas
from prep.store.layout import logs_prefix, snapshot_marker_key
from prep.store.refs import Ref, ref_history
from prep.store.snapshots import Snapshot, load_snapshot

REPORT_SCHEMA = "prep.log-report/1"  # manifests/log-report-1.schema.json
BUILD_LOG_SCHEMA = "prep.build-log/1"


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


def snapshot_exists(store: Store, snapshot_id: str) -> bool:
    """True when the snapshot's marker and its manifest object are both in the store."""
    return store.exists(snapshot_marker_key(snapshot_id)) and store.exists(cas.object_key(hashing.parse_id(snapshot_id)))


def generations(store: Store, dataset: str) -> list[Generation]:
    """Every generation of the dataset's refs, newest first, each checked for its snapshot once."""
    present: dict[str, bool] = {}
    found = []
    for ref in ref_history(store, dataset):
        if ref.snapshot not in present:
            present[ref.snapshot] = snapshot_exists(store, ref.snapshot)
        found.append(Generation(ref, not present[ref.snapshot]))
    return found


@dataclass(frozen=True)
class BuildRecord:
    """One build as its log recorded it, with what its snapshot says when it is still there.

    `executor`, `workers` and `backend` are None when the log (and the snapshot) do not record
    them; `skipped` is the snapshot's count of bad records skipped (None once collected), which
    may exceed the reasons listed (at most 100 per tokenize task)."""

    key: str
    log: dict[str, Any]
    collected: bool
    backend: str | None
    skipped: int | None

    @property
    def executor(self) -> str | None:
        """The executor kind the log names, if any."""
        value = self.log.get("executor")
        return None if value is None else str(value)

    @property
    def workers(self) -> int | None:
        """The worker count the log names, if any."""
        value = self.log.get("workers")
        return None if value is None else int(value)

    def to_json(self) -> dict[str, Any]:
        """The build as log reports print it."""
        log = self.log
        return {"log": self.key, "snapshot": log["snapshot"], "started": log["started"], "seconds": log["seconds"],
                "host": log["host"], "executor": self.executor, "workers": self.workers, "backend": self.backend,
                "collected": self.collected, "refs": log["refs"],
                "stages": {name: {"ran": int(run["ran"]), "cached": int(run["cached"])}
                           for name, run in log["stages"].items()},
                "skipped": self.skipped if self.skipped is not None else len(log["bad_records"]),
                "skip_reasons": list(log["bad_records"]),
                "recomputed": len(log.get("recomputed", []))}


def _read_log(store: Store, key: str) -> dict[str, Any]:
    """One build log, parsed and validated; IntegrityError naming its key otherwise."""
    try:
        data = json.loads(store.get_bytes(key))
    except (UnicodeDecodeError, ValueError) as exc:
        raise IntegrityError(f"{store.url}: build log {key} is not JSON ({exc})") from None
    validate(data, BUILD_LOG_SCHEMA, f"{store.url}: build log {key}")
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
        backend = log.get("backend") or _task_backends(log) or (
            manifest["config"].get("tokenizer", {}).get("backend") if manifest else None)
        skipped = int(manifest["stats"].get("bad_records_skipped", 0)) if manifest else None
        found.append(BuildRecord(info.key, log, snapshot is None, None if backend is None else str(backend), skipped))
    return found
