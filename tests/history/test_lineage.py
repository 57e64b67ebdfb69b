"""Lineage: `trace` finds where every document went, `locate` (show --at) finds what every shard
sequence is, and both agree with what the shards themselves say, in snapshots of both layouts:
layout 2 (built: shards named by key range, samples keyed by order key) and layout 1 (shards
named by position, synthesized from the same tokenize outputs by tests/history/layout1_factory.py)."""

from __future__ import annotations

import bisect
import dataclasses
import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import prep.runner.ordering as ordering
from prep.errors import IntegrityError, NotFoundError, UsageError
from prep.formats import megatron, wds
from prep.history import keep, placement_v2
from prep.history.documents import LAYOUT_KEYED, LAYOUT_POSITIONAL, Trace, load_records, snapshot_layout, stage_manifest
from prep.history.keep import PackedMask
from prep.history.lineage import locate, parse_at, placer_for, trace
from prep.history.placement_v2 import BucketReader, KeyedPlacer
from prep.storage import LocalStore
from prep.store.localcopy import local_file
from prep.store.snapshots import Snapshot
from prep.workfiles.entries import ENTRY_DTYPE, EntryFile, write_entries
from prep.workfiles.keepmask import pack_mask
from tests.helpers import make_records, write_jsonl, write_pipeline
from tests.history.layout1_factory import synthesize_layout1
from tests.runner.buildsupport import artifact_path, build_local
from tests.snapshot_factory import manifest_for


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(bits=st.lists(st.booleans(), max_size=90))
def test_packed_mask_matches_numpy(bits: list[bool], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(keep, "SCAN_BYTES", 2)  # exercise the chunked scans on small masks
    flags = np.array(bits, dtype=bool)
    path = tmp_path / "mask"
    path.write_bytes(pack_mask(flags))
    mask = PackedMask(path)
    assert mask.count == len(flags)
    for start in range(0, len(flags) + 1, 7):
        for end in range(start, len(flags) + 1, 5):
            assert mask.slice(start, end).tolist() == flags[start:end].tolist()
            assert mask.ones_between(start, end) == int(flags[start:end].sum())
        assert mask.ones_before(start) == int(flags[:start].sum())
    for n, index in enumerate(np.flatnonzero(flags)):
        assert mask.nth_one(n) == index
    with pytest.raises(IndexError):
        mask.nth_one(int(flags.sum()))


_PROBES = st.tuples(st.integers(0, 3), st.integers(0, 2), st.integers(0, 2), st.integers(0, 3))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(entries=st.lists(_PROBES, max_size=40), probe=_PROBES)
def test_bucket_binary_search_matches_bisect(entries: list[tuple[int, int, int, int]], probe: tuple[int, int, int, int],
                                              tmp_path: Path) -> None:
    """A bucket object's entries are sorted by (key, part, row), equal keys included (no dedup)."""
    ordered = sorted(entries)
    array = np.zeros(len(ordered), dtype=ENTRY_DTYPE)
    for name, column in zip(("key_hi", "key_lo", "part", "row"), zip(*ordered) if ordered else ((),) * 4):
        array[name] = column
    array["id_len"] = 0xFFFFFFFF
    path = tmp_path / f"bucket-{uuid.uuid4().hex}"
    write_entries(path, {"kind": "bucket", "bucket": 0}, array, b"")
    with BucketReader(EntryFile.open(path)) as reader:
        assert reader.lower_bound(probe) == bisect.bisect_left(ordered, probe)
        assert [tuple(int(x) for x in reader.at(i).tolist()[:2]) for i in range(len(ordered))] == \
            [entry[:2] for entry in ordered]


def _corpus(root: Path) -> None:
    """Two files that share the id `shared`; b.jsonl repeats a text of a.jsonl (dropped by dedup)."""
    first = make_records(25, seed=11, prefix="a") + [{"id": "shared", "text": "the shared id in file a"}]
    second = make_records(20, seed=12, prefix="b") + [{"id": "shared", "text": "the shared id in file b"},
                                                      {"id": "b-copy", "text": first[4]["text"]}]
    write_jsonl(root / "corpus" / "a.jsonl", first)
    write_jsonl(root / "corpus" / "b.jsonl", second)


def _build(root: Path, tokenizer: Path, **options: Any) -> tuple[LocalStore, Snapshot]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ordering, "DOCUMENTS_PER_BUCKET", 8)  # 8 buckets: shards within and across buckets
        result = build_local(write_pipeline(root, tokenizer, ["corpus"], **options), root / "store")
    return LocalStore(root / "store"), result.snapshot


