"""Every record a build leaves in a store matches its schema in manifests/, every key matches the
layout docs/store.md describes, and the schemas reject what the code never writes."""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import re
import shutil
import struct
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
from prep.runner import driver
from prep.runner.build import build
from prep.runner.executors.pool import LocalExecutor
from prep.stages import read
from prep.storage import LocalStore
from prep.store import cas, records
from prep.workfiles.intermediate import read_columns
from tests.helpers import make_records, write_jsonl, write_pipeline
from tests.store.layout1 import plant_layout1
from tests.store.layout2 import plant_layout2

HEX = "[0-9a-f]{64}"
NAME = "[A-Za-z0-9][A-Za-z0-9._-]*"
STAGES = records.LAYOUTS[3]  # what a build writes now: tokenize, order, shard
STAGE_NAMES = ("tokenize", "dedup", "shuffle", "route", "order", "shard")  # docs/store.md: every layout
# The key patterns of docs/store.md, one per kind of key a build writes.
KEY_PATTERNS = {
    "object": r"objects/sha256/([0-9a-f]{2})/\1[0-9a-f]{62}",
    "task": rf"tasks/({'|'.join(STAGE_NAMES)})/{HEX}\.json",
    "stage": rf"stages/({'|'.join(STAGE_NAMES)})/{HEX}\.json",
    "pack": rf"packs/({'|'.join(STAGE_NAMES)})/{HEX}/{HEX}-{HEX}\.json",
    "snapshot": rf"snapshots/{HEX}",
    "ref": rf"refs/{NAME}/{NAME}\.json",
    "history": rf"history/{NAME}/{NAME}/[0-9]{{16}}\.json",
    "log": rf"logs/{NAME}/[0-9]{{8}}T[0-9]{{6}}Z-[0-9a-f]{{12}}\.json",
    "readback": rf"readback/{HEX}\.json",
    "retention": rf"retention/{NAME}/[0-9]{{16}}\.json",
    "proven": r"proven/objects\.jsonl",  # JSON Lines, advisory: no schema (prep.store.proven)
}
SCHEMA_OF = {"task": "prep.task/1", "pack": "prep.task-pack/1", "stage": "prep.stage-record/1", "ref": "prep.ref/1",
             "history": "prep.ref/1", "log": "prep.build-log/2", "readback": "prep.readback/1",
             "retention": "prep.retention/1"}


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
    ids = []
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(read, "RANGE_BYTES", 1500)  # planning runs in the driver, workers get ranges
            for index, formats in enumerate(['["bin", "wds"]', '["bin"]', '["wds"]']):
                # The first build commits a record a task (as a store of an older prep holds them),
                # the others in groups (packs), finding the first build's records and packing them.
                patch.setattr(driver, "PACK_RECORDS", 0 if index == 0 else 1000)
                pipeline = load_pipeline(write_pipeline(root, tokenizer_path, ["corpus"], extra_input=skip,
                                                        shard_size="2KB", formats=formats, name=f"p{index}.toml"))
                ids.append(build(pipeline, LocalStore(store_dir), executor, ("v1",) if index == 0 else (),
                                 Progress(quiet=True)).snapshot.id)
    finally:
        executor.close()
    return Built(LocalStore(store_dir), tuple(ids))


def test_every_key_matches_a_documented_pattern(built: Built) -> None:
    kinds = {kind_of(info.key) for info in built.store.list("")}
    assert kinds == set(KEY_PATTERNS)


@pytest.fixture(scope="module")
def with_old_layouts(built: Built, tmp_path_factory: pytest.TempPathFactory) -> Built:
    """A copy of the built store that also holds a layout-1 snapshot (tokenize, dedup, shuffle,
    shard) and then a layout-2 one (tokenize, route, order, shard) over the same intermediates,
    as a store that older builds wrote to does."""
    root = tmp_path_factory.mktemp("layouts") / "store"
    shutil.copytree(built.store.root, root, symlinks=True)
    store = LocalStore(root)
    old = plant_layout1(store, built.snapshot_ids[0]).snapshot.id
    return Built(store, (*built.snapshot_ids, old, plant_layout2(store, built.snapshot_ids[0]).snapshot.id))


