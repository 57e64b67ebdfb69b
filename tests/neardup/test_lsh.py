"""LSH bands: band hashes, the candidate pairs they give, exact and estimated similarity."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from prep.neardup.lsh import band_hashes, candidate_pairs, distinct_pairs, estimated_similarity, jaccard
from tests.neardup.neardupsupport import Array


def _signatures(rows: list[list[int]]) -> Array:
    return np.array(rows, dtype=np.uint32)


@pytest.mark.parametrize("rows", [1, 3, 4])
def test_a_band_hash_depends_on_its_rows_and_its_band_only(rows: int) -> None:
    rng = np.random.default_rng(0)
    sig = rng.integers(0, 2**32, size=(3, 4 * rows), dtype=np.uint32)
    sig[1, :rows] = sig[0, :rows]  # band 0 shared
    sig[2] = sig[0]
    sig[2, -1] ^= 1  # all but the last band shared
    hashes = band_hashes(sig, 4, rows)
    assert hashes.shape == (3, 4) and hashes.dtype == np.uint64
    assert hashes[0, 0] == hashes[1, 0] and (hashes[0, 1:] != hashes[1, 1:]).all()
    assert (hashes[0, :3] == hashes[2, :3]).all() and hashes[0, 3] != hashes[2, 3]
    same = np.zeros((1, 4 * rows), dtype=np.uint32)
    assert len(set(band_hashes(same, 4, rows)[0].tolist())) == 4  # equal rows in other bands: other buckets


def test_band_hashes_refuse_a_wrong_shape() -> None:
    with pytest.raises(ValueError, match="bands x rows"):
        band_hashes(np.zeros((2, 10), dtype=np.uint32), 4, 2)


def test_candidate_pairs_are_stars_to_each_buckets_first_document() -> None:
    sig = _signatures([[1, 1, 5, 5], [2, 2, 5, 5], [1, 1, 6, 6], [3, 3, 7, 7], [2, 2, 8, 8]])
    hashes = band_hashes(sig, 2, 2)
    documents = np.array([10, 11, 12, 13, 14], dtype=np.int64)
    left, right = candidate_pairs(hashes, documents)
    assert list(zip(left.tolist(), right.tolist())) == [(10, 11), (10, 12), (11, 14)]
    reversed_left, reversed_right = candidate_pairs(hashes[::-1], documents[::-1])
    assert np.array_equal(reversed_left, left) and np.array_equal(reversed_right, right)


@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5)), max_size=30), st.sampled_from([0, 2**31, 2**40]))
def test_distinct_pairs_sorts_and_drops_repeats(pairs: list[tuple[int, int]], base: int) -> None:
    left = np.array([base + a for a, _ in pairs], dtype=np.int64)
    right = np.array([base + b for _, b in pairs], dtype=np.int64)
    got_left, got_right = distinct_pairs(left, right)
    assert list(zip(got_left.tolist(), got_right.tolist())) == sorted({(base + a, base + b) for a, b in pairs})
    assert got_left.dtype == got_right.dtype == np.int64


@given(st.sets(st.integers(0, 50)), st.sets(st.integers(0, 50)))
def test_jaccard_is_exact(a: set[int], b: set[int]) -> None:
    first, second = (np.array(sorted(s), dtype=np.uint64) for s in (a, b))
    expected = len(a & b) / len(a | b) if a | b else 1.0
    assert jaccard(first, second) == pytest.approx(expected)


def test_estimated_similarity_counts_equal_minimums() -> None:
    a = np.array([1, 2, 3, 4], dtype=np.uint32)
    assert estimated_similarity(a, np.array([1, 2, 0, 0], dtype=np.uint32)) == 0.5
    assert estimated_similarity(a, a) == 1.0
