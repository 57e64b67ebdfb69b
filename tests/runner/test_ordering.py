"""How the shard stage groups its units into jobs (which unit lands in which job changes no byte)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from prep.formats import wds
from prep.formats.units import BIN, WDS
from prep.formats.wds_spec import TAR_BYTES_PER_DOCUMENT
from prep.runner.sharding import SHARD_JOBS_PER_WORKER, Unit, unit_groups, unit_weight
from prep.workfiles.shardplan import ShardPlan


def _plan(index: int, documents: int, bin_size: int) -> ShardPlan:
    return ShardPlan(index, index << 40, 8, ((0, 0, documents),), documents, bin_size // 4, bin_size, 3 * bin_size,
                     f"{index:064x}")


@settings(max_examples=200, deadline=None)
@given(shards=st.lists(st.tuples(st.integers(1, 10**6), st.integers(4, 10**9)), max_size=40),
       formats=st.sampled_from([(BIN,), (BIN, WDS), (WDS,)]), workers=st.integers(1, 9))
def test_groups_cover_every_unit_once_in_runs_heaviest_first(shards: list[tuple[int, int]], formats: tuple[str, ...],
                                                             workers: int) -> None:
    units = [Unit(_plan(index, documents, size), unit, f"{index}/{unit}") for index, (documents, size) in enumerate(shards)
             for unit in formats]
    groups = unit_groups(units, workers)
    assert len(groups) == min(len(units), workers * SHARD_JOBS_PER_WORKER)
    assert sorted((u for group in groups for u in group), key=units.index) == units
    for group in groups:  # each job is a run of consecutive units
        first = units.index(group[0])
        assert list(group) == units[first:first + len(group)]
    weights = [sum(unit_weight(u.plan, u.unit) for u in group) for group in groups]
    assert weights == sorted(weights, reverse=True)


def test_a_few_heavy_units_each_get_a_job_of_their_own() -> None:
    """Regression: with one job per worker, 10 shards of 16M documents went 6 and 4 to two jobs,
    and one worker idled for a third of the stage; now they spread over eight jobs of one or two."""
    units = [Unit(_plan(index, 1_000, 250 << 20), BIN, str(index)) for index in range(10)]
    groups = unit_groups(units, 2)
    assert len(groups) == 8 and sorted(len(group) for group in groups) == [1] * 6 + [2] * 2


def test_a_tar_weighs_its_headers() -> None:
    """Short documents make a tar far heavier than its .bin: three header blocks each."""
    assert TAR_BYTES_PER_DOCUMENT == 3 * wds.BLOCK_SIZE + 3 * wds.BLOCK_SIZE // 2  # spelled out for the driver
    plan = _plan(0, 1_000_000, 150_000_000)
    assert unit_weight(plan, WDS) > unit_weight(plan, BIN) + 1_000_000 * 1536
