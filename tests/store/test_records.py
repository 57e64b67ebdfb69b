"""Typed commit records: they round-trip byte for byte, are validated when read, and say exactly
which objects they name; a record or manifest of any other shape is an IntegrityError."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from prep.errors import IntegrityError
from prep.manifest import canonical
from prep.storage import LocalStore
from prep.store import records
from prep.store.layout import stage_record_key, task_record_key
from tests.runner.buildsupport import RequestCountingStore

KEY = "c" * 64
IDS = [f"sha256:{digit * 64}" for digit in "0123456789"]
TOKENIZE_SUMMARY: dict[str, Any] = {"documents": 2, "tokens": 9, "text_bytes": 30, "bad_records": 1,
                                    "special_token_documents": 0, "lines": 3, "bad_record_examples": ["line 2: no text"]}


def tokenize_entry(output: str) -> dict[str, Any]:
    return {"source": "a.jsonl", "sha256": "e" * 64, "format": "jsonl", "part": 0, "start": 0, "end": 10, "key": KEY,
            "output": output, "line_offset": 0, **TOKENIZE_SUMMARY}


SHARD_SPEC = {"index": 0, "first_pos": 0, "documents": 2, "tokens": 11, "bin_size": 44, "tar_size": 0}  # layout 1
SHARD_PLAN = {"index": 0, "name": "0" * 16, "depth": 1, "slices": [[0, 0, 2]], "documents": 2, "tokens": 11,
              "bin_size": 22, "text_bytes": 30, "digest": "f" * 64}  # layout 2
LEAF = {"start": "0" * 16, "depth": 1, "first": 0, "count": 2, "tokens": 11, "bin_size": 22, "text_bytes": 30,
        "digest": "f" * 64}
BUCKET = {"bucket": 0, "key": KEY, "output": IDS[8], "documents_read": 3, "duplicates_dropped": 1, "documents": 2,
          "bin_size": 22, "text_bytes": 30, "digest": "f" * 64, "leaves": [LEAF]}
# One stage output manifest of each kind (every layout), and the ids it names.
STAGE_MANIFESTS: list[tuple[dict[str, Any], set[str]]] = [
    ({"stage": "tokenize", "tasks": [tokenize_entry(IDS[0]), tokenize_entry(IDS[1])]}, {IDS[0], IDS[1]}),
    ({"stage": "dedup", "outputs": {"keep": IDS[2]}, "documents_read": 2, "duplicates_dropped": 0}, {IDS[2]}),
    ({"stage": "shuffle", "outputs": {"plan": IDS[3]}, "shards": [SHARD_SPEC]}, {IDS[3]}),
    ({"stage": "shard", "shards": [{**SHARD_SPEC, "outputs": {"bin": IDS[4], "idx": IDS[5]}, "sizes": {"bin": 44, "idx": 9}},
                                   {**SHARD_SPEC, "index": 1, "outputs": {"wds": IDS[6]}, "sizes": {"wds": 1024}}]},
     {IDS[4], IDS[5], IDS[6]}),
    ({"stage": "route", "bits": 0, "tasks": [{"part": 0, "key": KEY, "output": IDS[7]}]}, {IDS[7]}),
    ({"stage": "order", "bits": 0, "buckets": [BUCKET]}, {IDS[8]}),
    ({"stage": "shard", "shards": [{**SHARD_PLAN, "outputs": {"wds": IDS[9]}, "sizes": {"wds": 2048}}]}, {IDS[9]}),
    ({"stage": "tokenize", "tasks": [{**tokenize_entry(IDS[0]), "entries": IDS[1]}]}, {IDS[0], IDS[1]}),  # layout 3
]
LAYOUT_2_SHARD = STAGE_MANIFESTS[6][0]


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
    assert record.names() == records.Names(manifests=frozenset({records.ManifestRef(output, "dedup")}))
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


@pytest.mark.parametrize(("manifest", "named"), STAGE_MANIFESTS,
                         ids=[f"{m['stage']}-{i}" for i, (m, _) in enumerate(STAGE_MANIFESTS)])
def test_a_stage_manifest_names_what_its_kind_declares(manifest: dict[str, Any], named: set[str]) -> None:
    document = {"schema": "prep.stage/1", "key": KEY, **manifest}
    assert records.stage_manifest_names(document, "m") == records.Names(objects=frozenset(named))


@pytest.mark.parametrize("damage", [
    lambda d: d.update(stage="publish"),
    lambda d: d.update(schema="prep.stage/2"),
    lambda d: d.update(named_elsewhere=IDS[9]),
    lambda d: d["shards"][0]["outputs"].update({"Parquet files": IDS[9]}),  # format names are data, of one pattern
    lambda d: d["shards"][0]["outputs"].update(parquet=12),
])
def test_a_stage_manifest_of_unknown_shape_is_refused(damage: Any) -> None:
    document = copy.deepcopy({"schema": "prep.stage/1", "key": KEY, **STAGE_MANIFESTS[3][0]})
    damage(document)
    with pytest.raises(IntegrityError, match="the manifest"):
        records.stage_manifest_names(document, "the manifest")


@pytest.mark.parametrize("damage", [
    lambda d: d["shards"][0].update(first_pos=0, tar_size=0),  # one entry of both layouts
    lambda d: d["shards"][0].update(tar_size=0),  # a layout-2 entry with a layout-1 field
    lambda d: d["shards"].append({**SHARD_SPEC, "index": 1, "outputs": {"wds": IDS[6]}, "sizes": {"wds": 1024}}),
    lambda d: d["shards"][0].update(slices=[]),
    lambda d: d["shards"][0].update(slices=[[0, 0, 0]]),
    lambda d: d["shards"][0]["slices"][0].append(2),
    lambda d: d["shards"][0].update(name="00000"),
])
def test_a_layout_2_shard_manifest_of_another_shape_is_refused(damage: Any) -> None:
    document = copy.deepcopy({"schema": "prep.stage/1", "key": KEY, **LAYOUT_2_SHARD})
    records.stage_manifest_names(document, "the manifest")
    damage(document)
    with pytest.raises(IntegrityError, match="the manifest: does not match prep.stage/1"):
        records.stage_manifest_names(document, "the manifest")


@pytest.mark.parametrize(("manifest", "stage", "layouts"), [
    (STAGE_MANIFESTS[0][0], "tokenize", {1, 2, 3}), (STAGE_MANIFESTS[1][0], "dedup", {1}),
    (STAGE_MANIFESTS[2][0], "shuffle", {1}), (STAGE_MANIFESTS[3][0], "shard", {1}), (STAGE_MANIFESTS[4][0], "route", {2}),
    (STAGE_MANIFESTS[5][0], "order", {2, 3}), (LAYOUT_2_SHARD, "shard", {2, 3}),
    ({"stage": "shard", "shards": []}, "shard", {1, 2, 3}), (STAGE_MANIFESTS[7][0], "tokenize", {1, 2, 3}),
])
def test_a_stage_manifest_has_the_stage_and_layouts_it_holds(manifest: dict[str, Any], stage: str, layouts: set[int]) -> None:
    document = {"schema": "prep.stage/1", "key": KEY, **manifest}
    records.stage_manifest_names(document, "m")
    shape = records.stage_shape(document)
    assert shape == records.StageShape(stage, frozenset(layouts))
    for layout in (1, 2, 3, None):
        named_as = records.ManifestRef(IDS[0], stage, layout)
        if layout is None or layout in layouts:
            records.check_named(shape, named_as, "m")
        else:
            with pytest.raises(IntegrityError, match=f"m: a {stage} stage manifest of layout .*, named by a layout {layout}"):
                records.check_named(shape, named_as, "m")
    other = "order" if stage != "order" else "dedup"
    with pytest.raises(IntegrityError, match=f"m: a {stage} stage manifest, named as the {other} stage"):
        records.check_named(shape, records.ManifestRef(IDS[0], other), "m")


def _snapshot(names: list[str]) -> dict[str, Any]:
    """A schema-valid snapshot manifest with these stages."""
    return {"schema": "prep.snapshot/1", "dataset": "tiny", "seed": 0,
            "inputs": {"version": IDS[0], "files": [{"path": "a.jsonl", "size": 10, "sha256": "e" * 64}]},
            "code": {"version": "0.1.0", "sha256": "e" * 64, "dependencies": {}},
            "tokenizer": {"sha256": "e" * 64, "vocab_size": 1000, "eos": "<|endoftext|>", "eos_id": 0, "dtype": "uint16",
                          "encode_special_tokens": False},
            "config": {}, "stages": [{"name": name, "key": KEY, "output": IDS[i]} for i, name in enumerate(names)],
            "artifacts": [{"path": "wds/0000000000000000.tar", "format": "wds", "shard": 0, "size": 2048,
                           "sha256": "9" * 64, "documents": 2, "tokens": 11}],
            "stats": {"documents_read": 3, "duplicates_dropped": 1, "documents_written": 2, "tokens_written": 11,
                      "bad_records_skipped": 0, "special_token_documents": 0}}


@pytest.mark.parametrize("layout", [1, 2])
def test_a_snapshot_names_its_stage_manifests_as_stages_of_its_layout(layout: int) -> None:
    names = records.snapshot_names(_snapshot(list(records.LAYOUTS[layout])), "snap")
    assert names.objects == {IDS[9]}
    assert names.manifests == {records.ManifestRef(IDS[i], stage, layout) for i, stage in enumerate(records.LAYOUTS[layout])}


@pytest.mark.parametrize("stages", [["tokenize", "dedup", "order", "shard"], ["tokenize", "route", "order"],
                                    ["tokenize", "order", "route", "shard"], [],
                                    ["tokenize", "dedup", "shuffle", "shard", "shard"]])
def test_a_snapshot_whose_stages_are_no_layout_is_refused(stages: list[str]) -> None:
    with pytest.raises(IntegrityError, match="snap: stages .* are no snapshot layout"):
        records.snapshot_names(_snapshot(stages), "snap")


def test_a_snapshot_manifest_of_unknown_shape_is_refused() -> None:
    partial = {"schema": "prep.snapshot/1", "artifacts": [{"sha256": "7" * 64}],
               "stages": [{"name": "dedup", "key": KEY, "output": IDS[2]}]}
    with pytest.raises(IntegrityError, match="prep.snapshot/1"):
        records.snapshot_names(partial, "snap")


def test_a_commit_is_one_put_and_a_lookup_one_get(tmp_path: Path) -> None:
    store = RequestCountingStore(tmp_path / "store")
    assert records.read_task_record(store, "toy", KEY) is None
    assert store.requests == {"put": 0, "get": 1, "head": 0, "list": 0}
    written = records.write_task_record(store, "toy", KEY, {"out": IDS[0]}, {"n": 1})
    assert store.requests == {"put": 1, "get": 1, "head": 0, "list": 0}
    assert records.read_task_record(store, "toy", KEY) == written
    assert store.requests == {"put": 1, "get": 2, "head": 0, "list": 0}


def test_a_commit_meeting_another_writers_record_reads_it_and_refuses_other_outputs(tmp_path: Path) -> None:
    store = RequestCountingStore(tmp_path / "store")
    first = records.write_task_record(store, "toy", KEY, {"out": IDS[0]}, {"n": 1})
    assert records.write_task_record(store, "toy", KEY, {"out": IDS[0]}, {"n": 2}) == first
    with pytest.raises(IntegrityError, match="committed with different outputs"):
        records.write_task_record(store, "toy", KEY, {"out": IDS[1]}, {"n": 1})
    assert records.read_task_record(store, "toy", KEY) == first


def test_an_alias_record_is_one_put_and_the_first_one_stays(tmp_path: Path) -> None:
    store = RequestCountingStore(tmp_path / "store")
    records.write_alias_record(store, "steps", KEY, {"outcomes": IDS[0]})
    records.write_alias_record(store, "steps", KEY, {"outcomes": IDS[1]})
    assert store.requests == {"put": 2, "get": 0, "head": 0, "list": 0}
    found = records.read_task_record(store, "steps", KEY)
    assert found is not None and found.outputs == {"outcomes": IDS[0]}
