"""A part's entries object: every document once, in key order, and any key bucket of any bucket
count found through its index, whether the index is finer or coarser than the buckets; a
damaged index or header is an IntegrityError, never a wrong slice."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prep.errors import IntegrityError
from prep.workfiles import entries as entry_objects
from prep.workfiles.intermediate import hash_pairs
from prep.workfiles.keys import bucket_of, order_keys

SEED = 11


def _table(hashes: list[tuple[int, int]], with_ids: bool) -> pa.Table:
    """A part's metadata columns (PART_COLUMNS) for documents with these text hashes."""
    count = len(hashes)
    raw = b"".join(hi.to_bytes(8, "little") + lo.to_bytes(8, "little") for hi, lo in hashes)
    return pa.table({
        "row": pa.array(range(count), pa.int64()),
        "id": pa.array([f"doc-{row}" if with_ids and row % 3 else None for row in range(count)], pa.string()),
        "text_hash": pa.array([raw[16 * i:16 * i + 16] for i in range(count)], pa.binary(16)),
        "text_bytes": pa.array([row % 7 for row in range(count)], pa.int64()),
        "n_tokens": pa.array([row % 5 for row in range(count)], pa.int32()),
        "text_offset": pa.array([1000 + row for row in range(count)], pa.int64()),
        "tokens_offset": pa.array([row * 3 for row in range(count)], pa.int64()),
    })


_hashes = st.lists(st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1)), max_size=70)


@settings(max_examples=60, deadline=None)
@given(hashes=_hashes, repeats=st.integers(0, 5), with_ids=st.booleans(), extra_bits=st.integers(0, 4))
def test_every_bucket_of_every_bucket_count_is_found_through_the_index(
        tmp_path_factory: pytest.TempPathFactory, hashes: list[tuple[int, int]], repeats: int, with_ids: bool,
        extra_bits: int) -> None:
    hashes = hashes + hashes[:repeats]  # equal texts: equal keys, kept apart by row
    path = tmp_path_factory.mktemp("entries") / "part.entries"
    entry_objects.write_part_entries(path, _table(hashes, with_ids), SEED)
    opened = entry_objects.EntryFile.open(path)
    index_bits = opened.header["index_bits"]
    assert index_bits == entry_objects.index_bits_for(len(hashes)) <= entry_objects.MAX_INDEX_BITS
    everything, blob = opened.read(0, opened.header["count"])
    key_hi, key_lo = order_keys(np.asarray(hashes, dtype=np.uint64).reshape(-1, 2), SEED)
    assert sorted(zip(everything["key_hi"].tolist(), everything["key_lo"].tolist(), everything["row"].tolist())) == \
        list(zip(everything["key_hi"].tolist(), everything["key_lo"].tolist(), everything["row"].tolist()))
    assert sorted(everything["row"].tolist()) == list(range(len(hashes))) and not everything["part"].any()
    assert (everything["key_hi"] == key_hi[everything["row"]]).all()
    ids = [None if n == entry_objects.NO_ID else blob[o:o + n].decode() for o, n in
           zip(everything["id_offset"].tolist(), everything["id_len"].tolist())]
    assert ids == [f"doc-{row}" if with_ids and row % 3 else None for row in everything["row"].tolist()]
    for bits in range(0, index_bits + extra_bits + 1):
        found: list[int] = []
        for bucket in range(1 << bits):
            first, count = opened.bucket_range(bucket, bits)
            chunk, _ = opened.read(first, count)
            if bits > index_bits:
                chunk = chunk[bucket_of(chunk["key_hi"], bits) == bucket]
            assert (bucket_of(chunk["key_hi"], bits) == bucket).all()
            found.extend(chunk["row"].tolist())
        assert sorted(found) == list(range(len(hashes))), bits


def _write(tmp_path: Path, count: int) -> Path:
    path = tmp_path / "part.entries"
    entry_objects.write_part_entries(path, _table([(i * 0x9E3779B97F4A7C15 % 2**64, i) for i in range(count)], True),
                                     SEED)
    return path


def _patch(path: Path, at: int, data: bytes) -> None:
    with open(path, "r+b") as handle:
        handle.seek(at)
        handle.write(data)


