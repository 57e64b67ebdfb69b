"""WebDataset tar: ustar headers, NPY bytes, layout arithmetic and positional writes, read back with tarfile."""

from __future__ import annotations

import io
import os
import random
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prep.errors import InputError, IntegrityError, NotFoundError
from prep.formats import wds
from prep.formats.wds import Sample

DTYPES: list[np.dtype[Any]] = [np.dtype("<u2"), np.dtype("<i4")]


@st.composite
def token_arrays(draw: st.DrawFn) -> np.ndarray:
    dtype = draw(st.sampled_from(DTYPES))
    high = 65_535 if dtype == np.uint16 else 2**31 - 1
    return np.array(draw(st.lists(st.integers(0, high), max_size=300)), dtype=dtype)


@st.composite
def samples(draw: st.DrawFn, position: int) -> Sample:
    return Sample.build(
        position,
        doc_id=draw(st.text(max_size=20)),
        source=draw(st.text(max_size=30)),
        line=draw(st.integers(0, 10**9)),
        tokens=draw(token_arrays()),
        text=draw(st.text(max_size=1500)),
    )


@st.composite
def shards(draw: st.DrawFn) -> list[Sample]:
    first = draw(st.integers(0, 10**9))
    count = draw(st.integers(0, 12))
    return [draw(samples(first + offset)) for offset in range(count)]