def _validate_every_record(store: LocalStore) -> set[str]:
    """Validate every record, stage manifest and snapshot of `store`; the stages it holds records of."""
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
    return {key.split("/")[1] for key in keys_of(store, "task") + keys_of(store, "stage")}


def test_every_record_validates_against_its_schema(built: Built) -> None:
    store = built.store
    assert _validate_every_record(store) == set(STAGES)
    assert {f"sha256:{key.rsplit('/', 1)[1]}" for key in keys_of(store, "snapshot")} == set(built.snapshot_ids)


def test_records_of_every_layout_in_one_store_validate(with_old_layouts: Built) -> None:
    """Old stores keep their layout-1 and layout-2 records: they validate beside the new ones."""
    assert _validate_every_record(with_old_layouts.store) == set(STAGE_NAMES)


def test_records_are_canonical_and_filed_under_their_own_key(built: Built) -> None:
    store = built.store
    for kind in ("task", "stage", "ref", "history", "pack"):
        for key in keys_of(store, kind):
            raw = store.get_bytes(key)
            record = canonical.loads(raw)
            assert canonical.dumps(record) == raw, key
            if kind in ("task", "stage"):
                assert key == f"{kind}s/{record['stage']}/{record['key']}.json"
            if kind == "pack":  # named by its plan and its bytes; its records filed under their own keys
                assert key.endswith(f"/{record['plan']}-{hashlib.sha256(raw).hexdigest()}.json"), key
                for task_key, body in record["records"].items():
                    assert (body["stage"], body["key"]) == (record["stage"], task_key), key
                    single = f"tasks/{record['stage']}/{task_key}.json"
                    assert not store.exists(single) or load(store, single) == body, key
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
    assert keys_of(store, "task") and keys_of(store, "pack")
    held = [load(store, key) for key in keys_of(store, "task")]
    held += [body for key in keys_of(store, "pack") for body in load(store, key)["records"].values()]
    for record in held:
        for object_id in record["outputs"].values():
            assert cas.check(store, object_id), (record["stage"], record["key"], object_id)


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


def _table(body: dict[str, Any]) -> set[str]:
    """The part table an order or shard manifest names: every one this code writes has one."""
    return {body["parts_table"]} if "parts_table" in body else set()


EXPECTED_NAMES: dict[str, Callable[[dict[str, Any]], set[str]]] = {
    "tokenize": lambda b: {t["output"] for t in b["tasks"]} | {t["entries"] for t in b["tasks"] if "entries" in t}
    | {oid for t in b["tasks"] for oid in t.get("step_outcomes", ())},
    "dedup": lambda b: {b["outputs"]["keep"]},  # layout 1
    "shuffle": lambda b: {b["outputs"]["plan"]},  # layout 1
    "route": lambda b: {t["output"] for t in b["tasks"]},  # layout 2
    "order": lambda b: {bucket["output"] for bucket in b["buckets"]} | _table(b) | set(b.get("id_checks", ())),  # layouts 2, 3
    "shard": lambda b: {o for s in b["shards"] for o in s["outputs"].values()} | _table(b),
}


