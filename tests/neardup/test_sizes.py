"""The cluster size distribution (prep.neardup.sizes): equal to a plain-Python count of the same
drops, its bins exact at every power of two, and its JSON read back only when it is coherent."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from prep.neardup.sizes import ClusterSizes, cluster_sizes, size_bin, size_label
from tests.neardup.nearstatsupport import plain_distribution, sizes_of_drops


@given(st.lists(st.integers(min_value=0, max_value=2**64 - 1) | st.sampled_from([5, 9, 2**63]), max_size=400))
def test_the_distribution_is_the_plain_count_of_the_drops(representatives: list[int]) -> None:
    found = cluster_sizes(np.array(representatives, dtype=np.uint64))
    assert found.to_json() == plain_distribution(sizes_of_drops(representatives))
    assert found.clusters == len(set(representatives))


@pytest.mark.parametrize("size", [2, 3, 4, 5, 8, 9, 16, 17, 2**20, 2**20 + 1, 2**40, 2**40 + 1, 2**52, 2**52 + 1])
def test_a_size_falls_in_the_bin_that_holds_it(size: int) -> None:
    k = int(size_bin(np.array([size]))[0])
    assert k == (size - 1).bit_length() and 2 ** (k - 1) + 1 <= size <= 2**k


def test_bins_are_labelled_by_the_sizes_they_hold() -> None:
    sizes = ClusterSizes((1, 0, 2, 1), 9)
    assert [item.label for item in sizes.bins] == ["2", "3-4", "5-8", "9-16"]
    assert size_label(2, 2) == "2" and size_label(17, 32) == "17-32"
    assert sizes.to_json() == {"largest": 9, "sizes": [{"min": 2, "max": 2, "clusters": 1},
                                                       {"min": 3, "max": 4, "clusters": 0},
                                                       {"min": 5, "max": 8, "clusters": 2},
                                                       {"min": 9, "max": 16, "clusters": 1}]}
    assert cluster_sizes(np.zeros(0, dtype=np.uint64)).to_json() == {"largest": 0, "sizes": []}


@given(st.lists(st.integers(min_value=0, max_value=40), max_size=200))
def test_json_reads_back(representatives: list[int]) -> None:
    sizes = cluster_sizes(np.array(representatives, dtype=np.uint64))
    assert ClusterSizes.from_json(sizes.to_json()) == sizes


@pytest.mark.parametrize("record", [
    {"largest": 3, "sizes": [{"min": 3, "max": 4, "clusters": 1}]},  # bin 1 missing
    {"largest": 3, "sizes": [{"min": 2, "max": 2, "clusters": 0}, {"min": 3, "max": 5, "clusters": 1}]},
    {"largest": 5, "sizes": [{"min": 2, "max": 2, "clusters": 0}, {"min": 3, "max": 4, "clusters": 1}]},
    {"largest": 2, "sizes": [{"min": 2, "max": 2, "clusters": 1}, {"min": 3, "max": 4, "clusters": 0}]},
    {"largest": 2, "sizes": []},
    {"largest": 0, "sizes": [{"min": 2, "max": 2, "clusters": 1}]},
    {"largest": 2, "sizes": [{"min": 2, "max": 2, "clusters": 1, "extra": 1}]},
])
def test_json_that_is_no_distribution_is_refused(record: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="log2 bins"):
        ClusterSizes.from_json(record)
