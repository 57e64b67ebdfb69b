"""Lineage: `trace` finds where every document went, `locate` (show --at) finds what every shard
sequence is, and both agree with what the shards themselves say."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prep.errors import NotFoundError, UsageError
from prep.formats import megatron, wds
from prep.history import lineage
from prep.history.lineage import PackedMask, locate, parse_at, trace
from prep.stages.dedup import pack_mask
from prep.storage import LocalStore
from prep.store.snapshots import Snapshot
from tests.helpers import make_records, write_jsonl, write_pipeline
from tests.runner.buildsupport import artifact_path, build_local, read_samples


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(bits=st.lists(st.booleans(), max_size=90))
def test_packed_mask_matches_numpy(bits: list[bool], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lineage, "SCAN_BYTES", 2)  # exercise the chunked scans on small masks
    keep = np.array(bits, dtype=bool)
    path = tmp_path / "mask"
    path.write_bytes(pack_mask(keep))
    mask = PackedMask(path)
    assert mask.count == len(keep)
    for start in range(0, len(keep) + 1, 7):
        for end in range(start, len(keep) + 1, 5):
            assert mask.slice(start, end).tolist() == keep[start:end].tolist()
            assert mask.ones_between(start, end) == int(keep[start:end].sum())
        assert mask.ones_before(start) == int(keep[:start].sum())
    for n, index in enumerate(np.flatnonzero(keep)):
        assert mask.nth_one(n) == index
    with pytest.raises(IndexError):
        mask.nth_one(int(keep.sum()))


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, tokenizer_path: Path) -> tuple[LocalStore, Snapshot]:
    """Two files that share the id `shared`; b.jsonl repeats a text of a.jsonl (dropped by dedup)."""
    root = tmp_path_factory.mktemp("lineage")
    first = make_records(25, seed=11, prefix="a") + [{"id": "shared", "text": "the shared id in file a"}]
    second = make_records(20, seed=12, prefix="b") + [{"id": "shared", "text": "the shared id in file b"},
                                                      {"id": "b-copy", "text": first[4]["text"]}]
    write_jsonl(root / "corpus" / "a.jsonl", first)
    write_jsonl(root / "corpus" / "b.jsonl", second)
    result = build_local(write_pipeline(root, tokenizer_path, ["corpus"], shard_size="1KB"), root / "store")
    return LocalStore(root / "store"), result.snapshot


def test_every_sequence_of_every_shard_locates_and_traces_back(built: tuple[LocalStore, Snapshot]) -> None:
    store, snapshot = built
    samples = read_samples(store.root, snapshot.manifest)
    by_shard = {a["shard"]: a for a in snapshot.artifacts if a["format"] == "wds"}
    bins = {a["shard"]: a for a in snapshot.artifacts if a["format"] == "bin"}
    idxs = {a["shard"]: a for a in snapshot.artifacts if a["format"] == "idx"}
    assert len(by_shard) > 2, "expected several shards"
    position = 0
    for shard in sorted(by_shard):
        tar_bytes = artifact_path(store.root, by_shard[shard]).read_bytes()
        reader = megatron.MegatronReader(bin_file=artifact_path(store.root, bins[shard]),
                                         idx_file=artifact_path(store.root, idxs[shard]))
        bin_bytes = artifact_path(store.root, bins[shard]).read_bytes()
        for sequence in range(by_shard[shard]["documents"]):
            key, members = samples[position]
            meta = json.loads(members["json"])
            for fmt in ("wds", "bin", "idx"):
                path = {"wds": by_shard, "bin": bins, "idx": idxs}[fmt][shard]["path"]
                found = locate(store, snapshot, path, sequence)
                assert (found.document.id, found.document.source, found.document.line) == \
                    (meta["id"], meta["source"], meta["line"])
                assert found.position == position == int(key)
            spec = meta["id"] if meta["id"] != "shared" else f"{meta['source']}:shared"
            [traced] = trace(store, snapshot, spec)
            assert traced.position == position and traced.duplicate_of is None
            places = {place.format: place for place in traced.placements}
            assert {p.sequence for p in traced.placements} == {sequence}
            bin_place, tar_place = places["bin"], places["wds"]
            assert bin_place.offset is not None and bin_place.length is not None
            tokens = np.frombuffer(bin_bytes[bin_place.offset:bin_place.offset + bin_place.length], reader.dtype)
            assert tokens.tolist() == reader[sequence].tolist()
            assert tar_place.offset is not None and tar_place.length is not None
            sample = tar_bytes[tar_place.offset:tar_place.offset + tar_place.length]
            assert sample.startswith(wds.member_name(key, "json").encode())
            assert sample.endswith(members["txt"] + bytes(-len(members["txt"]) % 512))
            position += 1
    assert position == len(samples) == snapshot.manifest["stats"]["documents_written"]


def test_a_dropped_duplicate_traces_to_the_copy_kept(built: tuple[LocalStore, Snapshot]) -> None:
    store, snapshot = built
    [traced] = trace(store, snapshot, "b-copy")
    assert traced.position is None and traced.placements == ()
    assert traced.duplicate_of is not None
    assert (traced.duplicate_of.document.id, traced.duplicate_of.document.source) == ("a-4", "a.jsonl")
    assert traced.duplicate_of.document.text_hash == traced.document.text_hash
    assert len(traced.duplicate_of.placements) == 3


def test_names_must_be_unambiguous(built: tuple[LocalStore, Snapshot]) -> None:
    store, snapshot = built
    with pytest.raises(UsageError, match="ambiguous: name one of a.jsonl:shared, b.jsonl:shared"):
        trace(store, snapshot, "shared")
    [in_b] = trace(store, snapshot, "b.jsonl:shared")
    assert (in_b.document.source, in_b.document.line) == ("b.jsonl", 21)
    assert trace(store, snapshot, "a.jsonl:a-3")[0].document.id == "a-3"
    with pytest.raises(NotFoundError, match="no document 'nope'"):
        trace(store, snapshot, "nope")


def test_locate_refuses_bad_positions(built: tuple[LocalStore, Snapshot]) -> None:
    store, snapshot = built
    first = snapshot.artifacts[0]
    with pytest.raises(UsageError, match="holds"):
        locate(store, snapshot, first["path"], first["documents"])
    with pytest.raises(NotFoundError, match="no artifact 'bin/99999.bin'"):
        locate(store, snapshot, "bin/99999.bin", 0)
    assert parse_at("wds/00001.tar:12") == ("wds/00001.tar", 12)
    for bad in ("bin/00000.bin", "bin/00000.bin:x", ":3"):
        with pytest.raises(UsageError):
            parse_at(bad)


def test_without_id_field_documents_are_named_by_source_and_line(tmp_path: Path, tokenizer_path: Path) -> None:
    write_jsonl(tmp_path / "corpus" / "only.jsonl", make_records(8, seed=13, prefix="n"))
    result = build_local(write_pipeline(tmp_path, tokenizer_path, ["corpus"], id_field=None), tmp_path / "store")
    store = LocalStore(tmp_path / "store")
    [traced] = trace(store, result.snapshot, "only.jsonl:5")
    assert (traced.document.id, traced.document.line) == ("only.jsonl:5", 5)
    first = next(a for a in result.snapshot.artifacts if a["format"] == "bin")
    assert locate(store, result.snapshot, first["path"], 0).document.source == "only.jsonl"
    with pytest.raises(UsageError, match="SOURCE:LINE"):
        trace(store, result.snapshot, "n-5")
    with pytest.raises(NotFoundError):
        trace(store, result.snapshot, "only.jsonl:99")
