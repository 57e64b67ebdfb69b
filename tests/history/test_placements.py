"""Byte ranges in every format, with metadata fields and without: for every document of a build to
bin, mds and wds (JSON Lines; ids and metadata values that need escaping, non-ASCII), the ranges
`trace` and `locate` report (and `prep trace --json`, `prep show --at`) hold exactly its tokens
(.bin), its three members (the .tar range read as an archive of its own) and its MDS sample
(decoded, metadata included, by prep's reader and by mosaicml-streaming's); and the sizes placing
adds up are the bytes the writers write, for any documents (hypothesis)."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prep.cli.main import cli
from prep.formats import mds, megatron, wds
from prep.formats.jsonspelling import spell
from prep.formats.mds_reader import ShardReader, decode_sample
from prep.formats.units import artifact_formats
from prep.history import placement_v2
from prep.history.documents import Trace
from prep.history.lineage import locate, trace
from prep.history.placing import Named, document_sizes, needs
from prep.stages.members import sample_members
from prep.storage import LocalStore
from prep.store.snapshots import Snapshot
from tests.formats.test_mds import _run_checker, _streaming_python
from tests.formats.test_metadata_build import FIELDS, expected_metadata, records
from tests.helpers import write_jsonl
from tests.history.test_lineage import _build
from tests.runner.buildsupport import artifact_path

FORMATS = '["bin", "mds", "wds"]'


def _corpus(count: int) -> list[dict[str, Any]]:
    """test_metadata_build's records (metadata present, missing, null, escaped, non-ASCII), some ids escaped too."""
    found = records(count)
    for index in range(0, count, 7):
        found[index]["id"] = f'dö"c\\{index}\t😀'
    return found


@pytest.fixture(scope="module", params=[True, False], ids=["metadata", "plain"])
def built(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
          tokenizer_path: Path) -> tuple[LocalStore, Snapshot, dict[str, dict[str, Any]]]:
    """A build to bin, mds and wds, with metadata fields or without, and its corpus by id."""
    root = tmp_path_factory.mktemp("placements")
    corpus = _corpus(60)
    write_jsonl(root / "corpus" / "a.jsonl", corpus[:30])
    write_jsonl(root / "corpus" / "b.jsonl", corpus[30:])
    extra = f"metadata_fields = {json.dumps(FIELDS)}\n" if request.param else ""
    store, snapshot = _build(root, tokenizer_path, shard_size="1KB", formats=FORMATS, extra_input=extra)
    return store, snapshot, {record["id"]: record for record in corpus}


def _range(data: bytes, place: dict[str, Any]) -> bytes:
    return data[place["offset"]:place["offset"] + place["length"]]


def _tar_members(data: bytes) -> dict[str, bytes]:
    """The members of a byte range of a .tar, read as an archive of its own."""
    found = {}
    with tarfile.open(fileobj=io.BytesIO(data + wds.END_OF_ARCHIVE), mode="r:") as archive:
        for info in archive:
            member = archive.extractfile(info)
            assert member is not None
            found[info.name] = member.read()
    return found


def _check(store: LocalStore, traced: dict[str, Any], files: dict[str, dict[str, Any]], sequence: int,
           with_metadata: bool, corpus: dict[str, dict[str, Any]]) -> None:
    """The ranges of a trace (as JSON) hold document `sequence` of the shard's .bin, .tar and .mds."""
    places = {place["format"]: place for place in traced["placements"]}
    assert set(places) == {"bin", "idx", "mds", "wds"} | ({"bin_metadata"} if with_metadata else set())
    assert {place["sequence"] for place in places.values()} == {sequence}
    paths = {fmt: artifact_path(store.root, files[fmt]) for fmt in ("bin", "idx", "mds", "wds")}
    tokens = megatron.MegatronReader(bin_file=paths["bin"], idx_file=paths["idx"])[sequence]
    assert np.frombuffer(_range(paths["bin"].read_bytes(), places["bin"]), tokens.dtype).tolist() == tokens.tolist()
    key, members = list(wds.iter_samples(paths["wds"]))[sequence]
    assert _tar_members(_range(paths["wds"].read_bytes(), places["wds"])) == \
        {f"{key}.{suffix}": data for suffix, data in members.items()}
    member = json.loads(members["json"])
    assert member["id"] == traced["document"]["id"] and ("metadata" in member) == with_metadata
    sample = decode_sample(_range(paths["mds"].read_bytes(), places["mds"]), tokens.dtype, "range", with_metadata)
    with ShardReader(paths["mds"]) as reader:
        stored = reader[sequence]
    assert (sample.id, sample.text, sample.tokens.tolist(), sample.metadata) == \
        (stored.id, stored.text, tokens.tolist(), stored.metadata)
    assert sample.id == member["id"] and sample.text == members["txt"].decode()
    if with_metadata:
        assert json.loads(sample.metadata or b"") == member["metadata"] == expected_metadata(corpus[member["id"]])


