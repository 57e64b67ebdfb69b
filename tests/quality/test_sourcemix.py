"""The source mix of a shard: counted window by window from part ordinals (a window read twice
counted once), its summary and the snapshot's aggregate, against plain Python over the same
documents; a summary out of its ranges is refused."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from prep.quality.sourcemix import SHARE_BINS, TOP_SOURCES, SourceMix, SourceTally, shard_sources

# a shard's documents as the file index of each (at least one), over up to 12 files
SHARD = st.lists(st.integers(0, 11), min_size=1, max_size=200)


def plain_mix(files: list[int]) -> SourceMix:
    """The mix counted in plain Python: most documents first, ties the lower file index."""
    ranked = sorted(Counter(files).items(), key=lambda item: (-item[1], item[0]))
    return SourceMix(len(set(files)), tuple(ranked[:TOP_SOURCES]))


@given(SHARD, st.integers(1, 50), st.integers(1, 3))
def test_the_tally_of_a_shards_windows_is_the_plain_count(files: list[int], window: int, parts_a_file: int) -> None:
    """Parts map to files (`parts_a_file` consecutive parts each); windows are read in any
    number of passes (as a bin unit's metadata file or an mds unit reads them twice)."""
    source_of = np.repeat(np.arange(12), parts_a_file)
    parts = np.asarray(files) * parts_a_file + np.arange(len(files)) % parts_a_file
    tally = SourceTally(source_of, 12)
    for _ in range(2):
        for low in range(0, len(files), window):
            tally.count((3, low), parts[low:low + window].astype(np.uint32))
    assert tally.mix(len(files), "s") == plain_mix(files)
    assert SourceMix.from_json(plain_mix(files).to_json()) == plain_mix(files)


def test_a_tally_short_of_its_shards_documents_is_refused() -> None:
    tally = SourceTally(np.arange(3), 3)
    tally.count((0, 0), np.array([0, 1, 1]))
    with pytest.raises(ValueError, match="shard 00ff: counted 3 documents by source, its plan has 4"):
        tally.mix(4, "00ff")


@pytest.mark.parametrize("data", [
    {"distinct": 2, "top": []}, {"distinct": 1, "top": [[0, 3], [1, 2]]}, {"distinct": 5, "top": [[0, 0]]},
    {"distinct": 5, "top": [[-1, 2]]}, {"distinct": 5, "top": [[0, 4], [1, 3], [2, 2], [3, 1]]}, {"top": [[0, 1]]}])
def test_a_mix_out_of_its_ranges_is_refused(data: dict[str, object]) -> None:
    with pytest.raises((ValueError, KeyError)):
        SourceMix.from_json(data)


@given(st.lists(SHARD, min_size=1, max_size=30))
def test_the_aggregate_counts_each_shard_once_in_its_bins(shards: list[list[int]]) -> None:
    written = [0] * 12
    for files in shards:
        for file in files:
            written[file] += 1
    stats = shard_sources([(len(files), plain_mix(files)) for files in shards], written)
    distinct = Counter(len(set(files)).bit_length() for files in shards)
    assert [b["shards"] for b in stats["distinct"]] == [distinct[k] for k in range(1, max(distinct) + 1)]
    assert all(b["max"] == 2 * b["min"] - 1 for b in stats["distinct"])
    shares = Counter(min(SHARE_BINS - 1, 10 * Counter(files).most_common(1)[0][1] // len(files)) for files in shards)
    assert [b["shards"] for b in stats["largest_share"]] == [shares[k] for k in range(SHARE_BINS)]
    assert stats["largest_share"][-1] == {"min_percent": 90, "max_percent": 100, "shards": shares[9]}
    largest = max(range(12), key=lambda file: (written[file], -file))
    assert stats["largest_file"] == {"file": largest, "documents": written[largest]}
    assert stats["shards"] == len(shards) and stats["files_written"] == sum(1 for count in written if count)
