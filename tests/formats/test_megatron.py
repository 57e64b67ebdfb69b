"""Megatron .bin/.idx: layout arithmetic, positional writes, strict reading, and megatron-core itself."""

from __future__ import annotations

import os
import random
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prep.errors import IntegrityError, NotFoundError
from prep.formats import megatron
from prep.formats.megatron import MegatronReader, bin_path, idx_path

DTYPES: list[np.dtype[Any]] = [np.dtype("<u2"), np.dtype("<i4")]


def _sequences(draw: st.DrawFn, dtype: np.dtype) -> list[np.ndarray]:
    high = 65_535 if dtype == np.uint16 else 2**31 - 1
    lists = draw(st.lists(st.lists(st.integers(0, high), max_size=40), max_size=25))
    return [np.array(tokens, dtype=dtype) for tokens in lists]


@st.composite
def datasets(draw: st.DrawFn) -> tuple[np.dtype, list[np.ndarray]]:
    dtype = draw(st.sampled_from(DTYPES))
    return dtype, _sequences(draw, dtype)


def _lengths(sequences: list[np.ndarray]) -> np.ndarray:
    return np.array([len(sequence) for sequence in sequences], dtype=np.int64)


def test_dtype_codes_match_megatron() -> None:
    assert megatron.DTYPE_CODES[np.dtype(np.uint16)] == 8
    assert megatron.DTYPE_CODES[np.dtype(np.int32)] == 4
    assert megatron.HEADER_SIZE == 34
    with pytest.raises(ValueError):
        megatron.dtype_code(np.uint32)


def test_index_layout_field_by_field() -> None:
    data = megatron.index_bytes([3, 0, 2], np.int32)
    assert data[:9] == b"MMIDIDX\x00\x00"
    assert struct.unpack_from("<QBQQ", data, 9) == (1, 4, 3, 4)
    body = data[34:]
    assert np.frombuffer(body[:12], "<i4").tolist() == [3, 0, 2]
    assert np.frombuffer(body[12:36], "<i8").tolist() == [0, 12, 12]
    assert np.frombuffer(body[36:], "<i8").tolist() == [0, 1, 2, 3]
    assert len(data) == megatron.index_size(3)


def test_empty_dataset(tmp_path: Path) -> None:
    prefix = tmp_path / "empty"
    megatron.write_dataset(prefix, [], np.uint16)
    assert bin_path(prefix).stat().st_size == 0
    assert idx_path(prefix).read_bytes() == megatron.index_bytes([], np.uint16)
    reader = MegatronReader(prefix)
    assert len(reader) == 0
    with pytest.raises(IndexError):
        reader[0]


