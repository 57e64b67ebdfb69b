"""The mix of input sources in each shard: a shard task counts its documents per input file as it
reads them (one np.bincount a window) and records a compact summary (how many files it holds and
its TOP_SOURCES largest); the snapshot's stats get only an aggregate of those summaries, a few
dozen numbers however many shards and files (`stats.shard_sources`, docs/manifests.md).

Shards are key ranges over a keyed permutation of text hashes, so every shard draws every input
file in about its share of the corpus: a shard's largest source holds about the largest file's
share of the documents, and a shard holds every file unless it has too few documents to."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

TOP_SOURCES = 3
"""Input files a shard's summary names, largest first."""
SHARE_BINS = 10
"""The largest source's share of a shard is counted in this many bins of equal width (deciles)."""


@dataclass(frozen=True)
class SourceMix:
    """One shard's sources: how many input files its documents come from, and the largest ones as
    (file index in `stats.files`, documents), most documents first (ties: the lower index)."""

    distinct: int
    top: tuple[tuple[int, int], ...]

    @classmethod
    def of_counts(cls, counts: np.ndarray) -> SourceMix:
        """The mix of per-file document counts (`counts[i]`: documents of input file i)."""
        import numpy as np

        counts = np.asarray(counts, dtype=np.int64)
        largest = np.argsort(-counts, kind="stable")[:TOP_SOURCES]
        return cls(int(np.count_nonzero(counts)),
                   tuple((int(index), int(counts[index])) for index in largest.tolist() if counts[index] > 0))

    def to_json(self) -> dict[str, Any]:
        return {"distinct": self.distinct, "top": [list(pair) for pair in self.top]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SourceMix:
        """The mix `to_json` gave; ValueError (or KeyError, TypeError) for one that is not."""
        distinct = int(data["distinct"])
        top = tuple((int(index), int(documents)) for index, documents in data["top"])
        if not 0 < len(top) <= min(distinct, TOP_SOURCES) or any(index < 0 or documents < 1 for index, documents in top):
            raise ValueError("a source mix out of its ranges")
        return cls(distinct, top)


class SourceTally:
    """Documents per input file of one shard, counted window by window as a writer reads them; a
    window read again (a writer's second pass) replaces its count instead of adding it twice."""

    def __init__(self, source_of: np.ndarray, sources: int) -> None:
        self.source_of, self.sources = source_of, sources
        self.windows: dict[tuple[int, int], np.ndarray] = {}

    def count(self, where: tuple[int, int], parts: np.ndarray) -> None:
        """Count the documents of the window at `where` (bucket, first entry) by their parts."""
        import numpy as np

        self.windows[where] = np.bincount(self.source_of[parts], minlength=self.sources)

    def mix(self, documents: int, shard: str) -> SourceMix:
        """The shard's mix; ValueError when the windows counted hold other than its `documents`."""
        import numpy as np

        total = sum(self.windows.values(), np.zeros(self.sources, dtype=np.int64))
        if int(total.sum()) != documents:
            raise ValueError(f"shard {shard}: counted {int(total.sum())} documents by source, its plan has {documents}")
        return SourceMix.of_counts(total)


def shard_sources(mixes: Sequence[tuple[int, SourceMix]], files_written: Sequence[int]) -> dict[str, Any]:
    """`stats.shard_sources`: over the shards ((documents, mix) each), how many hold 1, 2-3, 4-7, ...
    input files, how many have their largest source's share in each decile, and for comparison the
    input files documents were written from and the largest one (its index and documents)."""
    distinct: list[int] = []
    shares = [0] * SHARE_BINS
    for documents, mix in mixes:
        octave = mix.distinct.bit_length()
        distinct.extend([0] * (octave + 1 - len(distinct)))
        distinct[octave] += 1
        shares[min(SHARE_BINS - 1, mix.top[0][1] * SHARE_BINS // documents)] += 1
    largest = max(range(len(files_written)), key=lambda index: (files_written[index], -index), default=0)
    step = 100 // SHARE_BINS
    return {
        "shards": len(mixes),
        "files_written": sum(1 for documents in files_written if documents),
        "largest_file": {"file": largest, "documents": int(files_written[largest]) if files_written else 0},
        "distinct": [{"min": 1 << (k - 1), "max": (1 << k) - 1, "shards": count}
                     for k, count in enumerate(distinct) if k],
        "largest_share": [{"min_percent": step * k, "max_percent": step * (k + 1), "shards": count}
                          for k, count in enumerate(shares)],
    }