def _check_typed_names(store: LocalStore, layouts: dict[str, int]) -> None:
    for snapshot_id, layout in layouts.items():
        manifest = canonical.loads(cas.get_bytes(store, snapshot_id))
        names = records.snapshot_names(manifest, snapshot_id)
        carried = {manifest["tokenizer"]["object"]} if "object" in manifest["tokenizer"] else set()
        assert names.objects == {f"sha256:{artifact['sha256']}" for artifact in manifest["artifacts"]} | carried
        assert names.manifests == {records.ManifestRef(stage["output"], stage["name"], layout) for stage in manifest["stages"]}
        assert [stage["name"] for stage in manifest["stages"]] == list(records.LAYOUTS[layout])
        for stage in manifest["stages"]:
            body = canonical.loads(cas.get_bytes(store, stage["output"]))
            expected = EXPECTED_NAMES[stage["name"]](body)
            assert expected, stage
            assert records.stage_manifest_names(body, stage["output"]) == records.Names(objects=frozenset(expected))
            shape = records.stage_shape(body)
            assert shape.stage == stage["name"] and layout in shape.layouts
            records.check_named(shape, records.ManifestRef(stage["output"], stage["name"], layout), stage["output"])
    for key in keys_of(store, "task"):
        assert records.parse_record(key, store.get_bytes(key), key).names().objects == set(load(store, key)["outputs"].values())
    for key in keys_of(store, "stage"):
        record = load(store, key)
        assert records.parse_record(key, store.get_bytes(key), key).names().manifests == \
            {records.ManifestRef(record["output"], record["stage"])}


def test_typed_names_are_what_the_manifests_hold(built: Built) -> None:
    """What gc follows: a snapshot names its artifacts and stage manifests (as stages of its
    layout), a stage manifest its outputs by kind, a task record its outputs, a stage record its
    manifest (as its stage)."""
    _check_typed_names(built.store, dict.fromkeys(built.snapshot_ids, 3))


def test_typed_names_of_old_layout_snapshots_are_what_their_manifests_hold(with_old_layouts: Built) -> None:
    *new, layout1, layout2 = with_old_layouts.snapshot_ids
    _check_typed_names(with_old_layouts.store, {**dict.fromkeys(new, 3), layout1: 1, layout2: 2})


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


# -- entries objects have the layout docs/manifests.md gives, field by field ------------------------

# key_hi, key_lo, part, row, text_offset, text_bytes, tokens_offset, n_tokens, id_offset, id_len, flags
ENTRY = struct.Struct("<QQIIQQQQQII")
NO_ID = 0xFFFFFFFF


def _parse_entries(raw: bytes) -> tuple[dict[str, Any], list[int], list[tuple[int, ...]], bytes]:
    """An entries object read as documented: magic, u64 header length, canonical JSON header,
    for kind part an index of 2**index_bits + 1 u32 counts, 72-byte little-endian entries, the
    ids blob to the end."""
    assert raw[:8] == b"PREPENT1"
    (length,) = struct.unpack_from("<Q", raw, 8)
    body = raw[16:16 + length]
    header: dict[str, Any] = canonical.loads(body)
    assert canonical.dumps(header) == body
    start = 16 + length
    index: list[int] = []
    if header["kind"] == "part":
        index = list(struct.unpack_from(f"<{(1 << header['index_bits']) + 1}I", raw, start))
        start += 4 * len(index)
    entries = [ENTRY.unpack_from(raw, start + at * ENTRY.size) for at in range(header["count"])]
    assert ENTRY.size == 72
    return header, index, entries, raw[start + header["count"] * ENTRY.size:]


def _ids_in_entry_order(entries: list[tuple[int, ...]], blob: bytes) -> list[str | None]:
    ids: list[str | None] = []
    offset = 0
    for entry in entries:
        id_offset, id_len, flags = entry[8:]
        assert flags == 0
        if id_len == NO_ID:
            ids.append(None)
            continue
        assert id_offset == offset  # ids back to back, in entry order
        ids.append(blob[offset:offset + id_len].decode("utf-8", "surrogatepass"))
        offset += id_len
    assert offset == len(blob)
    return ids


