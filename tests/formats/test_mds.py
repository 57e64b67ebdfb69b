"""Mosaic MDS shards: writer -> reader round trips, byte reproducibility, a plain spelling of the
layout, refused corrupt files and indexes, and mosaicml-streaming itself reading them back
(StreamingDataset) and writing the same bytes (MDSWriter), with the python named by PREP_MDS_PYTHON."""

from __future__ import annotations

import json
import os
import struct
import subprocess
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prep.errors import InputError, IntegrityError, NotFoundError
from prep.formats import mds
from prep.formats.mds import Documents, Sample, SampleSizes, ShardEntry, ShardLayout
from prep.formats.mds_reader import ShardReader, decode_sample, parse_index
from prep.hashing import Digest, digest_file

DTYPES: list[np.dtype[Any]] = [np.dtype("<u2"), np.dtype("<i4")]
CHECKER = Path(__file__).with_name("mds_streaming_check.py")


@st.composite
def samples(draw: st.DrawFn, dtype: np.dtype[Any]) -> Sample:
    high = 65_535 if dtype == np.uint16 else 2**31 - 1
    values = np.array(draw(st.lists(st.integers(0, high), min_size=1, max_size=40)), dtype=dtype)
    length = draw(st.one_of(st.just(len(values)), st.sampled_from([255, 256, 65_535, 65_536])))  # each shape width
    tokens = np.resize(values, length)
    return Sample(tokens, draw(st.text(max_size=300)), draw(st.text(max_size=20)))


@st.composite
def shards(draw: st.DrawFn) -> tuple[np.dtype[Any], list[Sample]]:
    dtype = draw(st.sampled_from(DTYPES))
    return dtype, draw(st.lists(samples(dtype), max_size=12))


def windows(docs: Sequence[Sample], dtype: np.dtype[Any], cuts: Sequence[int] = ()) -> list[Documents]:
    """The documents as windows split at `cuts` (positions, any order)."""
    bounds = [0, *sorted({cut % (len(docs) + 1) for cut in cuts}), len(docs)]
    return [Documents.of(docs[low:high], dtype) for low, high in zip(bounds, bounds[1:])]


def write(path: Path, dtype: np.dtype[Any], docs: Sequence[Sample], cuts: Sequence[int] = ()) -> tuple[ShardEntry, Digest]:
    return mds.write_shard(path, dtype, lambda: windows(docs, dtype, cuts), durable=False)


def plain_shard(dtype: np.dtype[Any], docs: Sequence[Sample]) -> bytes:
    """The layout spelled sample by sample from mosaicml-streaming's MDSWriter and NDArray encoding."""
    encoded = []
    for doc in docs:
        count = len(doc.tokens)
        width = next(code for code, limit in enumerate((1 << 8, 1 << 16, 1 << 32, 1 << 64)) if count < limit)
        tokens = bytes([1 << 2 | width]) + count.to_bytes(1 << width, "little") + doc.tokens.astype(dtype).tobytes()
        columns = [doc.id.encode(), doc.text.encode(), tokens]
        encoded.append(struct.pack("<3I", *map(len, columns)) + b"".join(columns))
    config = json.dumps(mds.shard_config(dtype), sort_keys=True).encode()
    offsets = np.cumsum([0, *map(len, encoded)]) + 4 + 4 * (len(docs) + 1) + len(config)
    return struct.pack("<I", len(docs)) + offsets.astype("<u4").tobytes() + config + b"".join(encoded)


def assert_same_samples(read: Sequence[Sample], docs: Sequence[Sample], dtype: np.dtype[Any]) -> None:
    assert len(read) == len(docs)
    for got, doc in zip(read, docs):
        assert got.tokens.dtype == dtype and got.tokens.tolist() == doc.tokens.tolist()
        assert (got.text, got.id) == (doc.text, doc.id)