@dataclass(frozen=True)
class Case:
    """One snapshot to look documents up in."""

    store: LocalStore
    snapshot: Snapshot

    @property
    def layout(self) -> int:
        return snapshot_layout(self.snapshot)


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory, tokenizer_path: Path) -> Case:
    """Layout 2, shard_size 1KB: shards of two buckets each (two slices)."""
    root = tmp_path_factory.mktemp("lineage")
    _corpus(root)
    return Case(*_build(root, tokenizer_path, shard_size="1KB"))


@pytest.fixture(scope="module")
def fine(tmp_path_factory: pytest.TempPathFactory, tokenizer_path: Path) -> Case:
    """Layout 2, shard_size 300B: shards cut within buckets (one slice each, not from entry 0)."""
    root = tmp_path_factory.mktemp("lineage-fine")
    _corpus(root)
    return Case(*_build(root, tokenizer_path, shard_size="300B"))


@pytest.fixture(scope="module")
def positional(keyed: Case) -> Case:
    """Layout 1 of the same tokenize outputs as `keyed`, in the same store."""
    return Case(keyed.store, synthesize_layout1(keyed.store, keyed.snapshot))


@pytest.fixture(params=["keyed", "fine", "positional"])
def case(request: pytest.FixtureRequest) -> Case:
    found: Case = request.getfixturevalue(request.param)
    return found


def test_the_fixtures_cover_both_layouts_and_both_shard_shapes(keyed: Case, fine: Case, positional: Case) -> None:
    assert (keyed.layout, fine.layout, positional.layout) == (LAYOUT_KEYED, LAYOUT_KEYED, LAYOUT_POSITIONAL)
    slices = []
    for built in (keyed, fine):
        placer = placer_for(built.store, built.snapshot)
        assert isinstance(placer, KeyedPlacer) and placer.bits == 3 and len(placer.shards) > 2
        slices.append([plan.slices for plan in placer.shards.values()])
    assert any(len(s) > 1 for s in slices[0]), "expected shards spanning buckets"
    assert any(first > 0 for s in slices[1] for _, first, _ in s), "expected shards cut within a bucket"
    assert [a["path"] for a in positional.snapshot.artifacts][:3] == ["bin/00000.bin", "bin/00000.idx", "bin/00001.bin"]


def _spec(meta: dict[str, Any]) -> str:
    return meta["id"] if meta["id"] != "shared" else f"{meta['source']}:shared"


def _check_placements(store: LocalStore, traced: Trace, files: dict[str, dict[str, Any]], sequence: int,
                      key: str, members: dict[str, bytes]) -> None:
    """The byte ranges of `traced` hold the document's tokens (.bin) and its sample (.tar)."""
    places = {place.format: place for place in traced.placements}
    assert set(places) == {"bin", "idx", "wds"} and {p.sequence for p in places.values()} == {sequence}
    reader = megatron.MegatronReader(bin_file=artifact_path(store.root, files["bin"]),
                                     idx_file=artifact_path(store.root, files["idx"]))
    bin_place, tar_place = places["bin"], places["wds"]
    assert bin_place.offset is not None and bin_place.length is not None
    bin_bytes = artifact_path(store.root, files["bin"]).read_bytes()
    tokens = np.frombuffer(bin_bytes[bin_place.offset:bin_place.offset + bin_place.length], reader.dtype)
    assert tokens.tolist() == reader[sequence].tolist()
    assert tar_place.offset is not None and tar_place.length is not None
    tar_bytes = artifact_path(store.root, files["wds"]).read_bytes()
    sample = tar_bytes[tar_place.offset:tar_place.offset + tar_place.length]
    assert sample.startswith(wds.member_name(key, "json").encode())
    assert sample.endswith(members["txt"] + bytes(-len(members["txt"]) % 512))