def test_entries_objects_have_the_documented_layout(built: Built) -> None:
    store = built.store
    order = _stage_manifest(store, "order")
    parts = _stage_manifest(store, "tokenize")["tasks"]
    bits = order["bits"]
    documents: dict[tuple[int, int], tuple[Any, ...]] = {}  # (part, row) -> what its intermediate says
    for ordinal, part in enumerate(parts):
        path = store.root / cas.object_key(part["output"].removeprefix("sha256:"))
        table = read_columns(path, ["row", "id", "text_bytes", "n_tokens", "text_offset", "tokens_offset"]).to_pylist()
        documents |= {(ordinal, row["row"]): (row["text_offset"], row["text_bytes"], row["tokens_offset"], row["n_tokens"],
                                              row["id"]) for row in table}
    read = 0
    for ordinal, part in enumerate(parts):  # a part's entries: every document, in key order, indexed
        header, index, entries, blob = _parse_entries(cas.get_bytes(store, part["entries"]))
        count = part["documents"]
        assert header == {"schema": "prep.entries/1", "kind": "part", "index_bits": max(0, count - 1).bit_length(),
                          "count": count}
        shift = 64 - header["index_bits"]
        prefixes = [entry[0] >> shift if header["index_bits"] else 0 for entry in entries]
        assert index == [sum(p < at for p in prefixes) for at in range(len(index))]
        assert [(e[0], e[1], e[3]) for e in entries] == sorted((e[0], e[1], e[3]) for e in entries)
        for entry, doc_id in zip(entries, _ids_in_entry_order(entries, blob)):
            assert entry[2] == 0 and (*entry[4:8], doc_id) == documents[ordinal, entry[3]]
        assert sorted(e[3] for e in entries) == sorted(row for at, row in documents if at == ordinal)
        read += len(entries)
    kept = 0
    for bucket in order["buckets"]:
        header, _, entries, blob = _parse_entries(cas.get_bytes(store, bucket["output"]))
        assert header == {"schema": "prep.entries/1", "kind": "bucket", "bits": bits, "bucket": bucket["bucket"],
                          "count": bucket["documents"]}
        keys = [(e[0], e[1], e[2], e[3]) for e in entries]
        assert keys == sorted(keys) and len({key[:2] for key in keys}) == len(keys)  # exact dedup: keys unique
        assert _ids_in_entry_order(entries, blob) == [documents[e[2], e[3]][4] for e in entries]
        covered = 0
        for leaf in bucket["leaves"]:  # leaves tile the bucket's entries and hold their key ranges
            assert leaf["first"] == covered and leaf["count"] >= 1
            start, width = int(leaf["start"], 16), 1 << (64 - leaf["depth"])
            chunk = entries[leaf["first"]:leaf["first"] + leaf["count"]]
            assert all(start <= e[0] < start + width for e in chunk)
            assert leaf["tokens"] == sum(e[7] + 1 for e in chunk) and leaf["text_bytes"] == sum(e[5] for e in chunk)
            covered += leaf["count"]
        assert covered == len(entries)
        kept += len(entries)
    assert sum(b["documents_read"] for b in order["buckets"]) == read == len(documents)
    assert kept == read - sum(b["duplicates_dropped"] for b in order["buckets"]) < read


# -- the schemas reject what the code never writes ---------------------------------------------

def _first(store: LocalStore, prefix: str) -> dict[str, Any]:
    key = next(info.key for info in store.list(prefix))
    record: dict[str, Any] = load(store, key)
    return record


def _stage_manifest(store: LocalStore, stage: str) -> dict[str, Any]:
    manifest: dict[str, Any] = canonical.loads(cas.get_bytes(store, _first(store, f"stages/{stage}/")["output"]))
    return manifest


def _stage_manifests(store: LocalStore, stage: str) -> list[dict[str, Any]]:
    return [canonical.loads(cas.get_bytes(store, load(store, info.key)["output"])) for info in store.list(f"stages/{stage}/")]


