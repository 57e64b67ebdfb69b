"""Every record a build leaves in a store matches its schema in manifests/, every key matches the
layout docs/store.md describes, and the schemas reject what the code never writes."""

from __future__ import annotations

import copy
import itertools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prep.config import load_pipeline
from prep.errors import IntegrityError
from prep.manifest import canonical
from prep.manifest.schema import validate
from prep.progress import Progress
from prep.runner.build import build
from prep.runner.executors.local import LocalExecutor
from prep.stages import read
from prep.storage import LocalStore
from prep.store import cas, records
from tests.helpers import make_records, write_jsonl, write_pipeline

HEX = "[0-9a-f]{64}"
NAME = "[A-Za-z0-9][A-Za-z0-9._-]*"
STAGES = ("tokenize", "dedup", "shuffle", "shard")
# The key patterns of docs/store.md, one per kind of key a build writes.
KEY_PATTERNS = {
    "object": r"objects/sha256/([0-9a-f]{2})/\1[0-9a-f]{62}",
    "task": rf"tasks/({'|'.join(STAGES)})/{HEX}\.json",
    "stage": rf"stages/({'|'.join(STAGES)})/{HEX}\.json",
    "snapshot": rf"snapshots/{HEX}",
    "ref": rf"refs/{NAME}/{NAME}\.json",
    "history": rf"history/{NAME}/{NAME}/[0-9]{{16}}\.json",
    "log": rf"logs/{NAME}/[0-9]{{8}}T[0-9]{{6}}Z-[0-9a-f]{{12}}\.json",
}
SCHEMA_OF = {"task": "prep.task/1", "stage": "prep.stage-record/1", "ref": "prep.ref/1",
             "history": "prep.ref/1", "log": "prep.build-log/1"}


@dataclass(frozen=True)
class Built:
    store: LocalStore
    snapshot_ids: tuple[str, ...]


def kind_of(key: str) -> str:
    for kind, pattern in KEY_PATTERNS.items():
        if re.fullmatch(pattern, key):
            return kind
    raise AssertionError(f"{key!r} matches no key pattern of docs/store.md")


def load(store: LocalStore, key: str) -> Any:
    return json.loads(store.get_bytes(key))


def keys_of(store: LocalStore, kind: str) -> list[str]:
    return [info.key for info in store.list("") if kind_of(info.key) == kind]


def write_parquet(path: Path, records: list[dict[str, Any]], rows_per_group: int) -> None:
    pq.write_table(pa.Table.from_pylist(records), path, row_group_size=rows_per_group)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, tokenizer_path: Path) -> Built:
    """One store after three builds of one dataset: a JSON Lines file split into byte ranges with
    a skipped bad line, a Parquet file split into row-group ranges, duplicates, a tag, and output
    formats bin+wds, then bin only, then wds only (so `latest` reaches generation 3)."""
    root = tmp_path_factory.mktemp("records")
    records = make_records(60, seed=5, prefix="j")
    write_jsonl(root / "corpus" / "a.jsonl", [*records, {"id": "j-again", "text": records[4]["text"]}])
    with open(root / "corpus" / "a.jsonl", "a", encoding="utf-8") as out:
        out.write('{"id": "broken", "text": \n')
    write_parquet(root / "corpus" / "b.parquet", make_records(50, seed=6, prefix="p"), rows_per_group=8)
    skip = 'on_error = "skip"\n'
    store_dir = root / "store"
    executor = LocalExecutor(1)  # one warm pool for the three builds keeps this fixture fast
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(read, "RANGE_BYTES", 1500)  # planning runs in the driver, workers get ranges
            ids = [build(load_pipeline(write_pipeline(root, tokenizer_path, ["corpus"], extra_input=skip,
                                                      shard_size="2KB", formats=formats, name=f"p{index}.toml")),
                         LocalStore(store_dir), executor, ("v1",) if index == 0 else (), Progress(quiet=True)).snapshot.id
                   for index, formats in enumerate(['["bin", "wds"]', '["bin"]', '["wds"]'])]
    finally:
        executor.close()
    return Built(LocalStore(store_dir), tuple(ids))


def test_every_key_matches_a_documented_pattern(built: Built) -> None:
    kinds = {kind_of(info.key) for info in built.store.list("")}
    assert kinds == set(KEY_PATTERNS)


def test_every_record_validates_against_its_schema(built: Built) -> None:
    store = built.store
    for key in (info.key for info in store.list("")):
        kind = kind_of(key)
        if kind in SCHEMA_OF:
            validate(load(store, key), SCHEMA_OF[kind], key)
    for key in keys_of(store, "stage"):
        output = load(store, key)["output"]
        validate(canonical.loads(cas.get_bytes(store, output)), "prep.stage/1", output)
    for key in keys_of(store, "snapshot"):
        snapshot_id = "sha256:" + key.rsplit("/", 1)[1]
        validate(canonical.loads(cas.get_bytes(store, snapshot_id)), "prep.snapshot/1", snapshot_id)
    assert {f"sha256:{key.rsplit('/', 1)[1]}" for key in keys_of(store, "snapshot")} == set(built.snapshot_ids)