def _shards(snapshot: Snapshot) -> list[dict[str, dict[str, Any]]]:
    """Each shard's artifacts by format, in shard order."""
    shards = sorted({artifact["shard"] for artifact in snapshot.artifacts})
    return [{a["format"]: a for a in snapshot.artifacts if a["shard"] == shard} for shard in shards]


def _spec(traced: Trace) -> str:
    return f"{traced.document.source}:{traced.document.id}"


def test_every_documents_ranges_hold_its_members_and_sample(
        built: tuple[LocalStore, Snapshot, dict[str, dict[str, Any]]], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(placement_v2, "CHUNK_ENTRIES", 3)  # sum the sizes before a document in several reads
    store, snapshot, corpus = built
    with_metadata = "metadata_fields" in snapshot.manifest["config"]["input"]
    shards, seen = _shards(snapshot), 0
    assert len(shards) > 2
    for files in shards:
        for sequence in range(files["mds"]["documents"]):
            found = locate(store, snapshot, files["mds"]["path"], sequence)
            [traced] = trace(store, snapshot, _spec(found))
            assert traced == found
            _check(store, traced.to_json(), files, sequence, with_metadata, corpus)
            seen += 1
    assert seen == snapshot.manifest["stats"]["documents_written"]


def _prep(*args: str | Path) -> Any:
    result = CliRunner().invoke(cli, [str(arg) for arg in args])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_trace_json_and_show_at_report_those_ranges(
        built: tuple[LocalStore, Snapshot, dict[str, dict[str, Any]]]) -> None:
    store, snapshot, corpus = built
    with_metadata = "metadata_fields" in snapshot.manifest["config"]["input"]
    for files in _shards(snapshot)[1::2]:
        last = files["wds"]["documents"] - 1
        for fmt, sequence in (("mds", last), ("wds", last // 2), ("bin", 0)):
            at = _prep("show", snapshot.id, "--store", store.root, "--at", f"{files[fmt]['path']}:{sequence}", "--json")
            _check(store, at["trace"], files, sequence, with_metadata, corpus)
            found = locate(store, snapshot, files[fmt]["path"], sequence)
            report = _prep("trace", snapshot.id, _spec(found), "--store", store.root, "--json")
            assert [one["placements"] for one in report["documents"]] == [at["trace"]["placements"]]


def test_streaming_decodes_each_reported_mds_range_to_its_sample(
        built: tuple[LocalStore, Snapshot, dict[str, dict[str, Any]]], tmp_path: Path) -> None:
    """mosaicml-streaming's own MDSReader, given the shard's index.json object, decodes each range."""
    python = _streaming_python()
    store, snapshot, _ = built
    with_metadata = "metadata_fields" in snapshot.manifest["config"]["input"]
    specs, expected = [], []
    for files in _shards(snapshot):
        path, documents = artifact_path(store.root, files["mds"]), files["mds"]["documents"]
        places = [next(p for p in locate(store, snapshot, files["mds"]["path"], sequence).placements
                       if p.format == "mds") for sequence in range(documents)]
        entry = mds.ShardEntry(path.name, files["mds"]["size"], documents, np.dtype(snapshot.manifest["tokenizer"]["dtype"]),
                               with_metadata)
        specs.append({"file": str(path), "shard": entry.to_json(), "ranges": [[p.offset, p.length] for p in places]})
        with ShardReader(path) as reader:
            expected.append([(s.id, s.text, s.tokens.tolist(), json.loads(s.metadata) if s.metadata else None)
                             for s in reader])
    decoded = _run_checker(python, {"read": [], "write": [], "decode": specs}, tmp_path)["decoded"]
    assert [[(d["id"], d["text"], d["tokens"], d.get("metadata")) for d in shard] for shard in decoded] == expected


_TEXT = st.text(st.characters(blacklist_categories=["Cs"]), max_size=12)
_JSON = st.recursive(st.none() | st.booleans() | st.integers(-10**20, 10**20) | st.floats(allow_nan=False,
                                                                                          allow_infinity=False)
                     | _TEXT, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
                     max_leaves=6)
_DOCUMENT = st.tuples(_TEXT, st.sampled_from(["a.jsonl", 'dir/ü "b".jsonl']), st.integers(1, 10**12),
                      st.integers(1, 300), st.integers(0, 2000), st.dictionaries(_TEXT, _JSON, max_size=3))


def _named(documents: list[tuple[str, str, int, int, int, dict[str, Any]]], with_metadata: bool) -> list[Named]:
    return [Named(doc_id, source, line, tokens, spell(metadata).encode() if with_metadata else None)
            for doc_id, source, line, tokens, _, metadata in documents]


def _placed(named: list[Named], texts: list[int], dtype: np.dtype[Any], with_metadata: bool, fmt: str) -> list[int]:
    """Where placing puts each document in an artifact of format `fmt`, and the end of the last."""
    kind = artifact_formats()[fmt]
    assert kind.spans is not None
    need = needs([kind], with_metadata)
    sizes = document_sizes(np.array([d.tokens for d in named]), np.array(texts), named, dtype, need)
    ends = kind.head(len(named), dtype, with_metadata) + np.concatenate([[0], np.cumsum(kind.spans(sizes))])
    return [int(end) for end in ends]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents=st.lists(_DOCUMENT, min_size=1, max_size=6), with_metadata=st.booleans(),
       dtype=st.sampled_from([np.dtype("<u2"), np.dtype("<i4")]))
def test_placed_sizes_are_the_bytes_the_writers_write(documents: list[tuple[str, str, int, int, int, dict[str, Any]]],
                                                      with_metadata: bool, dtype: np.dtype[Any]) -> None:
    """Placing's per-document sizes, against the shard writers' bytes: the vectorized `.json`
    members, a tar of wds.sample_bytes, and an MDS shard of mds.encode_samples."""
    named, texts = _named(documents, with_metadata), [text for *_, text, _ in documents]
    blob = b"".join(d.id.encode() + (d.metadata or b"") for d in named)
    id_lengths = [len(d.id.encode()) for d in named]
    id_starts = np.cumsum([0] + [n + len(d.metadata or b"") for n, d in zip(id_lengths, named)])[:-1]
    sources = sorted({d.source for d in named})
    metadata = (id_starts + id_lengths, np.array([len(d.metadata or b"") for d in named])) if with_metadata else None
    jsons, json_offsets = sample_members(blob, id_starts, np.array(id_lengths), np.ones(len(named), bool), sources,
                                         np.array([sources.index(d.source) for d in named]),
                                         np.array([d.line for d in named]), np.array([d.tokens for d in named]), metadata)
    tar = b"".join(wds.sample_bytes(f"{at:032x}", jsons[json_offsets[at]:json_offsets[at + 1]],
                                    wds.npy_bytes(np.arange(d.tokens, dtype=dtype)), b"t" * texts[at])
                   for at, d in enumerate(named))
    starts = _placed(named, texts, dtype, with_metadata, "wds")
    assert starts[-1] == len(tar)
    for at, d in enumerate(named):
        members = _tar_members(tar[starts[at]:starts[at + 1]])
        assert json.loads(members[f"{at:032x}.json"])["id"] == d.id
    samples = [mds.Sample(np.arange(d.tokens, dtype=dtype), "t" * text, d.id,
                          mds.metadata_value(d.metadata) if d.metadata is not None else None)
               for d, text in zip(named, texts)]
    docs = mds.Documents.of(samples, dtype)
    shard = mds.ShardLayout.plan(dtype, [docs.sizes()], with_metadata).header() + b"".join(mds.encode_samples(docs))
    starts = _placed(named, texts, dtype, with_metadata, "mds")
    assert starts[-1] == len(shard)
    for at, sample in enumerate(samples):
        decoded = decode_sample(shard[starts[at]:starts[at + 1]], dtype, "sample", with_metadata)
        assert (decoded.id, decoded.metadata, decoded.tokens.tolist()) == (sample.id, sample.metadata,
                                                                             sample.tokens.tolist())