Mutation = Callable[[dict[str, Any]], object]
MUTATIONS: list[tuple[str, str, Mutation]] = [
    ("task:tokenize", "prep.task/1", lambda d: d["summary"].pop("lines")),
    ("task:tokenize", "prep.task/1", lambda d: d["outputs"].update(plan=d["outputs"]["intermediate"])),
    ("task:tokenize", "prep.task/1", lambda d: d["outputs"].update(entries=d["outputs"]["entries"][7:])),
    ("task:order", "prep.task/1", lambda d: d.update(stage="dedup")),
    ("task:order", "prep.task/1", lambda d: d["summary"]["leaves"][0].update(start="0")),
    ("task:order", "prep.task/1", lambda d: d["summary"]["leaves"][0].update(count=0)),
    ("task:order", "prep.task/1", lambda d: d["summary"].pop("digest")),
    ("task:shard", "prep.task/1", lambda d: d["outputs"].pop("idx", None) or d["outputs"].pop("wds")),
    ("task:shard", "prep.task/1", lambda d: d.update(key="sha256:" + d["key"])),
    ("stage:tokenize", "prep.stage/1", lambda d: d["tasks"][0].pop("line_offset")),
    ("stage:tokenize", "prep.stage/1", lambda d: d["tasks"][0].update(entries="sha256:" + "0" * 63)),
    ("stage:order", "prep.stage/1", lambda d: d.update(bits=21)),
    ("stage:order", "prep.stage/1", lambda d: d["buckets"][0].pop("leaves")),
    ("stage:order", "prep.stage/1", lambda d: d["buckets"][0].update(outputs={"bucket": d["buckets"][0]["output"]})),
    ("stage:order", "prep.stage/1", lambda d: d.update(shards=[])),
    ("stage:shard", "prep.stage/1", lambda d: d["shards"][0].pop("sizes")),
    ("stage:shard", "prep.stage/1", lambda d: d["shards"][0].pop("slices")),
    ("stage:shard", "prep.stage/1", lambda d: d["shards"][0].update(name="00000")),
    ("stage:shard", "prep.stage/1", lambda d: d["shards"][0]["slices"][0].append(0)),
    ("stage:shard", "prep.stage/1", lambda d: d["shards"][0].update(slices=[])),
    ("stage:shard", "prep.stage/1", lambda d: d["shards"][0].update(tar_size=0)),
    ("stage:shard", "prep.stage/1", lambda d: d.update(stage="tokenize")),
    ("record:shard", "prep.stage-record/1", lambda d: d.update(output=d["output"][7:])),
    ("ref", "prep.ref/1", lambda d: d.update(previous=d["snapshot"], generation=1)),
    ("ref", "prep.ref/1", lambda d: d.update(previous=None, generation=2)),
    ("ref", "prep.ref/1", lambda d: d.update(time="2025-01-01 00:00:00")),
    ("log", "prep.build-log/2", lambda d: d["stages"].update(publish={"key": "0" * 64, "ran": 0, "cached": 0})),
    ("log", "prep.build-log/2", lambda d: d["stages"].update(dedup={"key": "0" * 64, "ran": 0, "cached": 1})),
    ("log", "prep.build-log/2", lambda d: d["inputs"][0].pop("etag")),
    ("snapshot", "prep.snapshot/1", lambda d: d["stages"][1].update(name="publish")),
]
# Layout-1 and layout-2 records, which old stores still hold, sampled from the planted snapshots.
OLD_LAYOUT_MUTATIONS: list[tuple[str, str, Mutation]] = [
    ("task:route", "prep.task/1", lambda d: d.update(stage="tokenize")),  # a known stage, another shape
    ("task:route", "prep.task/1", lambda d: d["outputs"].update(bucket=d["outputs"]["route"])),
    ("task:route", "prep.task/1", lambda d: d["summary"].update(buckets=[d["summary"]["documents"]])),
    ("stage:route", "prep.stage/1", lambda d: d.update(bits=21)),
    ("stage:route", "prep.stage/1", lambda d: d["tasks"][0].update(documents=1)),
    ("stage:route", "prep.stage/1", lambda d: d.update(outputs={"plan": d["tasks"][0]["output"]})),
    ("task:dedup", "prep.task/1", lambda d: d.update(stage="Dedup")),  # not a stage name
    ("task:dedup", "prep.task/1", lambda d: d["outputs"].update(route=d["outputs"]["keep"])),
    ("task:shuffle", "prep.task/1", lambda d: d["summary"]["shards"][0].update(documents=0)),
    ("task:shuffle", "prep.task/1", lambda d: d["summary"]["shards"][0].update(name="0" * 16)),
    ("stage:dedup", "prep.stage/1", lambda d: d.update(shards=[])),
    ("stage:dedup", "prep.stage/1", lambda d: d.update(bits=0)),
    ("stage:shuffle", "prep.stage/1", lambda d: d["outputs"].update(keep=d["outputs"]["plan"])),
    ("stage:shuffle", "prep.stage/1", lambda d: d["shards"][0].update(digest="0" * 64)),
    ("stage:shard", "prep.stage/1", lambda d: d["shards"][0].pop("tar_size")),
    ("stage:shard", "prep.stage/1", lambda d: d["shards"][0].update(depth=1)),
]


