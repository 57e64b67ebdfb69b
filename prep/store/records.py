"""Commit records and stage keys.

Task records live at `tasks/<stage>/<task key>.json`, stage records at
`stages/<stage>/<stage key>.json`; both are create-only. Keys are SHA-256 over canonical JSON
of what determines the output (stage name, resolved settings, code identity, input ids), never
paths or mtimes.
"""

from __future__ import annotations

import hashlib
from typing import Any

from prep.errors import IntegrityError
from prep.manifest import canonical
from prep.storage.base import Store
from prep.store import cas

TASKS_PREFIX = "tasks/"
STAGES_PREFIX = "stages/"


def content_key(*parts: Any) -> str:
    """SHA-256 hex over the canonical JSON of `parts`."""
    return hashlib.sha256(canonical.dumps(list(parts))).hexdigest()


def task_record_key(stage: str, key: str) -> str:
    return f"{TASKS_PREFIX}{stage}/{key}.json"


def stage_record_key(stage: str, key: str) -> str:
    return f"{STAGES_PREFIX}{stage}/{key}.json"


def _read_json(store: Store, key: str) -> dict[str, Any] | None:
    if store.head(key) is None:
        return None
    try:
        value = canonical.loads(store.get_bytes(key))
    except ValueError as exc:
        raise IntegrityError(f"{store.url}/{key}: unreadable commit record ({exc})") from None
    if not isinstance(value, dict):
        raise IntegrityError(f"{store.url}/{key}: commit record is not an object")
    return value


def read_task_record(store: Store, stage: str, key: str) -> dict[str, Any] | None:
    return _read_json(store, task_record_key(stage, key))


def write_task_record(store: Store, stage: str, key: str, outputs: dict[str, str],
                      summary: dict[str, Any]) -> dict[str, Any]:
    """Commit a task: its outputs (object ids, already stored) and summary become reachable."""
    record = {"schema": "prep.task/1", "stage": stage, "key": key, "outputs": outputs, "summary": summary}
    store.put_bytes(task_record_key(stage, key), canonical.dumps(record))
    # Another writer may have committed first: its record must name the same outputs.
    existing = read_task_record(store, stage, key)
    if existing is None or existing.get("outputs") != outputs:
        raise IntegrityError(f"{store.url}: task {stage}/{key} was committed with different outputs")
    return existing


def read_stage(store: Store, stage: str, key: str) -> dict[str, Any] | None:
    """The committed output manifest of a stage, or None when the stage is not committed."""
    record = _read_json(store, stage_record_key(stage, key))
    if record is None:
        return None
    manifest = canonical.loads(cas.get_bytes(store, str(record["output"])))
    if not isinstance(manifest, dict):
        raise IntegrityError(f"{store.url}: stage manifest {record['output']} is not an object")
    return manifest


def commit_stage(store: Store, stage: str, key: str, manifest: dict[str, Any]) -> str:
    """Store a stage's output manifest, then its stage record; returns the manifest id."""
    body = {"schema": "prep.stage/1", "stage": stage, "key": key, **manifest}
    digest = cas.put_bytes(store, canonical.dumps(body))
    record = canonical.dumps({"schema": "prep.stage-record/1", "stage": stage, "key": key, "output": digest.id})
    store.put_bytes(stage_record_key(stage, key), record)
    return digest.id


def stage_output_id(store: Store, stage: str, key: str) -> str:
    record = _read_json(store, stage_record_key(stage, key))
    if record is None:
        raise IntegrityError(f"{store.url}: stage {stage}/{key} is not committed")
    return str(record["output"])