def test_records_are_canonical_and_filed_under_their_own_key(built: Built) -> None:
    store = built.store
    for kind in ("task", "stage", "ref", "history"):
        for key in keys_of(store, kind):
            raw = store.get_bytes(key)
            record = canonical.loads(raw)
            assert canonical.dumps(record) == raw, key
            if kind in ("task", "stage"):
                assert key == f"{kind}s/{record['stage']}/{record['key']}.json"
    for key in keys_of(store, "history"):
        record = load(store, key)
        assert key == f"history/{record['dataset']}/{record['name']}/{record['generation']:016d}.json"
    for key in keys_of(store, "ref"):  # the current value's bytes equal its history record
        ref = load(store, key)
        history = f"history/{ref['dataset']}/{ref['name']}/{ref['generation']:016d}.json"
        assert store.get_bytes(history) == store.get_bytes(key)
    assert load(store, "refs/tiny/latest.json")["generation"] == 3
    assert load(store, "refs/tiny/v1.json")["snapshot"] == built.snapshot_ids[0]


def test_snapshot_stages_are_the_committed_stage_manifests(built: Built) -> None:
    store = built.store
    for snapshot_id in built.snapshot_ids:
        manifest = canonical.loads(cas.get_bytes(store, snapshot_id))
        assert [stage["name"] for stage in manifest["stages"]] == list(STAGES)
        for stage in manifest["stages"]:
            record = load(store, f"stages/{stage['name']}/{stage['key']}.json")
            assert record["output"] == stage["output"]
            body = canonical.loads(cas.get_bytes(store, stage["output"]))
            assert (body["stage"], body["key"]) == (stage["name"], stage["key"])


def test_every_object_a_record_names_is_stored_intact(built: Built) -> None:
    store = built.store
    for key in keys_of(store, "task"):
        for object_id in load(store, key)["outputs"].values():
            assert cas.check(store, object_id), (key, object_id)


def test_typed_records_round_trip_byte_for_byte(built: Built) -> None:
    """Reading a record into its type and writing it back gives exactly the stored bytes."""
    store = built.store
    for key in [*keys_of(store, "task"), *keys_of(store, "stage")]:
        raw = store.get_bytes(key)
        record = records.parse_record(key, raw, key)
        assert canonical.dumps(record.to_json()) == raw, key
        stage, task_key = key.removesuffix(".json").split("/")[1:]
        read = (records.read_task_record if key.startswith("tasks/") else records.read_stage_record)(store, stage, task_key)
        assert read == record, key


def test_typed_names_are_what_the_manifests_hold(built: Built) -> None:
    """What gc follows: a snapshot names its artifacts and stage manifests, a stage manifest its
    outputs by kind, a task record its outputs, a stage record its manifest."""
    store = built.store
    for snapshot_id in built.snapshot_ids:
        manifest = canonical.loads(cas.get_bytes(store, snapshot_id))
        names = records.snapshot_names(manifest, snapshot_id)
        assert names.objects == {f"sha256:{artifact['sha256']}" for artifact in manifest["artifacts"]}
        assert names.manifests == {stage["output"] for stage in manifest["stages"]}
        for stage in manifest["stages"]:
            body = canonical.loads(cas.get_bytes(store, stage["output"]))
            expected = {"tokenize": lambda b: {t["output"] for t in b["tasks"]},
                        "dedup": lambda b: {b["outputs"]["keep"]},
                        "shuffle": lambda b: {b["outputs"]["plan"]},
                        "shard": lambda b: {o for s in b["shards"] for o in s["outputs"].values()}}[stage["name"]](body)
            assert records.stage_manifest_names(body, stage["output"]) == records.Names(objects=frozenset(expected))
    for key in keys_of(store, "task"):
        assert records.parse_record(key, store.get_bytes(key), key).names().objects == set(load(store, key)["outputs"].values())
    for key in keys_of(store, "stage"):
        assert records.parse_record(key, store.get_bytes(key), key).names().manifests == {load(store, key)["output"]}


