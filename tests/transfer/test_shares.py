"""Rank shares: complete, disjoint, deterministic, byte-balanced, bin+idx together."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prep.errors import UsageError
from prep.formats.units import artifact_path, unit_formats, unit_names
from prep.transfer.shares import Artifact, group_units, partition, share_of


@st.composite
def artifact_lists(draw: st.DrawFn) -> list[Artifact]:
    """Shards with random sizes; each shard has a non-empty subset of the units (bin+idx, wds)."""
    shards = draw(st.integers(min_value=0, max_value=40))
    artifacts = []
    for shard in range(shards):
        for unit in draw(st.lists(st.sampled_from(unit_names()), min_size=1, unique=True)):
            for fmt in unit_formats(unit):
                size = draw(st.integers(min_value=0, max_value=10**9))
                artifacts.append(Artifact(artifact_path(fmt, shard), fmt, shard, size, f"{shard:064x}"))
    return artifacts


@settings(max_examples=150, deadline=None)
@given(artifacts=artifact_lists(), world_size=st.integers(min_value=1, max_value=8))
def test_shares_cover_every_artifact_once_and_are_balanced(artifacts: list[Artifact], world_size: int) -> None:
    shares = partition(artifacts, world_size)
    assert [share.rank for share in shares] == list(range(world_size))
    assigned = [a.path for share in shares for a in share.artifacts]
    assert sorted(assigned) == sorted(a.path for a in artifacts)  # every artifact exactly once
    units = group_units(artifacts)
    largest = max((unit.size for unit in units), default=0)
    ideal = sum(a.size for a in artifacts) / world_size
    assert max(share.size for share in shares) <= ideal + largest
    rank_of = {a.path: share.rank for share in shares for a in share.artifacts}
    for unit in units:
        assert len({rank_of[a.path] for a in unit.artifacts}) == 1  # a .bin travels with its .idx


@settings(max_examples=60, deadline=None)
@given(artifacts=artifact_lists(), world_size=st.integers(min_value=1, max_value=8), seed=st.integers())
def test_partition_is_identical_whatever_the_listing_order(
    artifacts: list[Artifact], world_size: int, seed: int
) -> None:
    shuffled = list(artifacts)
    random.Random(seed).shuffle(shuffled)
    assert partition(shuffled, world_size) == partition(artifacts, world_size)


def test_ties_go_to_the_lowest_rank_largest_shard_first() -> None:
    artifacts = [
        Artifact("bin/00000.bin", "bin", 0, 100, "0" * 64),
        Artifact("bin/00000.idx", "idx", 0, 10, "1" * 64),
        Artifact("wds/00000.tar", "wds", 0, 60, "2" * 64),
        Artifact("bin/00001.bin", "bin", 1, 50, "3" * 64),
        Artifact("bin/00001.idx", "idx", 1, 10, "4" * 64),
        Artifact("bin/00002.bin", "bin", 2, 50, "5" * 64),
        Artifact("bin/00002.idx", "idx", 2, 10, "6" * 64),
    ]
    shares = partition(artifacts, 2)
    assert [a.path for a in shares[0].artifacts] == ["bin/00000.bin", "bin/00000.idx", "wds/00000.tar"]
    # shards 1 and 2 tie at 60 bytes: shard 1 is placed first, both land on the lighter rank 1
    assert [a.path for a in shares[1].artifacts] == ["bin/00001.bin", "bin/00001.idx", "bin/00002.bin", "bin/00002.idx"]


def test_without_rank_the_share_is_everything() -> None:
    artifacts = [Artifact("wds/00000.tar", "wds", 0, 5, "0" * 64)]
    share = share_of(artifacts, None, None)
    assert (share.rank, share.world_size, share.artifacts) == (0, 1, tuple(artifacts))


@pytest.mark.parametrize(("rank", "world_size"), [(0, None), (None, 2), (2, 2), (-1, 2), (0, 0)])
def test_bad_rank_arguments_are_usage_errors(rank: int | None, world_size: int | None) -> None:
    with pytest.raises(UsageError):
        share_of([], rank, world_size)


def test_every_file_of_a_shard_is_one_group_even_formats_this_version_does_not_know() -> None:
    artifacts = [Artifact(artifact_path(fmt, 3), fmt, 3, 1, "0" * 64) for unit in unit_names() for fmt in unit_formats(unit)]
    artifacts.append(Artifact("extra/00003.x", "future", 3, 1, "1" * 64))
    artifacts.append(Artifact("wds/00004.tar", "wds", 4, 1, "2" * 64))
    groups = sorted((group.shard, tuple(a.format for a in group.artifacts)) for group in group_units(artifacts))
    assert groups == [(3, ("bin", "idx", "bin_metadata", "future", "mds", "wds")), (4, ("wds",))]  # sorted by path