def _sample(store: LocalStore, which: str, layout: int = 3) -> dict[str, Any]:
    """The first record of a kind; for the stage shared by every layout, shard, one of `layout`."""
    kind, _, stage = which.partition(":")
    if kind == "task":
        return _first(store, f"tasks/{stage}/")
    if kind == "stage" and stage == "shard":
        return next(manifest for manifest in _stage_manifests(store, stage)
                    if layout in records.stage_shape(manifest).layouts)
    if kind == "stage":
        return _stage_manifest(store, stage)
    if kind == "record":
        return _first(store, f"stages/{stage}/")
    if kind == "snapshot":
        manifest: dict[str, Any] = canonical.loads(cas.get_bytes(store, load(store, "refs/tiny/latest.json")["snapshot"]))
        return manifest
    return _first(store, {"ref": "refs/", "log": "logs/"}[kind])


@pytest.mark.parametrize(("which", "schema_id", "mutate"), MUTATIONS)
def test_schemas_reject_shapes_the_code_never_writes(built: Built, which: str, schema_id: str,
                                                     mutate: Mutation) -> None:
    document = copy.deepcopy(_sample(built.store, which))
    validate(document, schema_id)
    mutate(document)
    with pytest.raises(IntegrityError, match=re.escape(schema_id)):
        validate(document, schema_id)


@pytest.mark.parametrize(("which", "schema_id", "mutate"), OLD_LAYOUT_MUTATIONS)
def test_schemas_reject_old_layout_shapes_the_code_never_wrote(with_old_layouts: Built, which: str, schema_id: str,
                                                               mutate: Mutation) -> None:
    document = copy.deepcopy(_sample(with_old_layouts.store, which, layout=1))
    validate(document, schema_id)
    mutate(document)
    with pytest.raises(IntegrityError, match=re.escape(schema_id)):
        validate(document, schema_id)


def _shard_manifests(store: LocalStore) -> tuple[dict[str, Any], dict[str, Any]]:
    """A real shard stage manifest of each shape: positional (layout 1, from the planted
    snapshot) and keyed (layouts 2 and 3)."""
    manifests = _stage_manifests(store, "shard")
    first, second = ([m for m in manifests if records.stage_shape(m).layouts == shape][0] for shape in ({1}, {2, 3}))
    return copy.deepcopy(first), copy.deepcopy(second)


MIXES: list[tuple[str, Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]]] = [
    ("a layout-2 entry with every layout-1 field", lambda old, new: {**old, **new}),
    ("a layout-1 entry with every layout-2 field", lambda old, new: {**new, **old}),
    ("a layout-2 entry with first_pos", lambda old, new: {**new, "first_pos": old["first_pos"]}),
    ("a layout-2 entry with tar_size", lambda old, new: {**new, "tar_size": old["tar_size"]}),
    ("a layout-1 entry with a name", lambda old, new: {**old, "name": new["name"]}),
    ("a layout-1 entry with slices", lambda old, new: {**old, "slices": new["slices"]}),
    ("a layout-1 entry with a digest", lambda old, new: {**old, "digest": new["digest"]}),
]


