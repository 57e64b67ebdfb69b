"""Typed commit records: they round-trip byte for byte, are validated when read, and say exactly
which objects they name; a record or manifest of any other shape is an IntegrityError."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from prep.errors import IntegrityError
from prep.manifest import canonical
from prep.storage import LocalStore
from prep.store import records
from prep.store.layout import stage_record_key, task_record_key

KEY = "c" * 64
IDS = [f"sha256:{digit * 64}" for digit in "0123456789"]
TOKENIZE_SUMMARY: dict[str, Any] = {"documents": 2, "tokens": 9, "text_bytes": 30, "bad_records": 1,
                                    "special_token_documents": 0, "lines": 3, "bad_record_examples": ["line 2: no text"]}


def tokenize_entry(output: str) -> dict[str, Any]:
    return {"source": "a.jsonl", "sha256": "e" * 64, "format": "jsonl", "part": 0, "start": 0, "end": 10, "key": KEY,
            "output": output, "line_offset": 0, **TOKENIZE_SUMMARY}


SHARD_SPEC = {"index": 0, "first_pos": 0, "documents": 2, "tokens": 11, "bin_size": 44, "tar_size": 0}
# One stage output manifest of each kind, and the ids it names.
STAGE_MANIFESTS: list[tuple[dict[str, Any], set[str]]] = [
    ({"stage": "tokenize", "tasks": [tokenize_entry(IDS[0]), tokenize_entry(IDS[1])]}, {IDS[0], IDS[1]}),
    ({"stage": "dedup", "outputs": {"keep": IDS[2]}, "documents_read": 2, "duplicates_dropped": 0}, {IDS[2]}),
    ({"stage": "shuffle", "outputs": {"plan": IDS[3]}, "shards": [SHARD_SPEC]}, {IDS[3]}),
    ({"stage": "shard", "shards": [{**SHARD_SPEC, "outputs": {"bin": IDS[4], "idx": IDS[5]}, "sizes": {"bin": 44, "idx": 9}},
                                   {**SHARD_SPEC, "index": 1, "outputs": {"wds": IDS[6]}, "sizes": {"wds": 1024}}]},
     {IDS[4], IDS[5], IDS[6]}),
]


@pytest.fixture()
def store(tmp_path: Path) -> LocalStore:
    return LocalStore(tmp_path / "store")


def test_a_task_record_round_trips_byte_for_byte(store: LocalStore) -> None:
    written = records.write_task_record(store, "tokenize", KEY, {"intermediate": IDS[0]}, TOKENIZE_SUMMARY)
    raw = store.get_bytes(task_record_key("tokenize", KEY))
    assert raw == canonical.dumps({"schema": "prep.task/1", "stage": "tokenize", "key": KEY,
                                   "outputs": {"intermediate": IDS[0]}, "summary": TOKENIZE_SUMMARY})
    assert records.read_task_record(store, "tokenize", KEY) == written
    assert canonical.dumps(written.to_json()) == raw
    assert written.names() == records.Names(objects=frozenset({IDS[0]}))


def test_a_stage_record_round_trips_byte_for_byte(store: LocalStore) -> None:
    manifest = {"outputs": {"keep": IDS[2]}, "documents_read": 2, "duplicates_dropped": 0}
    output = records.commit_stage(store, "dedup", KEY, manifest)
    raw = store.get_bytes(stage_record_key("dedup", KEY))
    assert raw == canonical.dumps({"schema": "prep.stage-record/1", "stage": "dedup", "key": KEY, "output": output})
    record = records.read_stage_record(store, "dedup", KEY)
    assert record == records.StageRecord("dedup", KEY, output) and canonical.dumps(record.to_json()) == raw
    assert record.names() == records.Names(manifests=frozenset({output}))
    assert records.stage_output_id(store, "dedup", KEY) == output
    assert records.read_stage(store, "dedup", KEY) == {"schema": "prep.stage/1", "stage": "dedup", "key": KEY, **manifest}


def _put(store: LocalStore, key: str, document: Any) -> None:
    store.put_bytes(key, canonical.dumps(document))


@pytest.mark.parametrize("damage", [
    lambda d: d.update(schema="prep.task/2"),
    lambda d: d.update(extra=1),
    lambda d: d["outputs"].update(intermediate="sha256:short"),
    lambda d: d["summary"].pop("lines"),
    lambda d: d.update(key="d" * 64),  # valid, but filed under another task's key
])
def test_a_task_record_of_another_shape_is_an_integrity_error_naming_its_key(store: LocalStore, damage: Any) -> None:
    document = records.TaskRecord("tokenize", KEY, {"intermediate": IDS[0]}, dict(TOKENIZE_SUMMARY)).to_json()
    damage(document)
    _put(store, task_record_key("tokenize", KEY), document)
    with pytest.raises(IntegrityError, match=task_record_key("tokenize", KEY)):
        records.read_task_record(store, "tokenize", KEY)


def test_an_unreadable_stage_record_is_an_integrity_error(store: LocalStore) -> None:
    store.put_bytes(stage_record_key("shard", KEY), b'{"schema": "prep.stage-record/1", ')
    with pytest.raises(IntegrityError, match=stage_record_key("shard", KEY)):
        records.stage_output_id(store, "shard", KEY)


def test_an_invalid_task_record_is_never_written(store: LocalStore) -> None:
    with pytest.raises(IntegrityError, match="prep.task/1"):
        records.write_task_record(store, "dedup", KEY, {"keep": IDS[2]}, {"documents_read": -1})
    assert not store.exists(task_record_key("dedup", KEY))


@pytest.mark.parametrize(("manifest", "named"), STAGE_MANIFESTS, ids=[m["stage"] for m, _ in STAGE_MANIFESTS])
def test_a_stage_manifest_names_what_its_kind_declares(manifest: dict[str, Any], named: set[str]) -> None:
    document = {"schema": "prep.stage/1", "key": KEY, **manifest}
    assert records.stage_manifest_names(document, "m") == records.Names(objects=frozenset(named))


@pytest.mark.parametrize("damage", [
    lambda d: d.update(stage="publish"),
    lambda d: d.update(schema="prep.stage/2"),
    lambda d: d.update(named_elsewhere=IDS[9]),
    lambda d: d["shards"][0]["outputs"].update(parquet=IDS[9]),
])
def test_a_stage_manifest_of_unknown_shape_is_refused(damage: Any) -> None:
    document = {"schema": "prep.stage/1", "key": KEY, **STAGE_MANIFESTS[3][0]}
    damage(document)
    with pytest.raises(IntegrityError, match="the manifest"):
        records.stage_manifest_names(document, "the manifest")


def test_a_snapshot_manifest_of_unknown_shape_is_refused() -> None:
    partial = {"schema": "prep.snapshot/1", "artifacts": [{"sha256": "7" * 64}],
               "stages": [{"name": "dedup", "key": KEY, "output": IDS[2]}]}
    with pytest.raises(IntegrityError, match="prep.snapshot/1"):
        records.snapshot_names(partial, "snap")