@settings(max_examples=60)
@given(shards(), st.lists(st.integers(0, 12), max_size=4))
def test_every_document_comes_back(tmp_path_factory: pytest.TempPathFactory, shard: tuple[np.dtype[Any], list[Sample]],
                                   cuts: list[int]) -> None:
    dtype, docs = shard
    path = tmp_path_factory.mktemp("mds") / "0000000000000000.mds"
    entry, digest = write(path, dtype, docs, cuts)
    assert digest == digest_file(path) and entry == ShardEntry(path.name, digest.size, len(docs), dtype)
    with ShardReader(path, digest) as reader:
        assert reader.dtype == dtype
        assert_same_samples(list(reader), docs, dtype)
        if docs:
            assert_same_samples([reader[-1]], docs[-1:], dtype)


@settings(max_examples=60)
@given(shards(), st.lists(st.integers(0, 12), max_size=4), st.integers(1, 5000))
def test_bytes_are_the_plain_layout_whatever_the_windows_and_chunks(
        tmp_path_factory: pytest.TempPathFactory, shard: tuple[np.dtype[Any], list[Sample]], cuts: list[int],
        limit: int) -> None:
    dtype, docs = shard
    folder = tmp_path_factory.mktemp("mds")
    write(folder / "a.mds", dtype, docs)
    write(folder / "b.mds", dtype, docs, cuts)
    expected = plain_shard(dtype, docs)
    assert (folder / "a.mds").read_bytes() == (folder / "b.mds").read_bytes() == expected
    layout = ShardLayout.plan(dtype, [window.sizes() for window in windows(docs, dtype, cuts)])
    chunks = [chunk for window in windows(docs, dtype, cuts) for chunk in mds.encode_samples(window, limit)]
    assert layout.header() + b"".join(chunks) == expected and layout.size == len(expected)


def test_shape_widths_follow_streaming() -> None:
    counts = np.array([1, 255, 256, 65_535, 65_536, 2**32 - 1, 2**32], dtype=np.int64)
    assert mds.SampleSizes(counts, 0 * counts, 0 * counts).sample_bytes("<u2").tolist() == [
        12 + 1 + width + 2 * count for count, width in zip(counts.tolist(), [1, 1, 2, 2, 4, 4, 8])]


@settings(max_examples=40)
@given(shards(), st.data())
def test_a_truncated_shard_is_refused_on_opening(tmp_path_factory: pytest.TempPathFactory,
                                                 shard: tuple[np.dtype[Any], list[Sample]], data: st.DataObject) -> None:
    dtype, docs = shard
    path = tmp_path_factory.mktemp("mds") / "s.mds"
    entry, _ = write(path, dtype, docs)
    cut = data.draw(st.integers(0, entry.bytes - 1))
    with open(path, "r+b") as handle:
        handle.truncate(cut)
    with pytest.raises(IntegrityError) as error:
        ShardReader(path)
    assert "\n" not in str(error.value) and str(path) in str(error.value)


@settings(max_examples=80)
@given(shards(), st.data())
def test_a_flipped_byte_is_refused_or_only_changes_data(tmp_path_factory: pytest.TempPathFactory,
                                                        shard: tuple[np.dtype[Any], list[Sample]],
                                                        data: st.DataObject) -> None:
    dtype, docs = shard
    path = tmp_path_factory.mktemp("mds") / "s.mds"
    _, digest = write(path, dtype, docs)
    raw = bytearray(path.read_bytes())
    at = data.draw(st.integers(0, len(raw) - 1))
    raw[at] ^= data.draw(st.integers(1, 255))
    path.write_bytes(raw)
    with pytest.raises(IntegrityError) as error:
        ShardReader(path, digest)
    assert "\n" not in str(error.value)
    try:
        with ShardReader(path) as reader:
            read = list(reader)
    except IntegrityError as exc:
        assert "\n" not in str(exc) and str(path) in str(exc)
        return
    header = mds.header_size(dtype, len(docs))
    assert at >= header and len(read) == len(docs)  # a byte of some sample's id, text or token ids