@pytest.mark.parametrize(("mix", "entry"), MIXES, ids=[mix for mix, _ in MIXES])
def test_a_shard_entry_mixing_the_layouts_is_refused(with_old_layouts: Built, mix: str,
                                                     entry: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]) -> None:
    """shard_spec (layout 1) and shard_plan (layout 2) are each closed: an entry is one or the other."""
    old, new = _shard_manifests(with_old_layouts.store)
    for manifest in (old, new):
        validate(manifest, "prep.stage/1")
        manifest["shards"][0] = entry(old["shards"][0], new["shards"][0])
        with pytest.raises(IntegrityError, match=r"does not match prep\.stage/1 at shards"):
            validate(manifest, "prep.stage/1")


def test_a_shard_manifest_listing_entries_of_both_layouts_is_refused(with_old_layouts: Built) -> None:
    old, new = _shard_manifests(with_old_layouts.store)
    old_entry, new_entry = copy.deepcopy(old["shards"][0]), copy.deepcopy(new["shards"][0])
    for manifest, other in ((old, new_entry), (new, old_entry)):
        manifest["shards"].append({**other, "index": len(manifest["shards"])})
        with pytest.raises(IntegrityError, match=r"does not match prep\.stage/1 at shards"):
            validate(manifest, "prep.stage/1")
        manifest["shards"] = [other]  # an entry of the other layout alone is fine
        validate(manifest, "prep.stage/1")


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.text(min_size=1, max_size=12))
def test_every_record_kind_is_closed_to_unknown_fields(built: Built, field: str) -> None:
    samples = [("task:tokenize", "prep.task/1"), ("task:order", "prep.task/1"),
               ("task:shard", "prep.task/1"), ("stage:tokenize", "prep.stage/1"),
               ("stage:order", "prep.stage/1"), ("stage:shard", "prep.stage/1"), ("record:order", "prep.stage-record/1"),
               ("ref", "prep.ref/1"), ("log", "prep.build-log/2"), ("snapshot", "prep.snapshot/1")]
    for which, schema_id in samples:
        document = copy.deepcopy(_sample(built.store, which))
        if field in document:
            continue
        document[field] = 0
        with pytest.raises(IntegrityError):
            validate(document, schema_id)
    for which, schema_id, inner in NESTED:  # entries inside records are closed too
        document = copy.deepcopy(_sample(built.store, which))
        entry = inner(document)
        if field in entry:
            continue
        entry[field] = 0
        with pytest.raises(IntegrityError):
            validate(document, schema_id)


NESTED: list[tuple[str, str, Callable[[dict[str, Any]], dict[str, Any]]]] = [
    ("stage:tokenize", "prep.stage/1", lambda d: d["tasks"][0]),
    ("task:tokenize", "prep.task/1", lambda d: d["outputs"]),
    ("stage:order", "prep.stage/1", lambda d: d["buckets"][0]),
    ("stage:order", "prep.stage/1", lambda d: d["buckets"][0]["leaves"][0]),
    ("task:order", "prep.task/1", lambda d: d["summary"]["leaves"][0]),
    ("stage:shard", "prep.stage/1", lambda d: d["shards"][0]),
    ("stage:shard", "prep.stage/1", lambda d: d["shards"][0]["outputs"]),
]


def test_a_task_record_of_a_stage_added_later_is_valid_and_its_outputs_are_object_ids() -> None:
    """Task records are open to new stages (prep/runner/stage.py): any lower-case name, object ids as outputs."""
    record = {"schema": "prep.task/1", "stage": "near_dup", "key": "0" * 64,
              "outputs": {"clusters": "sha256:" + "1" * 64}, "summary": {"pairs": 3}}
    validate(record, "prep.task/1")
    for bad in ({"stage": "Near-Dup"}, {"stage": ""}, {"outputs": {"clusters": "clusters.bin"}}):
        with pytest.raises(IntegrityError, match="prep.task/1"):
            validate({**record, **bad}, "prep.task/1")
