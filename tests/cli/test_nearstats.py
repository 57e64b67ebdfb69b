"""The near-dup lines of `prep show` and the size table of `prep diff` (prep/cli/nearstats.py) on
edge cases the built corpora do not reach: no cluster at all, bins only one side has, wide counts."""

from __future__ import annotations

from typing import Any

from prep.cli.nearstats import diff_size_lines, near_lines, size_table
from prep.history.diff import diff_stats


def near_stats(sizes: list[int], largest: int, dropped: int, near_dropped: int) -> dict[str, Any]:
    """Snapshot stats with near_clusters of these bin counts (bin 1 first)."""
    bins = [{"min": 2 ** (k - 1) + 1, "max": 2**k, "clusters": count} for k, count in enumerate(sizes, start=1)]
    return {"documents_read": 10, "near_duplicates_dropped": near_dropped,
            "near_clusters": {"pairs": 3, "clusters": sum(sizes), "dropped": dropped, "largest": largest, "sizes": bins}}


def test_a_build_with_no_cluster_shows_its_line_without_a_table() -> None:
    assert near_lines(near_stats([], 0, 0, 0)) == [
        "near-dup   0 clusters of 0 documents, largest 0: 0 duplicates (0 removed by exact dedup first); 3 candidate pairs"]
    assert near_lines({"documents_read": 10}) == []


def test_the_table_aligns_wide_counts_and_labels() -> None:
    assert size_table([("clusters", {2: 123456, 8: 1, 1024: 7})]) == [
        "  size            2  5-8  513-1024",
        "  clusters   123456    1         7",
    ]


def test_diff_table_fills_bins_one_side_lacks_with_zero_and_a_side_without_near_with_dashes() -> None:
    old, new = near_stats([2], 2, 2, 2), near_stats([1, 0, 1], 6, 6, 6)
    assert diff_size_lines(diff_stats(old, new)) == [
        "near-dup   cluster sizes",
        "  size       2  3-4  5-8",
        "  old        2    0    0",
        "  new        1    0    1",
    ]
    assert diff_size_lines(diff_stats({"documents_read": 10}, new))[2:] == ["  old        -    -    -",
                                                                           "  new        1    0    1"]


def test_diff_table_is_left_out_when_nothing_moved_or_no_side_has_a_cluster() -> None:
    same = near_stats([2, 1], 3, 4, 4)
    assert diff_size_lines(diff_stats(same, same)) == []
    assert diff_size_lines(diff_stats({"documents_read": 1}, near_stats([], 0, 0, 0))) == []
    assert diff_size_lines(diff_stats({"documents_read": 1}, {"documents_read": 2})) == []