@settings(max_examples=40, deadline=None)
@given(datasets(), st.randoms(use_true_random=False))
def test_positional_writes_equal_sequential_writes(
    tmp_path_factory: pytest.TempPathFactory, dataset: tuple[np.dtype, list[np.ndarray]], rng: random.Random
) -> None:
    dtype, sequences = dataset
    folder = tmp_path_factory.mktemp("megatron")
    megatron.write_dataset(folder / "sequential", sequences, dtype)

    lengths = _lengths(sequences)
    pointers = megatron.sequence_pointers(lengths, dtype)
    order = list(range(len(sequences)))
    rng.shuffle(order)
    scattered = folder / "scattered.bin"
    descriptor = os.open(scattered, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        os.ftruncate(descriptor, megatron.bin_size(lengths, dtype))
        for position in order:
            os.pwrite(descriptor, megatron.sequence_bytes(sequences[position], dtype), int(pointers[position]))
    finally:
        os.close(descriptor)
    assert scattered.read_bytes() == bin_path(folder / "sequential").read_bytes()
    assert megatron.index_bytes(lengths, dtype) == idx_path(folder / "sequential").read_bytes()


@settings(max_examples=40, deadline=None)
@given(datasets())
def test_round_trip_through_reader_and_plain_memmap(
    tmp_path_factory: pytest.TempPathFactory, dataset: tuple[np.dtype, list[np.ndarray]]
) -> None:
    dtype, sequences = dataset
    prefix = tmp_path_factory.mktemp("megatron") / "shard"
    megatron.write_dataset(prefix, sequences, dtype)

    index = megatron.read_index(idx_path(prefix))
    assert index.dtype == dtype
    assert index.lengths.tolist() == _lengths(sequences).tolist()
    assert index.document_indices.tolist() == list(range(len(sequences) + 1))
    reader = MegatronReader(bin_file=bin_path(prefix), idx_file=idx_path(prefix))
    assert len(reader) == len(sequences)
    for position, sequence in enumerate(sequences):
        assert reader[position].dtype == dtype
        assert np.array_equal(reader[position], sequence)
    if sequences:
        assert np.array_equal(reader[-1], sequences[-1])
    if index.bin_size:
        tokens = np.memmap(bin_path(prefix), dtype=dtype, mode="r")
        for pointer, length, sequence in zip(index.pointers, index.lengths, sequences):
            start = int(pointer) // dtype.itemsize
            assert np.array_equal(tokens[start : start + int(length)], sequence)


def test_reader_needs_prefix_or_both_paths(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        MegatronReader()
    with pytest.raises(ValueError):
        MegatronReader(tmp_path / "x", bin_file=tmp_path / "x.bin")
    with pytest.raises(ValueError):
        MegatronReader(bin_file=tmp_path / "x.bin")


def test_sequence_bytes_refuse_ids_the_dtype_cannot_hold() -> None:
    with pytest.raises(ValueError, match="do not fit"):
        megatron.sequence_bytes([70_000], np.uint16)
    assert megatron.sequence_bytes([70_000], np.int32) == struct.pack("<i", 70_000)


def _corrupt(data: bytes, offset: int, replacement: bytes) -> bytes:
    return data[:offset] + replacement + data[offset + len(replacement) :]


GOOD = megatron.index_bytes([2, 3], np.uint16)
CORRUPTIONS = {
    "short": GOOD[:20],
    "magic": _corrupt(GOOD, 0, b"XXIDIDX"),
    "version": _corrupt(GOOD, 9, struct.pack("<Q", 2)),
    "dtype code": _corrupt(GOOD, 17, b"\x09"),
    "trailing bytes": GOOD + b"\x00",
    "truncated": GOOD[:-1],
    "sequence count": _corrupt(GOOD, 18, struct.pack("<Q", 3)),
    "negative length": _corrupt(GOOD, 34, struct.pack("<i", -2)),
    "pointer": _corrupt(GOOD, 34 + 8 + 8, struct.pack("<q", 5)),
    "document start": _corrupt(GOOD, 34 + 24, struct.pack("<q", 1)),
    "document end": _corrupt(GOOD, len(GOOD) - 8, struct.pack("<q", 7)),
}


@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
def test_corrupt_index_raises_integrity_error_naming_the_file(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "bad.idx"
    path.write_bytes(CORRUPTIONS[kind])
    with pytest.raises(IntegrityError, match="bad.idx"):
        megatron.read_index(path)


def test_bin_of_wrong_size_or_missing_files(tmp_path: Path) -> None:
    prefix = tmp_path / "shard"
    megatron.write_dataset(prefix, [np.array([1, 2, 3])], np.uint16)
    with open(bin_path(prefix), "ab") as out:
        out.write(b"\x00\x00")
    with pytest.raises(IntegrityError, match="shard.bin"):
        MegatronReader(prefix)
    bin_path(prefix).unlink()
    with pytest.raises(NotFoundError, match="shard.bin"):
        MegatronReader(prefix)
    with pytest.raises(NotFoundError, match="nothing.idx"):
        megatron.read_index(tmp_path / "nothing.idx")


def test_write_index_is_byte_reproducible(tmp_path: Path) -> None:
    lengths = np.array([5, 1, 0, 9])
    megatron.write_index(tmp_path / "a.idx", lengths, np.int32)
    megatron.write_index(tmp_path / "b.idx", lengths.astype(np.int32), "int32")
    assert (tmp_path / "a.idx").read_bytes() == (tmp_path / "b.idx").read_bytes()


# --- megatron-core, the real consumer --------------------------------------------------------


@pytest.fixture(scope="module")
def indexed_dataset() -> object:
    return pytest.importorskip(
        "megatron.core.datasets.indexed_dataset",
        reason="megatron-core (with torch) is not installed; CI installs it",
    )


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_megatron_core_builder_writes_identical_bytes(tmp_path: Path, indexed_dataset: object, dtype: np.dtype) -> None:
    import torch

    rng = np.random.default_rng(7)
    high = 65_535 if dtype == np.uint16 else 2**31 - 1
    sequences = [rng.integers(0, high, size=int(size), endpoint=True).astype(dtype) for size in rng.integers(0, 300, 50)]
    sequences[3] = sequences[3][:0]
    ours = tmp_path / "ours"
    megatron.write_dataset(ours, sequences, dtype)

    theirs = tmp_path / "theirs"
    builder = indexed_dataset.IndexedDatasetBuilder(str(bin_path(theirs)), dtype=dtype.type)  # type: ignore[attr-defined]
    for sequence in sequences:
        builder.add_item(torch.from_numpy(sequence.astype(np.int64)))
        builder.end_document()
    builder.finalize(str(idx_path(theirs)))

    assert bin_path(ours).read_bytes() == bin_path(theirs).read_bytes()
    assert idx_path(ours).read_bytes() == idx_path(theirs).read_bytes()


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("mmap", [True, False], ids=["mmap", "file"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_megatron_core_reads_every_sequence(
    tmp_path: Path, indexed_dataset: object, dtype: np.dtype, mmap: bool
) -> None:
    rng = np.random.default_rng(11)
    high = 65_535 if dtype == np.uint16 else 2**31 - 1
    sequences = [rng.integers(0, high, size=int(size), endpoint=True).astype(dtype) for size in rng.integers(0, 500, 80)]
    sequences[0] = sequences[0][:0]
    prefix = tmp_path / "shard"
    megatron.write_dataset(prefix, sequences, dtype)

    dataset = indexed_dataset.IndexedDataset(str(prefix), mmap=mmap)  # type: ignore[attr-defined]
    assert len(dataset) == len(sequences)
    assert dataset.index.dtype == dtype.type
    assert dataset.document_indices.tolist() == list(range(len(sequences) + 1))
    assert dataset.sequence_lengths.tolist() == [len(sequence) for sequence in sequences]
    for position, sequence in enumerate(sequences):
        assert np.array_equal(dataset[position], sequence)
    assert all(np.array_equal(got, want) for got, want in zip(dataset[2:9], sequences[2:9]))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 2**31 - 1), max_size=40), st.integers(1, 7), st.sampled_from(["<u2", "<i4"]))
def test_index_pieces_are_the_index_bytes(lengths: list[int], piece: int, dtype: str) -> None:
    """Pieces of any size join to the one-piece .idx (header, sizes, pointers, document index),
    whether the lengths come whole or as consecutive runs."""
    module = megatron
    whole = b"".join(module.index_pieces(lengths, dtype))
    pointers = np.concatenate(([0], np.cumsum(np.asarray(lengths, dtype=np.int64) * np.dtype(dtype).itemsize)))[:-1]
    assert whole[-8 * (len(lengths) + 1):] == np.arange(len(lengths) + 1, dtype="<i8").tobytes()
    assert whole[-8 * (2 * len(lengths) + 1):-8 * (len(lengths) + 1)] == pointers.astype("<i8").tobytes()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(module, "INDEX_PIECE", piece)
        assert b"".join(module.index_pieces(lengths, dtype)) == whole
        cuts = sorted({0, len(lengths), *(i * piece % (len(lengths) + 1) for i in range(3))})
        runs = [np.asarray(lengths[low:high], dtype=np.int64) for low, high in zip(cuts[:-1], cuts[1:])]
        assert b"".join(module.index_pieces_of_runs(runs, dtype)) == whole
        assert b"".join(module.index_pieces_of_runs([], dtype)) == b"".join(module.index_pieces([], dtype))
