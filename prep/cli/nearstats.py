"""How `prep show` and `prep diff` print what near-duplicate removal counted (a snapshot's
`stats.near_clusters`, manifests/snapshot-1.schema.json): clusters, documents dropped, candidate
pairs, and the cluster sizes as a small table of log2 bins."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from prep.history.diff import NEAR_CLUSTERS, NEAR_SIZES, StatDelta
from prep.neardup.sizes import size_label
from prep.progress import plural

SizeCounts = Mapping[int, int]
"""Clusters by size bin, the bin named by its largest size (2, 4, 8, ...)."""


def near_lines(stats: Mapping[str, Any]) -> list[str]:
    """`prep show`'s near-dup line and size table, for a build with [dedup.near]; none otherwise."""
    near = stats.get(NEAR_CLUSTERS)
    if near is None:
        return []
    sizes = {int(item["max"]): int(item["clusters"]) for item in near["sizes"]}
    line = f"near-dup   {near_summary(stats)}"
    return [line, *size_table([("clusters", sizes)])] if sizes else [line]


def near_summary(stats: Mapping[str, Any]) -> str:
    """What near-duplicate removal counted, in one line (a build with [dedup.near] only)."""
    near = stats[NEAR_CLUSTERS]
    clusters, dropped = int(near["clusters"]), int(near["dropped"])
    exact = dropped - int(stats.get("near_duplicates_dropped", dropped))
    rejected = f", {near['pairs_rejected']} rejected by verify" if "pairs_rejected" in near else ""
    return (f"{plural(clusters, 'cluster')} of {clusters + dropped} documents, largest {near['largest']}: "
            f"{dropped} duplicates ({exact} removed by exact dedup first); "
            f"{plural(int(near['pairs']), 'candidate pair')}{rejected}")


def cluster_size_rows(stats: Mapping[str, Any]) -> list[tuple[str, int]]:
    """(size bin, clusters) of a build with [dedup.near], for `prep show --stats`' bars; none otherwise."""
    near = stats.get(NEAR_CLUSTERS)
    return [] if near is None else [(size_label(int(item["min"]), int(item["max"])), int(item["clusters"]))
                                    for item in near["sizes"]]


def size_table(rows: Sequence[tuple[str, SizeCounts | None]]) -> list[str]:
    """The size bins of every row as columns under a `size` header, each row's clusters in them
    (0 where a row has no cluster of that size, `-` in every column of a row that is None)."""
    bins = sorted({largest for _, counts in rows if counts is not None for largest in counts})
    header = [size_label(largest // 2 + 1, largest) for largest in bins]
    cells = [[("-" if counts is None else str(counts.get(largest, 0))) for largest in bins] for _, counts in rows]
    widths = [max(len(label), *(len(row[at]) for row in cells)) for at, label in enumerate(header)]
    table = [("size", header), *((name, row) for (name, _), row in zip(rows, cells))]
    return [f"  {name:<9}" + "".join(f"{cell:>{width + 2}}" for cell, width in zip(row, widths)) for name, row in table]


def diff_size_lines(stats: Sequence[StatDelta]) -> list[str]:
    """`prep diff`'s cluster size table, old and new side by side, when the sizes moved (or one
    side has no near-duplicate removal); none otherwise."""
    sizes = [delta for delta in stats if delta.key.startswith(NEAR_SIZES)]
    present = [delta for delta in stats if delta.key == f"{NEAR_CLUSTERS}.clusters"]
    if not present or not sizes or not any(delta.delta or None in (delta.old, delta.new) for delta in sizes + present):
        return []  # no near-dup, no cluster on either side, or the same sizes
    sides: list[tuple[str, SizeCounts | None]] = []
    for name, had in (("old", present[0].old is not None), ("new", present[0].new is not None)):
        values = ((_bin_of(delta.key), delta.old if name == "old" else delta.new) for delta in sizes)
        sides.append((name, {largest: value for largest, value in values if value is not None} if had else None))
    return ["near-dup   cluster sizes", *size_table(sides)]


def _bin_of(key: str) -> int:
    """The largest size of the bin a `near_clusters.sizes[min-max]` key names (`[3-4]`: 4)."""
    return int(key.removeprefix(NEAR_SIZES).removesuffix("]").rsplit("-", 1)[-1])