def _tarfile_header(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime, info.uid, info.gid, info.uname, info.gname = size, 0o644, 0, 0, 0, "", ""
    return info.tobuf(format=tarfile.USTAR_FORMAT)


def test_sample_key_is_ten_digit_position() -> None:
    assert wds.sample_key(0) == "0000000000"
    assert wds.sample_key(1234) == "0000001234"
    assert wds.sample_key(9_999_999_999) == "9999999999"
    for bad in (-1, 10**10):
        with pytest.raises(ValueError):
            wds.sample_key(bad)


@pytest.mark.parametrize("key", ["", "a.b", "a/b", "é", "a\x00", "x" * 95])
def test_member_names_that_readers_would_split_or_ustar_cannot_hold_are_refused(key: str) -> None:
    with pytest.raises(ValueError):
        wds.sample_bytes(key, b"", b"", b"")


@settings(max_examples=60)
@given(st.text("abcdefghij0123456789_-", min_size=1, max_size=88), st.integers(0, wds.MAX_MEMBER_SIZE))
def test_header_equals_python_tarfile_ustar_header(key: str, size: int) -> None:
    name = wds.member_name(key, "tokens.npy")
    assert wds.member_header(name, size) == _tarfile_header(name, size)


def test_member_size_limits() -> None:
    assert wds.member_span(0) == 512
    assert wds.member_span(1) == 1024
    assert wds.member_span(512) == 1024
    assert wds.member_span(513) == 1536
    with pytest.raises(InputError, match="ustar limit"):
        wds.member_span(wds.MAX_MEMBER_SIZE + 1)


@settings(max_examples=60)
@given(token_arrays())
def test_npy_bytes_equal_numpy_save_and_load_back(tokens: np.ndarray) -> None:
    saved = io.BytesIO()
    np.save(saved, tokens)
    data = wds.npy_bytes(tokens)
    assert data == saved.getvalue()
    assert len(data) == wds.npy_size(tokens.size, tokens.dtype)
    loaded = np.load(io.BytesIO(data))
    assert loaded.dtype == tokens.dtype and np.array_equal(loaded, tokens)
    assert np.array_equal(wds.load_npy(data), tokens)


@settings(max_examples=40)
@given(
    st.lists(st.tuples(*[st.integers(0, 10**7)] * 3), max_size=20),
    st.sampled_from(DTYPES),
)
def test_vectorised_layout_equals_scalar_layout(sizes: list[tuple[int, int, int]], dtype: np.dtype[Any]) -> None:
    columns = np.array(sizes, dtype=np.int64).reshape(-1, 3).T
    assert wds.npy_sizes(columns[1], dtype).tolist() == [wds.npy_size(int(n), dtype) for n in columns[1]]
    assert wds.sample_spans(*columns).tolist() == [wds.sample_span(*row) for row in sizes]
    with pytest.raises(InputError):
        wds.sample_spans([0], [wds.MAX_MEMBER_SIZE + 1], [0])


def test_npy_header_is_aligned_for_every_digit_count() -> None:
    for count in (0, 9, 10, 10**6, 10**12):
        for dtype in DTYPES:
            assert len(wds.npy_header(count, dtype)) % 64 == 0


def test_sample_json_is_canonical() -> None:
    data = wds.sample_json("doc-ü", "corpus/a.jsonl", 7, 12)
    assert data == '{"id":"doc-ü","line":7,"source":"corpus/a.jsonl","tokens":12}'.encode()


def _sequential(path: Path, shard: list[Sample]) -> bytes:
    size = wds.write_shard(path, shard)
    data = path.read_bytes()
    assert size == len(data)
    return data


@settings(max_examples=40, deadline=None)
@given(shards(), st.randoms(use_true_random=False))
def test_positional_writes_in_any_order_equal_sequential_writes(
    tmp_path_factory: pytest.TempPathFactory, shard: list[Sample], rng: random.Random
) -> None:
    folder = tmp_path_factory.mktemp("wds")
    sequential = _sequential(folder / "sequential.tar", shard)
    assert _sequential(folder / "again.tar", shard) == sequential

    spans = [wds.sample_span(len(s.json), len(s.tokens), len(s.text)) for s in shard]
    offsets = np.concatenate([[0], np.cumsum(spans, dtype=np.int64)]).tolist()
    total = wds.archive_size(spans)
    assert total == len(sequential)
    order = list(range(len(shard)))
    rng.shuffle(order)
    descriptor = os.open(folder / "scattered.tar", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        os.pwrite(descriptor, wds.END_OF_ARCHIVE, offsets[-1])
        for position in order:
            sample = shard[position]
            data = wds.sample_bytes(sample.key, sample.json, sample.tokens, sample.text)
            assert len(data) == spans[position] == sample.span
            os.pwrite(descriptor, data, offsets[position])
    finally:
        os.close(descriptor)
    assert (folder / "scattered.tar").read_bytes() == sequential


@settings(max_examples=30, deadline=None)
@given(shards())
def test_tarfile_reads_names_sizes_contents_and_fixed_metadata(
    tmp_path_factory: pytest.TempPathFactory, shard: list[Sample]
) -> None:
    path = tmp_path_factory.mktemp("wds") / "shard.tar"
    data = _sequential(path, shard)
    expected = [
        (f"{sample.key}.{suffix}", content)
        for sample in shard
        for suffix, content in zip(wds.MEMBER_SUFFIXES, (sample.json, sample.tokens, sample.text))
    ]
    assert [name for name, _ in expected] == sorted(name for name, _ in expected)
    with tarfile.open(path) as archive:
        members = archive.getmembers()
        assert [member.name for member in members] == [name for name, _ in expected]
        for member, (_, content) in zip(members, expected):
            assert member.isreg() and member.size == len(content)
            assert (member.mode, member.mtime, member.uid, member.gid) == (0o644, 0, 0, 0)
            assert (member.uname, member.gname, member.pax_headers) == ("", "", {})
            extracted = archive.extractfile(member)
            assert extracted is not None and extracted.read() == content
    assert list(wds.iter_samples(path)) == [
        (sample.key, {"json": sample.json, "tokens.npy": sample.tokens, "txt": sample.text}) for sample in shard
    ]
    # Python's own writer produces the same bytes, plus zero padding to a 10240-byte record.
    written = io.BytesIO()
    with tarfile.open(fileobj=written, mode="w", format=tarfile.USTAR_FORMAT) as archive:
        for name, content in expected:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(content), 0o644, 0
            archive.addfile(info, io.BytesIO(content))
    theirs = written.getvalue()
    assert theirs[: len(data)] == data and not any(theirs[len(data) :])


def test_empty_shard_is_just_the_end_of_archive(tmp_path: Path) -> None:
    path = tmp_path / "empty.tar"
    assert wds.write_shard(path, []) == 1024
    assert path.read_bytes() == bytes(1024)
    assert list(wds.iter_samples(path)) == []
    with tarfile.open(path) as archive:
        assert archive.getmembers() == []


def _raw_tar(path: Path, members: list[tuple[str, bytes]]) -> None:
    path.write_bytes(b"".join(wds.member_bytes(name, data) for name, data in members) + wds.END_OF_ARCHIVE)


def test_iter_samples_rejects_bad_archives(tmp_path: Path) -> None:
    with pytest.raises(NotFoundError, match="missing.tar"):
        list(wds.iter_samples(tmp_path / "missing.tar"))
    garbage = tmp_path / "garbage.tar"
    garbage.write_bytes(b"not a tar file at all" * 40)
    with pytest.raises(IntegrityError, match="garbage.tar"):
        list(wds.iter_samples(garbage))
    split = tmp_path / "split.tar"
    _raw_tar(split, [("0000000001.json", b"{}"), ("0000000002.json", b"{}"), ("0000000001.txt", b"")])
    with pytest.raises(IntegrityError, match="not adjacent"):
        list(wds.iter_samples(split))
    duplicate = tmp_path / "duplicate.tar"
    _raw_tar(duplicate, [("0000000001.txt", b"a"), ("0000000001.txt", b"b")])
    with pytest.raises(IntegrityError, match="duplicate member"):
        list(wds.iter_samples(duplicate))
    truncated = tmp_path / "truncated.tar"
    whole = wds.Sample.build(1, "d", "s", 1, np.arange(600, dtype=np.uint16), "x" * 2000).to_bytes()
    truncated.write_bytes(whole[:-700])
    with pytest.raises(IntegrityError, match="truncated.tar"):
        list(wds.iter_samples(truncated))


@given(positions=st.lists(st.integers(0, 10**10 - 1), max_size=20), suffix=st.sampled_from(wds.MEMBER_SUFFIXES),
       data=st.data())
def test_vectorised_headers_equal_single_headers(positions: list[int], suffix: str, data: st.DataObject) -> None:
    sizes = data.draw(st.lists(st.integers(0, wds.MAX_MEMBER_SIZE), min_size=len(positions), max_size=len(positions)))
    headers = wds.member_headers(positions, suffix, sizes)
    for row, position, size in zip(headers, positions, sizes):
        assert row.tobytes() == wds.member_header(wds.member_name(wds.sample_key(position), suffix), size)


@given(key=st.integers(0, 10**10 - 1), suffix=st.sampled_from(wds.MEMBER_SUFFIXES), size=st.integers(0, wds.MAX_MEMBER_SIZE))
def test_template_header_equals_field_by_field_header(key: int, suffix: str, size: int) -> None:
    name = wds.member_name(wds.sample_key(key), suffix)
    assert wds.member_header(name, size) == wds._member_header_reference(name, size)


@given(doc_id=st.text(st.characters(exclude_categories=["Cs"])), source=st.text(min_size=1), line=st.integers(1, 10**9),
       tokens=st.integers(1, 10**9))
def test_sample_json_is_canonical_json(doc_id: str, source: str, line: int, tokens: int) -> None:
    from prep.manifest import canonical

    expected = canonical.dumps({"id": doc_id, "line": line, "source": source, "tokens": tokens})
    assert wds.sample_json(doc_id, source, line, tokens) == expected