@pytest.mark.parametrize("data", [b"", b"\x01\x00", b"\x00\x00\x00\x00", b"\xff\xff\xff\xff\x00\x00\x00\x00"])
def test_a_file_too_short_for_its_header_is_refused(tmp_path: Path, data: bytes) -> None:
    (tmp_path / "s.mds").write_bytes(data)
    with pytest.raises(IntegrityError, match="s.mds"):
        ShardReader(tmp_path / "s.mds")


def test_an_inconsistent_sample_is_refused() -> None:
    good = b"".join(mds.encode_samples(Documents.of([Sample(np.array([7], "<u2"), "t", "i")], "<u2")))
    assert decode_sample(good, np.dtype("<u2"), "x").text == "t"
    assert good[12:] == b"it\x04\x01\x07\x00"  # id, text, tokens: ndim 1 with a uint8 shape, 1 id
    for bad in (good[:5], good[:-1], good + b"\0", good[:13] + b"\xff" + good[14:], good[:14] + b"\x0c" + good[15:],
                good[:14] + b"\x07" + good[15:], good[:15] + b"\x00" + good[16:], good[:15] + b"\x02" + good[16:]):
        with pytest.raises(IntegrityError, match="^x: "):
            decode_sample(bad, np.dtype("<u2"), "x")


def test_out_of_range_sample_and_missing_file(tmp_path: Path) -> None:
    write(tmp_path / "s.mds", np.dtype("<i4"), [Sample(np.array([1, 2], "<i4"), "a", "b")])
    with ShardReader(tmp_path / "s.mds") as reader, pytest.raises(IndexError, match="out of range"):
        reader[1]
    with pytest.raises(NotFoundError, match="no such file"):
        ShardReader(tmp_path / "missing.mds")


