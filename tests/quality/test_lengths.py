"""The token-length distribution: measured from arrays, summed over buckets, its octaves and its
lower median, against plain Python over the same lengths."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from prep.quality.lengths import EXACT_BELOW, TokenLengths, measure

LENGTHS = st.lists(st.one_of(st.integers(0, 40), st.integers(0, 5000), st.integers(0, 2**40)), max_size=300)


def lower_median(lengths: list[int]) -> int:
    return sorted(lengths)[(len(lengths) + 1) // 2 - 1]


@given(LENGTHS)
def test_the_histogram_counts_each_length_in_its_octave(lengths: list[int]) -> None:
    histogram = measure(np.array(lengths, dtype=np.uint64)).histogram()
    expected = [0] * (max((n.bit_length() for n in lengths), default=-1) + 1)
    for n in lengths:
        expected[n.bit_length()] += 1
    assert [count for _, _, count in histogram] == expected
    assert all(low <= high and (low == 0 or high == 2 * low - 1) for low, high, _ in histogram)


@given(LENGTHS, LENGTHS)
def test_sums_of_parts_are_the_whole_and_the_median_is_exact_below_the_bound(first: list[int], second: list[int]) -> None:
    whole = measure(np.array(first, dtype=np.uint64)) + measure(np.array(second, dtype=np.uint64))
    assert whole == measure(np.array(first + second, dtype=np.uint64))
    assert whole.documents == len(first + second)
    assert TokenLengths.from_json(whole.to_json()) == whole
    if not first + second:
        assert whole.median() == (0, 0)
        return
    median = lower_median(first + second)
    low, high = whole.median()
    if median < EXACT_BELOW:
        assert low == high == median
    else:
        assert low <= median <= high and low.bit_length() == median.bit_length() == high.bit_length()
    assert whole.below(16) == sum(n < 16 for n in first + second)


def test_bit_lengths_are_exact_where_floats_round_up() -> None:
    """2**53 + 1 and 2**64 - 1 round to a power of two as float64: their octave must not."""
    values = [2**53 - 1, 2**53, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1, 1024, 2047, 2048]
    lengths = measure(np.array(values, dtype=np.uint64))
    expected = [0] * 65
    for n in values:
        expected[n.bit_length()] += 1
    assert list(lengths.octaves) == expected


@pytest.mark.parametrize("data", [{"exact": [1] * (EXACT_BELOW + 1), "octaves": []},
                                  {"exact": [], "octaves": [0, 1]}, {"exact": [-1], "octaves": []},
                                  {"exact": []}])
def test_a_recorded_distribution_out_of_its_ranges_is_refused(data: dict[str, list[int]]) -> None:
    with pytest.raises((ValueError, KeyError)):
        TokenLengths.from_json(data)
