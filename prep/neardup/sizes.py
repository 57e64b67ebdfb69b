"""The size distribution of near-duplicate clusters (issue 42), as the cluster task records it.

A cluster's size is its documents: the first, kept, and every document dropped for it (the drops
naming it as their representative), so the smallest cluster has 2. Sizes are counted in log2
bins: bin k (from 1) holds the sizes 2**(k-1) + 1 to 2**k, that is 2, 3-4, 5-8, 9-16, ...; the
bins run from 1 to the bin of the largest cluster, empty ones included, so two distributions
line up bin by bin.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    Array = np.ndarray[Any, Any]


@dataclass(frozen=True)
class SizeBin:
    """The clusters whose size is in `smallest` .. `largest` (log2 bin k: 2**(k-1) + 1 .. 2**k)."""

    smallest: int
    largest: int
    clusters: int

    @property
    def label(self) -> str:
        return size_label(self.smallest, self.largest)

    def to_json(self) -> dict[str, int]:
        return {"min": self.smallest, "max": self.largest, "clusters": self.clusters}


@dataclass(frozen=True)
class ClusterSizes:
    """How many clusters fall in each log2 size bin (bin 1 first, to the largest's bin) and the
    largest size (0 when there is no cluster, and then no bin)."""

    counts: tuple[int, ...]
    largest: int

    @property
    def clusters(self) -> int:
        return sum(self.counts)

    @property
    def bins(self) -> tuple[SizeBin, ...]:
        return tuple(SizeBin(2 ** (k - 1) + 1, 2 ** k, count) for k, count in enumerate(self.counts, start=1))

    def to_json(self) -> dict[str, object]:
        """`largest` and `sizes`, the bins as `{min, max, clusters}`: what summaries and manifests record."""
        return {"largest": self.largest, "sizes": [item.to_json() for item in self.bins]}

    @property
    def coherent(self) -> bool:
        """Whether the largest size is in the last bin and that bin holds a cluster (no bins: largest 0)."""
        if not self.counts:
            return self.largest == 0
        last = self.bins[-1]
        return last.clusters > 0 and last.smallest <= self.largest <= last.largest

    @classmethod
    def from_json(cls, record: Mapping[str, Any]) -> ClusterSizes:
        """The distribution `to_json` recorded; ValueError when its bins are not the log2 bins in
        order or its largest size is not in the last, nonempty one."""
        sizes: Sequence[Mapping[str, Any]] = record["sizes"]
        found = cls(tuple(int(item["clusters"]) for item in sizes), int(record["largest"]))
        if [item.to_json() for item in found.bins] != [dict(item) for item in sizes] or not found.coherent:
            raise ValueError("cluster sizes are not the log2 bins 2, 3-4, 5-8, ... up to the largest's")
        return found


def size_label(smallest: int, largest: int) -> str:
    """`2`, `3-4`, `5-8`: the sizes a bin holds, as show and diff name it."""
    return str(largest) if smallest == largest else f"{smallest}-{largest}"


def size_bin(sizes: Array) -> Array:
    """Each cluster size's log2 bin (sizes >= 2): the bit length of size - 1, which float64's
    exponent gives exactly for sizes below 2**53."""
    import numpy as np  # the cluster task's; the driver, which reads recorded sizes, loads no numpy

    return np.frexp(np.asarray(sizes, dtype=np.float64) - 1)[1].astype(np.int64)


def cluster_sizes(representatives: Array) -> ClusterSizes:
    """The distribution of the clusters drop records name: each representative once per document
    dropped for it (its cluster's size is that count + 1). O(len(representatives)) memory."""
    import numpy as np

    _, dropped = np.unique(np.asarray(representatives, dtype=np.uint64), return_counts=True)
    return sizes_of(dropped + 1)


def sizes_of(sizes: Array) -> ClusterSizes:
    """The distribution of clusters of these sizes (each at least 2)."""
    import numpy as np

    sizes = np.asarray(sizes, dtype=np.int64)
    if not len(sizes):
        return ClusterSizes((), 0)
    counts = np.bincount(size_bin(sizes))[1:]
    return ClusterSizes(tuple(int(count) for count in counts.tolist()), int(sizes.max()))


def total_sizes(parts: Sequence[ClusterSizes]) -> ClusterSizes:
    """The distribution of the clusters of all `parts` (each cluster counted in one of them)."""
    width = max((len(part.counts) for part in parts), default=0)
    counts = [sum(part.counts[k] for part in parts if k < len(part.counts)) for k in range(width)]
    return ClusterSizes(tuple(counts), max((part.largest for part in parts), default=0))