def test_every_sequence_of_every_shard_locates_and_traces_back(case: Case, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(placement_v2, "CHUNK_ENTRIES", 2)  # sum the sizes before a document in several reads
    store, snapshot = case.store, case.snapshot
    position, keys = 0, []
    for shard in sorted({a["shard"] for a in snapshot.artifacts}):
        files = {a["format"]: a for a in snapshot.artifacts if a["shard"] == shard}
        samples = list(wds.iter_samples(artifact_path(store.root, files["wds"])))
        assert len(samples) == files["wds"]["documents"]
        for sequence, (key, members) in enumerate(samples):
            meta = json.loads(members["json"])
            found = [locate(store, snapshot, files[fmt]["path"], sequence) for fmt in ("wds", "bin", "idx")]
            assert found[0] == found[1] == found[2]
            assert (found[0].document.id, found[0].document.source, found[0].document.line) == \
                (meta["id"], meta["source"], meta["line"])
            assert found[0].sample_key == key and found[0].duplicate_of is None
            assert found[0].position == (position if case.layout == LAYOUT_POSITIONAL else sequence)
            [traced] = trace(store, snapshot, _spec(meta))
            assert traced == found[0]
            _check_placements(store, traced, files, sequence, key, members)
            if case.layout == LAYOUT_KEYED:
                name = files["bin"]["path"].split("/")[1].split(".")[0]
                assert key[:16] >= name and traced.order_key == key
            position += 1
            keys.append(key)
    assert position == snapshot.manifest["stats"]["documents_written"]
    if case.layout == LAYOUT_KEYED:
        assert keys == sorted(set(keys)) and all(len(key) == 32 for key in keys)  # shard names sort in key order
    else:
        assert keys == [wds.sample_key(p) for p in range(position)]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_shard_position_locates_a_document_that_traces_back_to_it(case: Case, data: st.DataObject) -> None:
    artifact = data.draw(st.sampled_from(case.snapshot.artifacts))
    sequence = data.draw(st.integers(0, artifact["documents"] - 1))
    found = locate(case.store, case.snapshot, artifact["path"], sequence)
    assert artifact["path"] in {place.path for place in found.placements}
    assert {place.sequence for place in found.placements} == {sequence}
    [traced] = trace(case.store, case.snapshot, f"{found.document.source}:{found.document.id}")
    assert traced == found


def test_a_dropped_duplicate_traces_to_the_copy_kept(case: Case) -> None:
    [traced] = trace(case.store, case.snapshot, "b-copy")
    assert traced.position is None and traced.placements == () and traced.sample_key is None
    assert traced.duplicate_of is not None
    kept = traced.duplicate_of
    assert (kept.document.id, kept.document.source) == ("a-4", "a.jsonl")
    assert kept.document.text_hash == traced.document.text_hash
    assert len(kept.placements) == 3 and kept.duplicate_of is None
    assert kept == trace(case.store, case.snapshot, "a-4")[0]


def test_names_must_be_unambiguous(case: Case) -> None:
    store, snapshot = case.store, case.snapshot
    with pytest.raises(UsageError, match="ambiguous: name one of a.jsonl:shared, b.jsonl:shared"):
        trace(store, snapshot, "shared")
    [in_b] = trace(store, snapshot, "b.jsonl:shared")
    assert (in_b.document.source, in_b.document.line) == ("b.jsonl", 21)
    assert trace(store, snapshot, "a.jsonl:a-3")[0].document.id == "a-3"
    with pytest.raises(NotFoundError, match="no document 'nope'"):
        trace(store, snapshot, "nope")


def test_locate_refuses_bad_positions(case: Case) -> None:
    store, snapshot = case.store, case.snapshot
    first = snapshot.artifacts[0]
    with pytest.raises(UsageError, match="holds"):
        locate(store, snapshot, first["path"], first["documents"])
    for absent in ("bin/99999.bin", "bin/ffffffffffffffff.bin"):
        with pytest.raises(NotFoundError, match=f"no artifact '{absent}'"):
            locate(store, snapshot, absent, 0)
    assert parse_at("wds/00001.tar:12") == ("wds/00001.tar", 12)
    assert parse_at("wds/3a00000000000000.tar:7") == ("wds/3a00000000000000.tar", 7)
    for bad in ("bin/00000.bin", "bin/00000.bin:x", ":3"):
        with pytest.raises(UsageError, match=r"bin/0000000000000000\.bin:0 .*bin/00000\.bin:0"):
            parse_at(bad)


def test_a_trace_reads_only_the_buckets_its_shard_holds(keyed: Case, monkeypatch: pytest.MonkeyPatch) -> None:
    """Memory and reads follow the document's shard, never the number of buckets."""
    placer = placer_for(keyed.store, keyed.snapshot)
    assert isinstance(placer, KeyedPlacer)
    fetched: list[str] = []

    def spy(store: LocalStore, object_id: str, what: str) -> Path:
        fetched.append(object_id)
        return local_file(store, object_id)

    monkeypatch.setattr("prep.history.placement_v2.verified_object", spy)
    for spec in ("a-3", "b-copy", "b-7"):
        fetched.clear()
        [traced] = trace(keyed.store, keyed.snapshot, spec)
        kept = traced.duplicate_of or traced
        plan = placer.shards[kept.placements[0].shard]
        allowed = {placer.buckets[bucket]["output"] for bucket, _, _ in plan.slices}
        assert set(fetched) <= allowed and len(set(fetched)) < len(placer.buckets)


def test_a_placer_with_the_wrong_seed_fails_closed(keyed: Case) -> None:
    placer = placer_for(keyed.store, keyed.snapshot)
    assert isinstance(placer, KeyedPlacer)
    wrong = dataclasses.replace(placer, seed=placer.seed + 1)
    [traced] = trace(keyed.store, keyed.snapshot, "a-3")
    with pytest.raises(IntegrityError, match="is not in bucket .*, and no earlier copy of its text is"):
        wrong.trace_origin(traced.document)


def test_snapshots_of_no_known_layout_are_refused() -> None:
    manifest = manifest_for("demo", [])
    snapshot = Snapshot(id="sha256:" + "0" * 64, manifest=manifest, raw=b"")
    with pytest.raises(IntegrityError, match="neither dedup and shuffle"):
        snapshot_layout(snapshot)


def test_without_id_field_documents_are_named_by_source_and_line(tmp_path: Path, tokenizer_path: Path) -> None:
    write_jsonl(tmp_path / "corpus" / "only.jsonl", make_records(8, seed=13, prefix="n"))
    store, built = _build(tmp_path, tokenizer_path, id_field=None)
    for snapshot in (built, synthesize_layout1(store, built)):
        [traced] = trace(store, snapshot, "only.jsonl:5")
        assert (traced.document.id, traced.document.line) == ("only.jsonl:5", 5)
        first = next(a for a in snapshot.artifacts if a["format"] == "bin")
        assert locate(store, snapshot, first["path"], 0).document.source == "only.jsonl"
        with pytest.raises(UsageError, match="SOURCE:LINE"):
            trace(store, snapshot, "n-5")
        with pytest.raises(NotFoundError):
            trace(store, snapshot, "only.jsonl:99")


def test_without_dedup_every_copy_has_its_own_place(tmp_path: Path, tokenizer_path: Path) -> None:
    """Equal texts share an order key; each copy is found by its part and row among them."""
    records = make_records(6, seed=14, prefix="c")
    records += [{"id": f"copy-{i}", "text": records[2]["text"]} for i in range(3)]
    write_jsonl(tmp_path / "corpus" / "c.jsonl", records)
    pipeline = write_pipeline(tmp_path, tokenizer_path, ["corpus"])
    pipeline.write_text(pipeline.read_text().replace("exact = true", "exact = false"))
    snapshot = build_local(pipeline, tmp_path / "store").snapshot
    store = LocalStore(tmp_path / "store")
    copies = [trace(store, snapshot, doc_id)[0] for doc_id in ("c-2", "copy-0", "copy-1", "copy-2")]
    assert all(c.duplicate_of is None and c.placements for c in copies)
    assert len({c.order_key for c in copies}) == 1
    assert len({(c.placements[0].path, c.placements[0].sequence) for c in copies}) == 4
    for copy in copies:
        assert locate(store, snapshot, copy.placements[0].path, copy.placements[0].sequence) == copy
    assert load_records(store, snapshot).layout == LAYOUT_KEYED


def test_a_search_of_every_snapshot_finds_a_document_and_every_copy_of_its_text(case: Case) -> None:
    """`prep trace --all`'s search, in snapshots of every layout: b-copy by id, and by its text the
    copy exact dedup kept (a-4), each traced as `prep trace` traces it, with its intermediate."""
    from prep.history.everywhere import Query, sweep

    found = sweep(case.store, Query.parse("b-copy"), snapshot_ids=[case.snapshot.id])
    [entry] = found.snapshots
    assert [(hit.trace.document.id, hit.matched) for hit in entry.hits] == [("a-4", "text"), ("b-copy", "id")]
    assert [hit.trace for hit in entry.hits] == [trace(case.store, case.snapshot, "a-4")[0],
                                                 trace(case.store, case.snapshot, "b-copy")[0]]
    tasks = {task["source"]: task["output"] for task in stage_manifest(case.store, case.snapshot, "tokenize")["tasks"]}
    assert [hit.intermediate for hit in entry.hits] == [tasks["a.jsonl"], tasks["b.jsonl"]]
    assert found.query.texts == {entry.hits[0].trace.document.text_hash}
    assert sweep(case.store, Query.parse("no-such-id"), snapshot_ids=[case.snapshot.id]).holding == []
