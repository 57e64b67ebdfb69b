"""`show --at KEY` and `--text/--tokens` below the CLI: every WebDataset sample key of every shard
locates the document its tar sample holds (both layouts, dedup on and off), the text and tokens
read back are the corpus' text and the .bin sequence, and SOURCE:LINE names documents whether or
not the pipeline has an id field."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from prep.errors import IntegrityError, NotFoundError, UsageError
from prep.formats import megatron, wds
from prep.history.content import document_content
from prep.history.documents import LAYOUT_KEYED, load_records
from prep.history.lineage import is_sample_key, locate, locate_at, locate_key, placer_for, trace
from prep.history.placement_v2 import KeyedPlacer
from prep.storage import LocalStore
from prep.store.snapshots import Snapshot
from prep.workfiles.keys import bucket_of
from tests.helpers import make_records, write_jsonl, write_pipeline
from tests.history.test_lineage import Case, _build, case, fine, keyed, positional  # noqa: F401
from tests.runner.buildsupport import artifact_path, build_local


def _corpus_texts(root: Path) -> dict[tuple[str, int], str]:
    """Every input text by (file name, 1-based line), read straight from the corpus."""
    texts = {}
    for path in sorted((root / "corpus").glob("*.jsonl")):
        for line, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            texts[path.name, line] = json.loads(raw)["text"]
    return texts


def test_every_sample_key_locates_its_document_with_its_text_and_tokens(case: Case) -> None:  # noqa: F811
    store, snapshot = case.store, case.snapshot
    corpus = _corpus_texts(store.root.parent)
    records = load_records(store, snapshot)
    seen = 0
    for shard in sorted({a["shard"] for a in snapshot.artifacts}):
        files = {a["format"]: a for a in snapshot.artifacts if a["shard"] == shard}
        reader = megatron.MegatronReader(bin_file=artifact_path(store.root, files["bin"]),
                                         idx_file=artifact_path(store.root, files["idx"]))
        for sequence, (key, members) in enumerate(wds.iter_samples(artifact_path(store.root, files["wds"]))):
            assert is_sample_key(key)
            found = locate_key(store, snapshot, key)
            assert found == locate_at(store, snapshot, key) == locate(store, snapshot, files["wds"]["path"], sequence)
            assert found.sample_key == key and found.document.id == json.loads(members["json"])["id"]
            content = document_content(store, records, found.document)
            assert content.text == corpus[found.document.source, found.document.line] == members["txt"].decode()
            assert list(content.tokens) == reader[sequence].tolist() == wds.load_npy(members["tokens.npy"]).tolist()
            seen += 1
    assert seen == snapshot.manifest["stats"]["documents_written"]


def test_keys_that_name_no_document_are_refused(case: Case) -> None:  # noqa: F811
    store, snapshot = case.store, case.snapshot
    if case.layout == LAYOUT_KEYED:
        first = next(a for a in snapshot.artifacts if a["format"] == "wds")
        key = locate(store, snapshot, first["path"], 0).sample_key
        assert key is not None
        for absent in (key[:-1] + ("0" if key[-1] != "0" else "1"), "0" * 32, "f" * 32):
            with pytest.raises(NotFoundError, match=f"no document with sample key {absent}"):
                locate_key(store, snapshot, absent)
        with pytest.raises(UsageError, match="are 32 hex digits"):
            locate_key(store, snapshot, "0000000001")
    else:
        with pytest.raises(NotFoundError, match="no document with sample key 9999999999"):
            locate_key(store, snapshot, "9999999999")
        with pytest.raises(UsageError, match="are 10 decimal digits"):
            locate_key(store, snapshot, "0" * 32)
    for bad in ("xyz", "0" * 31, "bin/00000.bin"):
        with pytest.raises(UsageError, match="expected a WebDataset sample key"):
            locate_at(store, snapshot, bad)


def test_without_dedup_each_copy_has_its_own_sample_key(tmp_path: Path, tokenizer_path: Path) -> None:
    """Equal texts share an order key; their tar keys add the copy number, and each locates its copy.
    Shards are cut between keys, so even tiny shards keep every copy of a text in one shard."""
    records = make_records(6, seed=14, prefix="c")
    records += [{"id": f"copy-{i}", "text": records[2]["text"] * 3} for i in range(12)]
    write_jsonl(tmp_path / "corpus" / "c.jsonl", records)
    pipeline = write_pipeline(tmp_path, tokenizer_path, ["corpus"], shard_size="300B")
    pipeline.write_text(pipeline.read_text().replace("exact = true", "exact = false"))
    snapshot = build_local(pipeline, tmp_path / "store").snapshot
    store = LocalStore(tmp_path / "store")
    keys, shards = {}, set()
    for artifact in (a for a in snapshot.artifacts if a["format"] == "wds"):
        for key, members in wds.iter_samples(artifact_path(store.root, artifact)):
            keys[key] = json.loads(members["json"])["id"]
            shards.update([artifact["path"]] if keys[key].startswith("copy-") else [])
    assert len(keys) == len(records) and len(shards) == 1 and len(snapshot.artifacts) > 3
    for key, doc_id in keys.items():
        found = locate_key(store, snapshot, key)
        assert found.document.id == doc_id and trace(store, snapshot, doc_id)[0].sample_key == key
    copies = [trace(store, snapshot, f"copy-{i}")[0] for i in range(12)]
    assert len({c.order_key for c in copies}) == 1 and len({c.sample_key for c in copies}) == 12


def test_source_line_names_a_document_even_with_an_id_field(keyed: Case) -> None:  # noqa: F811
    [by_line] = trace(keyed.store, keyed.snapshot, "a.jsonl:5")
    assert (by_line.document.id, by_line.document.line) == ("a-4", 5)
    assert by_line == trace(keyed.store, keyed.snapshot, "a-4")[0] == trace(keyed.store, keyed.snapshot, "a.jsonl:a-4")[0]
    with pytest.raises(NotFoundError, match="no document 'a.jsonl:999'"):
        trace(keyed.store, keyed.snapshot, "a.jsonl:999")


def test_a_numeric_id_and_another_line_with_that_number_is_ambiguous(tmp_path: Path, tokenizer_path: Path) -> None:
    write_jsonl(tmp_path / "corpus" / "n.jsonl", [{"id": str(3 - i), "text": f"document number {i}"} for i in range(3)])
    store, snapshot = _build(tmp_path, tokenizer_path)
    with pytest.raises(UsageError, match="ambiguous: name one of n.jsonl:1, n.jsonl:3"):
        trace(store, snapshot, "n.jsonl:1")  # id "1" is on line 3, line 1 holds id "3"
    [two] = trace(store, snapshot, "n.jsonl:2")  # id "2" is on line 2: one document either way
    assert (two.document.id, two.document.line) == ("2", 2)


def _intermediate(store: LocalStore, snapshot: Snapshot) -> Path:
    return artifact_path(store.root, {"sha256": load_records(store, snapshot).tasks[0].output.removeprefix("sha256:")})


def test_text_from_a_corrupt_intermediate_is_refused(tmp_path: Path, tokenizer_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    write_jsonl(tmp_path / "corpus" / "a.jsonl", make_records(5, seed=3, prefix="x"))
    store, snapshot = _build(tmp_path, tokenizer_path)
    [found] = trace(store, snapshot, "x-1")
    records = load_records(store, snapshot)
    path = _intermediate(store, snapshot)
    data = bytearray(path.read_bytes())
    data[0] ^= 0xFF  # the first document's first text byte
    path.chmod(0o644)
    path.write_bytes(bytes(data))
    monkeypatch.setattr("prep.store.localcopy._CHECKED", set())  # the trace proved the file: as if in a new process
    with pytest.raises(IntegrityError, match="does not hash to its name"):
        document_content(store, records, found.document)


def test_a_corrupt_bucket_object_fails_closed_instead_of_misleading(tmp_path: Path, tokenizer_path: Path) -> None:
    """A flipped byte in a bucket object could send a binary search astray (a wrong document, or
    "no document" for a key that exists): lookups re-hash it before its first use."""
    write_jsonl(tmp_path / "corpus" / "a.jsonl", make_records(12, seed=4, prefix="k"))
    store, snapshot = _build(tmp_path, tokenizer_path)
    tar = next(a for a in snapshot.artifacts if a["format"] == "wds")
    key, members = next(iter(wds.iter_samples(artifact_path(store.root, tar))))  # read from the shard, not by lineage
    placer = placer_for(store, snapshot)
    assert isinstance(placer, KeyedPlacer)
    bucket = int(bucket_of(np.array([int(key[:16], 16)], dtype=np.uint64), placer.bits)[0])
    path = artifact_path(store.root, {"sha256": placer.buckets[bucket]["output"].removeprefix("sha256:")})
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.chmod(0o644)
    path.write_bytes(bytes(data))
    doc_id = json.loads(members["json"])["id"]
    for lookup in (lambda: locate_key(store, snapshot, key), lambda: trace(store, snapshot, doc_id)):
        with pytest.raises(IntegrityError, match="does not hash to its name"):
            lookup()