def test_tokenize_tasks_tile_each_input_file(built: Built) -> None:
    """Byte ranges for the JSON Lines file and row-group ranges for Parquet, without gaps."""
    store = built.store
    tokenize = [load(store, key) for key in keys_of(store, "stage") if key.startswith("stages/tokenize/")]
    assert len(tokenize) == 1  # all three builds share one tokenize stage
    entries = canonical.loads(cas.get_bytes(store, tokenize[0]["output"]))["tasks"]
    by_source: dict[str, list[dict[str, Any]]] = {}
    for entry in entries:
        by_source.setdefault(entry["source"], []).append(entry)
    corpus = Path(store.root).parent / "corpus"
    ends = {"a.jsonl": (corpus / "a.jsonl").stat().st_size,
            "b.parquet": pq.ParquetFile(corpus / "b.parquet").metadata.num_row_groups}
    assert sorted(by_source) == sorted(ends)
    for source, parts in by_source.items():
        assert len(parts) > 1, f"{source} should be split"
        assert [p["part"] for p in parts] == list(range(len(parts)))
        assert parts[0]["start"] == 0 and parts[-1]["end"] == ends[source]
        assert all(left["end"] == right["start"] for left, right in itertools.pairwise(parts))
    jsonl = by_source["a.jsonl"]
    assert [p["line_offset"] for p in jsonl] == [sum(p["lines"] for p in jsonl[:i]) for i in range(len(jsonl))]
    assert sum(p["bad_records"] for p in entries) == 1


# -- the schemas reject what the code never writes ---------------------------------------------

def _first(store: LocalStore, prefix: str) -> dict[str, Any]:
    key = next(info.key for info in store.list(prefix))
    record: dict[str, Any] = load(store, key)
    return record


def _stage_manifest(store: LocalStore, stage: str) -> dict[str, Any]:
    manifest: dict[str, Any] = canonical.loads(cas.get_bytes(store, _first(store, f"stages/{stage}/")["output"]))
    return manifest


Mutation = Callable[[dict[str, Any]], object]
MUTATIONS: list[tuple[str, str, Mutation]] = [
    ("task:tokenize", "prep.task/1", lambda d: d["summary"].pop("lines")),
    ("task:tokenize", "prep.task/1", lambda d: d["outputs"].update(plan=d["outputs"]["intermediate"])),
    ("task:dedup", "prep.task/1", lambda d: d.update(stage="publish")),
    ("task:shuffle", "prep.task/1", lambda d: d["summary"]["shards"][0].update(documents=0)),
    ("task:shard", "prep.task/1", lambda d: d["outputs"].pop("idx", None) or d["outputs"].pop("wds")),
    ("task:shard", "prep.task/1", lambda d: d.update(key="sha256:" + d["key"])),
    ("stage:tokenize", "prep.stage/1", lambda d: d["tasks"][0].pop("line_offset")),
    ("stage:dedup", "prep.stage/1", lambda d: d.update(shards=[])),
    ("stage:shuffle", "prep.stage/1", lambda d: d["outputs"].update(keep=d["outputs"]["plan"])),
    ("stage:shard", "prep.stage/1", lambda d: d["shards"][0].pop("sizes")),
    ("stage:shard", "prep.stage/1", lambda d: d.update(stage="tokenize")),
    ("record:shard", "prep.stage-record/1", lambda d: d.update(output=d["output"][7:])),
    ("ref", "prep.ref/1", lambda d: d.update(previous=d["snapshot"], generation=1)),
    ("ref", "prep.ref/1", lambda d: d.update(previous=None, generation=2)),
    ("ref", "prep.ref/1", lambda d: d.update(time="2025-01-01 00:00:00")),
    ("log", "prep.build-log/1", lambda d: d["stages"].update(publish={"key": "0" * 64, "ran": 0, "cached": 0})),
    ("log", "prep.build-log/1", lambda d: d["inputs"][0].pop("etag")),
]


def _sample(store: LocalStore, which: str) -> dict[str, Any]:
    kind, _, stage = which.partition(":")
    if kind == "task":
        return _first(store, f"tasks/{stage}/")
    if kind == "stage":
        return _stage_manifest(store, stage)
    if kind == "record":
        return _first(store, f"stages/{stage}/")
    return _first(store, {"ref": "refs/", "log": "logs/"}[kind])


@pytest.mark.parametrize(("which", "schema_id", "mutate"), MUTATIONS)
def test_schemas_reject_shapes_the_code_never_writes(built: Built, which: str, schema_id: str,
                                                     mutate: Mutation) -> None:
    document = copy.deepcopy(_sample(built.store, which))
    validate(document, schema_id)
    mutate(document)
    with pytest.raises(IntegrityError, match=re.escape(schema_id)):
        validate(document, schema_id)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.text(min_size=1, max_size=12))
def test_every_record_kind_is_closed_to_unknown_fields(built: Built, field: str) -> None:
    samples = [("task:tokenize", "prep.task/1"), ("task:shard", "prep.task/1"), ("stage:tokenize", "prep.stage/1"),
               ("stage:shard", "prep.stage/1"), ("record:dedup", "prep.stage-record/1"), ("ref", "prep.ref/1"),
               ("log", "prep.build-log/1")]
    for which, schema_id in samples:
        document = copy.deepcopy(_sample(built.store, which))
        if field in document:
            continue
        document[field] = 0
        with pytest.raises(IntegrityError):
            validate(document, schema_id)
