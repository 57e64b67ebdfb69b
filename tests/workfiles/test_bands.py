"""A part's bands object: every (document, band) record once, sorted by hash, the same bytes
whatever the batches; any hash bucket of any bucket count found through its index; a damaged
object is an IntegrityError, never a wrong slice."""

from __future__ import annotations

import os
import struct
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prep.errors import IntegrityError
from prep.workfiles.bands import BAND_DTYPE, BandsWriter, open_bands
from prep.workfiles.keys import bucket_of

Array = np.ndarray[Any, Any]
BANDS = 3


def _documents(count: int, seed: int = 0) -> tuple[Array, Array, Array]:
    """Rows (increasing, with gaps), key high words and band hashes of `count` documents."""
    rng = np.random.default_rng(seed)
    rows = np.cumsum(rng.integers(1, 4, count)).astype(np.int64)
    hashes = rng.integers(0, 2**64, (count, BANDS), dtype=np.uint64)
    hashes[1::5, 0] = hashes[0, 0] if count else 0  # shared hashes: ties broken by row
    return rows, rng.integers(0, 2**64, count, dtype=np.uint64), hashes


def _write(path: Path, rows: Array, keys: Array, hashes: Array, batch: int) -> bytes:
    writer = BandsWriter(path, BANDS)
    for low in range(0, len(rows), batch):
        writer.add(rows[low:low + batch], keys[low:low + batch], hashes[low:low + batch])
    writer.close()
    return path.read_bytes()


@settings(max_examples=40, deadline=None)
@given(count=st.integers(0, 120), batches=st.lists(st.integers(1, 50), min_size=2, max_size=2), seed=st.integers(0, 99),
       bits=st.integers(0, 10))
def test_bands_round_trip_in_the_same_bytes_whatever_the_batches(count: int, batches: list[int], seed: int,
                                                                 bits: int) -> None:
    rows, keys, hashes = _documents(count, seed)
    with tempfile.TemporaryDirectory() as directory:
        first = _write(Path(directory) / "a.bands", rows, keys, hashes, batches[0])
        second = _write(Path(directory) / "b.bands", rows, keys, hashes, batches[1])
        opened = open_bands(Path(directory) / "a.bands")
        records = opened.read_all()
        buckets = [opened.read_bucket(bucket, bits) for bucket in range(1 << bits)]
    assert first == second
    assert len(records) == count * BANDS
    assert sorted(zip(records["hash"].tolist(), records["row"].tolist(), records["key_hi"].tolist())) == sorted(
        zip(hashes.ravel().tolist(), np.repeat(rows, BANDS).tolist(), np.repeat(keys, BANDS).tolist()))
    assert np.array_equal(np.lexsort((records["row"], records["hash"])), np.arange(len(records)))
    for bucket, found in enumerate(buckets):
        assert np.array_equal(found, records[bucket_of(records["hash"], bits) == bucket])


def test_a_batch_of_the_wrong_shape_is_refused(tmp_path: Path) -> None:
    rows, keys, hashes = _documents(4)
    with pytest.raises(ValueError, match="band hashes"):
        BandsWriter(tmp_path / "x.bands", BANDS + 1).add(rows, keys, hashes)


def _written(tmp_path: Path, count: int = 50) -> Path:
    path = tmp_path / "part.bands"
    _write(path, *_documents(count), batch=16)
    return path


def _patch(path: Path, offset: int, data: bytes) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset:offset + len(data)] = data
    path.write_bytes(bytes(raw))


def test_a_truncated_bands_object_is_an_integrity_error(tmp_path: Path) -> None:
    path = _written(tmp_path)
    os.truncate(path, path.stat().st_size - 7)
    with pytest.raises(IntegrityError, match="not the bands object its header says"):
        open_bands(path)
    os.truncate(path, 12)
    with pytest.raises(IntegrityError, match="not a prep bands object"):
        open_bands(path)


def test_a_damaged_bands_object_is_an_integrity_error(tmp_path: Path) -> None:
    path = _written(tmp_path)
    opened = open_bands(path)
    original = path.read_bytes()
    _patch(path, opened.index_at + 4, struct.pack("<I", 10**6))  # prefix 1 ends past the last record
    with pytest.raises(IntegrityError, match="index is out of order"):
        opened.read_bucket(0, opened.header["index_bits"])
    path.write_bytes(original)
    _patch(path, opened.records_at + BAND_DTYPE.itemsize + 7, b"\xff")  # the second hash's top byte
    with pytest.raises(IntegrityError, match="out of order|outside bucket"):
        opened.read_all()
    path.write_bytes(original)
    _patch(path, 0, b"PREPENT1")
    with pytest.raises(IntegrityError, match="not a prep bands object"):
        open_bands(path)


def test_an_entries_index_pointing_into_another_bucket_is_caught(tmp_path: Path) -> None:
    path = _written(tmp_path, 200)
    opened = open_bands(path)
    bits = opened.header["index_bits"]
    counts = np.frombuffer(path.read_bytes()[opened.index_at:opened.records_at], dtype="<u4")
    busy = int(np.flatnonzero(np.diff(counts) > 0)[1])  # the second prefix with records
    _patch(path, opened.index_at + 4 * busy, struct.pack("<I", 0))  # its start moved back to record 0
    with pytest.raises(IntegrityError, match="outside bucket"):
        opened.read_bucket(busy, bits)
