"""Pairs objects round-trip in deterministic bytes and refuse damage; drops objects round-trip and
give each order bucket exactly its drops."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prep.errors import IntegrityError
from prep.neardup.lsh import distinct_pairs
from prep.workfiles.drops import drop_records, open_drops, write_drops
from prep.workfiles.keys import bucket_of
from prep.workfiles.pairs import CandidatePairs, check_pairs, read_pairs, write_pairs

Array = np.ndarray[Any, Any]
NUMBERS = st.integers(0, 3).flatmap(lambda part: st.integers(0, 40).map(lambda row: part << 32 | row))
PAIRS = st.lists(st.tuples(NUMBERS, NUMBERS).filter(lambda pair: pair[0] != pair[1]), max_size=30)


def _pairs(raw: list[tuple[int, int]]) -> CandidatePairs:
    """The pairs, each smaller number first, sorted, once; their documents keyed by a function of the number."""
    left = np.array([min(pair) for pair in raw], dtype=np.int64)
    right = np.array([max(pair) for pair in raw], dtype=np.int64)
    left, right = distinct_pairs(left, right)
    named = np.unique(np.concatenate([left, right])).astype(np.uint64)
    return CandidatePairs(left.astype(np.uint64), right.astype(np.uint64), named, named * np.uint64(0x9E3779B97F4A7C15))


@settings(max_examples=40, deadline=None)
@given(PAIRS)
def test_pairs_round_trip_in_deterministic_bytes(raw: list[tuple[int, int]]) -> None:
    pairs = _pairs(raw)
    with tempfile.TemporaryDirectory() as directory:
        paths = [Path(directory) / name for name in ("a.pairs", "b.pairs")]
        digests = [write_pairs(path, pairs, {"bucket": 3, "bits": 4}) for path in paths]
        back = read_pairs(paths[0])
        same = paths[0].read_bytes() == paths[1].read_bytes()
    assert same and digests[0] == digests[1]
    for name in ("left", "right", "documents", "key_hi"):
        assert np.array_equal(getattr(back, name), getattr(pairs, name))


def _written(tmp_path: Path) -> Path:
    path = tmp_path / "bucket.pairs"
    write_pairs(path, _pairs([(1, 5), (1, 9), (2 << 32 | 4, 5), (7, 9)]), {})
    return path


def test_a_truncated_or_extended_pairs_object_is_an_integrity_error(tmp_path: Path) -> None:
    path = _written(tmp_path)
    os.truncate(path, path.stat().st_size - 3)
    with pytest.raises(IntegrityError, match="its size is not"):
        read_pairs(path)
    path.write_bytes(path.read_bytes() + b"\0" * 19)
    with pytest.raises(IntegrityError, match="its size is not"):
        read_pairs(path)


def test_a_damaged_pairs_object_is_an_integrity_error(tmp_path: Path) -> None:
    path = _written(tmp_path)
    raw = path.read_bytes()
    start = len(raw) - 16 * 4 - 16 * 5  # four pairs, five documents
    documents = start + 16 * 4
    for offset, why in ((start, "not the smaller"), (start + 8, "pairs are out of order"),
                        (documents + 16 * 4, "does not list"), (documents, "documents are out of order")):
        damaged = bytearray(raw)
        damaged[offset:offset + 8] = (2**63).to_bytes(8, "little")
        path.write_bytes(bytes(damaged))
        with pytest.raises(IntegrityError, match=why):
            read_pairs(path)
    path.write_bytes(b"PREPBND1" + raw[8:])
    with pytest.raises(IntegrityError, match="not a prep pairs object"):
        read_pairs(path)


def test_check_pairs_names_a_repeat() -> None:
    one = np.array([1, 1], dtype=np.uint64)
    with pytest.raises(IntegrityError, match="out of order or repeated"):
        check_pairs(CandidatePairs(one, one + np.uint64(1), np.array([1, 2], dtype=np.uint64), one), "here")


@settings(max_examples=30, deadline=None)
@given(documents=st.lists(NUMBERS, unique=True, max_size=60), bits=st.integers(0, 6), seed=st.integers(0, 9))
def test_drops_round_trip_and_each_bucket_reads_its_own(documents: list[int], bits: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    numbers = np.array(documents, dtype=np.int64)
    keys = rng.integers(0, 2**64, len(numbers), dtype=np.uint64)
    keys[::3] = keys[0] if len(keys) else 0  # equal keys: ordered by number
    records = drop_records(numbers, numbers // 2, keys)
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "corpus.drops"
        write_drops(path, records, {})
        again = drop_records(numbers[::-1], numbers[::-1] // 2, keys[::-1])
        write_drops(Path(directory) / "again.drops", again, {})
        same = path.read_bytes() == (Path(directory) / "again.drops").read_bytes()
        opened = open_drops(path)
        everything = opened.read_all()
        buckets = [opened.read_bucket(bucket, bits) for bucket in range(1 << bits)]
    assert same
    assert sorted(everything["document"].tolist()) == sorted(documents)
    assert np.array_equal(np.lexsort((everything["document"], everything["key_hi"])), np.arange(len(everything)))
    for bucket, found in enumerate(buckets):
        assert np.array_equal(found, everything[bucket_of(everything["key_hi"], bits) == bucket])


def test_a_truncated_drops_object_is_an_integrity_error(tmp_path: Path) -> None:
    path = tmp_path / "corpus.drops"
    numbers = np.arange(10, dtype=np.int64)
    write_drops(path, drop_records(numbers, numbers * 0, numbers.astype(np.uint64) << np.uint64(60)), {})
    os.truncate(path, path.stat().st_size - 24)
    with pytest.raises(IntegrityError, match="not the drops object its header says"):
        open_drops(path)