def test_the_writer_refuses_what_mds_cannot_hold(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least one token"):
        write(tmp_path / "a.mds", np.dtype("<u2"), [Sample(np.array([], "<u2"), "", "")])
    with pytest.raises(ValueError, match="uint16 or int32"):
        mds.token_encoding("<i8")
    with pytest.raises(ValueError, match="do not fit"):
        Documents.of([Sample(np.array([70_000]), "", "")], "<u2")
    huge = SampleSizes(np.array([1]), np.array([mds.SIZE_LIMIT]), np.array([0]))
    with pytest.raises(InputError, match="uint32 offsets"):
        ShardLayout.plan("<u2", [huge])
    with pytest.raises(ValueError, match="plain file name"):
        write(tmp_path / "index.json", np.dtype("<u2"), [])


@pytest.mark.parametrize("texts, offsets", [(b"\xff", [0, 1]), ("é".encode(), [0, 1, 2])])
def test_texts_must_be_utf8_piece_by_piece(texts: bytes, offsets: list[int]) -> None:
    count = len(offsets) - 1
    with pytest.raises(ValueError, match="UTF-8"):
        Documents(np.ones(count, "<u2"), np.arange(count + 1), texts, np.array(offsets), b"", np.zeros(count + 1, np.int64))


def test_windows_other_than_the_planned_ones_leave_no_file(tmp_path: Path) -> None:
    docs = [Sample(np.array([1, 2], "<u2"), "ab", "1"), Sample(np.array([3], "<u2"), "c", "2")]
    layout = ShardLayout.plan("<u2", [Documents.of(docs, "<u2").sizes()])
    cases = [[Documents.of(docs[::-1], "<u2")], [Documents.of(docs, "<i4")], [Documents.of(docs[:1], "<u2")]]
    for number, case in enumerate(cases):
        path = tmp_path / f"{number}.mds"
        with pytest.raises(ValueError), mds.ShardWriter(path, layout, durable=False) as writer:
            for window in case:
                writer.write(window)
        assert not path.exists()


def test_index_is_canonical_and_read_back(tmp_path: Path) -> None:
    entries = [ShardEntry(name, size, count, np.dtype("<u2"))
               for name, size, count in [("0000000000000000.mds", 1000, 3), ("8000000000000000.mds", 400, 1)]]
    data = mds.index_bytes(entries)
    assert data == mds.index_bytes(list(entries)) and parse_index(data, "index.json") == tuple(entries)
    index = json.loads(data)
    assert list(index) == ["shards", "version"] and index["version"] == 2
    assert list(index["shards"][0]) == sorted(index["shards"][0])
    assert index["shards"][0]["raw_data"] == {"basename": "0000000000000000.mds", "bytes": 1000, "hashes": {}}
    assert (index["shards"][0]["compression"], index["shards"][0]["hashes"], index["shards"][0]["zip_data"]) == (None, [], None)
    assert index["shards"][1]["column_encodings"] == ["str", "str", "ndarray:uint16"]
    for bad in (data + b"\n", data.replace(b'"version": 2}', b'"version": 3}'), data.replace(b"400", b"401.0"), b"[]", b"\xff"):
        with pytest.raises(IntegrityError, match="^index.json: "):
            parse_index(bad, "index.json")
    with pytest.raises(ValueError, match="unique"):
        mds.index_bytes(entries[:1] * 2)
    for name in ("a/b.mds", "../b.mds", ".mds", ""):
        with pytest.raises(ValueError):
            ShardEntry(name, 1000, 1, np.dtype("<u2"))


def _streaming_python() -> str:
    python = os.environ.get("PREP_MDS_PYTHON", "")
    if not python:
        pytest.skip("PREP_MDS_PYTHON names no python with mosaicml-streaming (CI sets it)")
    return python


def _run_checker(python: str, job: dict[str, Any], folder: Path) -> Any:
    (folder / "job.json").write_text(json.dumps(job), encoding="utf-8")
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTHON")}
    done = subprocess.run([python, str(CHECKER), str(folder / "job.json")], capture_output=True, text=True, env=env,
                          timeout=900, cwd=folder)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


SHARD_DOCUMENTS = [
    [Sample(np.array([1, 2, 3]), "Hello, world.", "doc-1"), Sample(np.array([0]), "", ""),
     Sample(np.arange(300) % 997, "Ünïcødé: 😀 中文 \x00 \u2028 \"quotes\" \\", "id/é")],
    [Sample(np.arange(70_000) % 1000, "long " * 1000, "doc-4")],
    [Sample(np.array([999, 5]), "\n\t tail", "doc-5"), Sample(np.array([42]), "x", "doc-6")],
]


def _snapshot(folder: Path, dtype: np.dtype[Any]) -> list[ShardEntry]:
    """SHARD_DOCUMENTS as shards named like prep's and their index.json in `folder`."""
    folder.mkdir()
    entries = [write(folder / f"{number << 60:016x}.mds", dtype, docs)[0] for number, docs in enumerate(SHARD_DOCUMENTS)]
    (folder / mds.INDEX_BASENAME).write_bytes(mds.index_bytes(entries))
    return entries


def _writer_spec(dtype: np.dtype[Any], out: Path) -> dict[str, Any]:
    return {"dtype": dtype.name, "size_limit": mds.SIZE_LIMIT, "out": str(out),
            "shards": [[{"id": doc.id, "text": doc.text, "tokens": doc.tokens.tolist()} for doc in docs]
                       for docs in SHARD_DOCUMENTS]}


def test_streaming_reads_the_shards_and_its_writer_writes_the_same_bytes(tmp_path: Path) -> None:
    python = _streaming_python()
    entries = {dtype: _snapshot(tmp_path / dtype.name, dtype) for dtype in DTYPES}
    job = {"read": [str(tmp_path / dtype.name) for dtype in DTYPES],
           "write": [_writer_spec(dtype, tmp_path / f"mdswriter-{dtype.name}") for dtype in DTYPES]}
    read = _run_checker(python, job, tmp_path)
    everything = [doc for docs in SHARD_DOCUMENTS for doc in docs]
    for dtype in DTYPES:
        lines = read[str(tmp_path / dtype.name)]
        assert [line["types"] for line in lines] == [["ndarray", "str", "str"]] * len(everything)
        assert [line["dtype"] for line in lines] == [dtype.str] * len(everything)
        assert [(line["tokens"], line["text"], line["id"]) for line in lines] == [
            (doc.tokens.tolist(), doc.text, doc.id) for doc in everything]
        for number, entry in enumerate(entries[dtype]):
            theirs = tmp_path / f"mdswriter-{dtype.name}" / str(number)
            assert (theirs / "shard.00000.mds").read_bytes() == (tmp_path / dtype.name / entry.basename).read_bytes()
            assert (theirs / "index.json").read_bytes() == mds.index_bytes([replace(entry, basename="shard.00000.mds")])


def test_the_checker_imports_nothing_of_prep() -> None:
    text = CHECKER.read_text(encoding="utf-8")
    assert "import prep" not in text and "from prep" not in text


METADATA = [{"url": "https://x/\"q\"\\", "license": {"n": 1, "ü": [1.5, None, True]}}, {}, {"source": "日本 😀"}]


def _with_metadata(docs: Sequence[Sample]) -> list[Sample]:
    return [replace(doc, metadata=mds.metadata_value(json.dumps(METADATA[k % len(METADATA)]).encode()))
            for k, doc in enumerate(docs)]


def test_a_metadata_column_round_trips_in_any_windows(tmp_path: Path) -> None:
    docs = _with_metadata([doc for shard in SHARD_DOCUMENTS for doc in shard])
    entry, digest = write(tmp_path / "a.mds", np.dtype("<u2"), docs, cuts=[1, 3])
    _, again = write(tmp_path / "b.mds", np.dtype("<u2"), docs)
    assert digest == again and entry.with_metadata
    assert json.loads(mds.index_bytes([entry]))["shards"][0]["column_names"] == ["id", "metadata", "text", "tokens"]
    with ShardReader(tmp_path / "a.mds", digest) as reader:
        assert [(s.id, s.metadata) for s in reader] == [(d.id, d.metadata) for d in docs]
    assert parse_index(mds.index_bytes([entry]), "index.json") == (entry,)


def test_streaming_writes_the_same_metadata_shards_and_reads_them(tmp_path: Path) -> None:
    python = _streaming_python()
    dtype = np.dtype("<u2")
    folder = tmp_path / "ours"
    folder.mkdir()
    shards = [_with_metadata(docs) for docs in SHARD_DOCUMENTS]
    entries = [write(folder / f"{number << 60:016x}.mds", dtype, docs)[0] for number, docs in enumerate(shards)]
    (folder / mds.INDEX_BASENAME).write_bytes(mds.index_bytes(entries))
    spec = {**_writer_spec(dtype, tmp_path / "theirs"), "metadata": True,
            "shards": [[{"id": d.id, "text": d.text, "tokens": d.tokens.tolist(), "metadata": json.loads(d.metadata or b"")}
                        for d in docs] for docs in shards]}
    read = _run_checker(python, {"read": [str(folder)], "write": [spec]}, tmp_path)
    assert [line["metadata"] for line in read[str(folder)]] == [json.loads(d.metadata or b"") for docs in shards
                                                                 for d in docs]
    for number, entry in enumerate(entries):
        theirs = tmp_path / "theirs" / str(number)
        assert (theirs / "shard.00000.mds").read_bytes() == (folder / entry.basename).read_bytes()
        assert (theirs / "index.json").read_bytes() == mds.index_bytes([replace(entry, basename="shard.00000.mds")])