def test_an_index_out_of_order_is_an_integrity_error(tmp_path: Path) -> None:
    path = _write(tmp_path, 40)
    opened = entry_objects.EntryFile.open(path)
    _patch(path, opened.index_at + 4, struct.pack("<I", 41))  # prefix 1 starts past the last entry
    with pytest.raises(IntegrityError, match="index is out of order"):
        opened.bucket_range(0, opened.header["index_bits"])


def test_part_entries_without_a_valid_index_are_refused(tmp_path: Path) -> None:
    path = _write(tmp_path, 5)
    raw = path.read_bytes()
    (length,) = struct.unpack_from("<Q", raw, 8)
    header = raw[16:16 + length]
    for bad in (header.replace(b'"index_bits":3', b'"index_bits":21'),
                header.replace(b'"index_bits":3', b'"index_bits":"3"')):
        assert bad != header and len(bad) >= len(header) - 1
        path.write_bytes(raw[:8] + struct.pack("<Q", len(bad)) + bad + raw[16 + length:])
        with pytest.raises(IntegrityError, match="without a valid index_bits"):
            entry_objects.EntryFile.open(path)


def test_a_bucket_object_is_not_read_as_a_part(tmp_path: Path) -> None:
    path = tmp_path / "bucket.entries"
    entry_objects.write_entries(path, {"schema": "prep.entries/1", "kind": "bucket", "bits": 0, "bucket": 0},
                                np.zeros(2, dtype=entry_objects.ENTRY_DTYPE), b"")
    with pytest.raises(IntegrityError, match="a bucket entries object, not a part's"):
        entry_objects.EntryFile.open(path).bucket_range(0, 0)


def test_a_truncated_part_entries_object_is_an_integrity_error(tmp_path: Path) -> None:
    path = _write(tmp_path, 30)
    os.truncate(path, path.stat().st_size - 200)
    opened = entry_objects.EntryFile.open(path)
    with pytest.raises(IntegrityError, match="shorter than its header says"):
        opened.read(*opened.bucket_range(0, 0))


@settings(max_examples=60, deadline=None)
@given(hashes=_hashes, repeats=st.integers(0, 5), batch=st.integers(1, 20), with_ids=st.booleans())
def test_entries_sorted_from_the_writers_key_runs_are_the_same_bytes(
        hashes: list[tuple[int, int]], repeats: int, batch: int, with_ids: bool) -> None:
    """The tokenize task hands over each batch's key order (IntermediateWriter.key_runs) to
    speed up the part's sort: it must never change an entry."""
    hashes = hashes + hashes[:repeats]  # equal keys: ties broken by row
    table = _table(hashes, with_ids)
    key_hi, _ = order_keys(hash_pairs(table.column("text_hash")), SEED)
    runs = np.concatenate([low + np.argsort(key_hi[low:low + batch], kind="stable")
                           for low in range(0, len(hashes), batch)] or [np.zeros(0, np.int64)])
    plain, plain_ids = entry_objects.part_entries(table, SEED)
    merged, merged_ids = entry_objects.part_entries(table, SEED, runs)
    assert merged.tobytes() == plain.tobytes() and merged_ids == plain_ids


@settings(max_examples=40, deadline=None)
@given(values=st.lists(st.integers(0, 2**64 - 1), max_size=50), index_bits=st.integers(0, 8), bits=st.integers(0, 10))
def test_a_prefix_index_finds_every_bucket(values: list[int], index_bits: int, bits: int) -> None:
    """The shared index helpers: the prefixes holding a bucket, read from the index, hold exactly
    the bucket's values (and, for a bucket finer than the index, its coarser prefix's)."""
    keys = np.sort(np.array(values, dtype=np.uint64))
    index = entry_objects.prefix_index(keys, index_bits)
    for bucket in range(1 << bits):
        low, high = entry_objects.bucket_prefixes(bucket, bits, index_bits)
        held = keys[int(index[low]):int(index[high])]
        assert np.array_equal(held[bucket_of(held, bits) == bucket], keys[bucket_of(keys, bits) == bucket])
        assert (bucket_of(held, min(bits, index_bits)) == bucket >> max(0, bits - index_bits)).all()


def test_an_unreadable_header_is_an_integrity_error(tmp_path: Path) -> None:
    path = _write(tmp_path, 5)
    raw = path.read_bytes()
    path.write_bytes(raw[:16] + b"x" + raw[17:])
    with pytest.raises(IntegrityError, match="header is malformed"):
        entry_objects.EntryFile.open(path)
