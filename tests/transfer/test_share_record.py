"""Shares by formats and whole shards, the share record pull writes, and verify following it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prep.errors import UsageError
from prep.formats.units import artifact_path, unit_formats
from prep.manifest.schema import validate
from prep.storage.local import LocalStore
from prep.transfer.held import ShareSpec, read_share_record, share_path
from prep.transfer.pull import pull
from prep.transfer.shares import Artifact, parse_formats, partition, select_formats, share_of
from prep.transfer.verify import verify
from tests.snapshot_factory import build_snapshot


@st.composite
def shard_sets(draw: st.DrawFn) -> list[Artifact]:
    """1, 2 or 7 shards, each with bin+idx and wds of random sizes."""
    artifacts = []
    for shard in range(draw(st.sampled_from([1, 2, 7]))):
        for unit in ("bin", "wds"):
            for fmt in unit_formats(unit):
                size = draw(st.integers(min_value=0, max_value=10**6))
                artifacts.append(Artifact(artifact_path(fmt, shard), fmt, shard, size, f"{shard:064x}"))
    return artifacts


@settings(max_examples=200, deadline=None)
@given(artifacts=shard_sets(), world_size=st.integers(min_value=1, max_value=5),
       formats=st.sampled_from([None, ("bin",), ("wds",), ("bin", "wds")]))
def test_shares_are_whole_shards_of_the_selected_formats_balanced_by_bytes(
    artifacts: list[Artifact], world_size: int, formats: tuple[str, ...] | None
) -> None:
    selected = select_formats(artifacts, formats, "test")
    shares = [share_of(artifacts, rank, world_size, formats) for rank in range(world_size)]
    held = [a for share in shares for a in share.artifacts]
    assert sorted(a.path for a in held) == sorted(a.path for a in selected)  # each selected one exactly once
    rank_of = {a.path: share.rank for share in shares for a in share.artifacts}
    for shard in {a.shard for a in selected}:
        assert len({rank_of[a.path] for a in selected if a.shard == shard}) == 1  # never split
    sizes: dict[int, int] = {}
    for artifact in selected:
        sizes[artifact.shard] = sizes.get(artifact.shard, 0) + artifact.size
    largest = max(sizes.values(), default=0)
    loads = [share.size for share in shares]
    assert max(loads) - min(loads) <= largest  # greedy onto the lightest rank
    wanted = {fmt for unit in formats or ("bin", "wds") for fmt in unit_formats(unit)}
    assert {a.format for a in held} <= wanted


def test_one_shard_for_two_ranks_goes_whole_to_rank_0_and_rank_1_is_warned_empty() -> None:
    artifacts = [Artifact("bin/00000.bin", "bin", 0, 100, "0" * 64), Artifact("bin/00000.idx", "idx", 0, 10, "1" * 64),
                 Artifact("wds/00000.tar", "wds", 0, 500, "2" * 64)]
    first, second = partition(artifacts, 2)
    assert [a.path for a in first.artifacts] == ["bin/00000.bin", "bin/00000.idx", "wds/00000.tar"]
    assert first.warning is None
    assert second.artifacts == () and second.warning == "rank 1 of 2 holds no files: 1 shard for 2 ranks"


@pytest.mark.parametrize(("values", "parsed"), [((), None), (("bin",),) * 2, (("wds,bin",), ("bin", "wds")),
                                                (("bin", " wds ", "bin"), ("bin", "wds"))])
def test_formats_are_a_repeatable_comma_list(values: tuple[str, ...], parsed: tuple[str, ...] | None) -> None:
    assert parse_formats(values) == parsed


def test_unknown_or_absent_formats_are_usage_errors() -> None:
    with pytest.raises(UsageError, match="unknown format 'idx'"):
        parse_formats(["idx"])
    with pytest.raises(UsageError, match="snap has no wds artifacts \\(it has: bin\\)"):
        select_formats([Artifact("bin/00000.bin", "bin", 0, 1, "0" * 64), Artifact("bin/00000.idx", "idx", 0, 1,
                                                                                     "1" * 64)], ("wds",), "snap")


@pytest.fixture()
def store(tmp_path: Path) -> LocalStore:
    return LocalStore(tmp_path / "store")


def test_a_bin_only_pull_holds_bin_and_idx_and_records_its_share(store: LocalStore, tmp_path: Path) -> None:
    built = build_snapshot(store, tmp_path / "work", shard_sizes=(40_000, 25_000, 9_000))
    dest = tmp_path / "dest"
    result = pull(store, built.snapshot, dest, rank=0, world_size=2, formats=("bin",))
    names = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if ".prep" not in p.parts)
    assert names and all(name.startswith("bin/") for name in names if "/" in name) and not (dest / "wds").exists()
    assert {a.format for a in result.share.artifacts} == {"bin", "idx"}
    record = json.loads(share_path(dest).read_text())
    validate(record, "prep.share/1", "share record")
    assert record == {"schema": "prep.share/1", "snapshot": built.snapshot.id, "rank": 0, "world_size": 2,
                      "formats": ["bin"]}
    validate(result.to_json(), "prep.pull-report/1", "report")
    report = verify(built.snapshot, dest)  # no flags: the recorded share
    assert report.ok and report.from_record and report.share == result.share
    assert report.to_json()["share_from"] == "record"


def test_verify_refuses_flags_that_conflict_with_the_record(store: LocalStore, tmp_path: Path) -> None:
    built = build_snapshot(store, tmp_path / "work")
    dest = tmp_path / "dest"
    pull(store, built.snapshot, dest, rank=1, world_size=2, formats=("bin",))
    for flags in ({"rank": 0, "world_size": 2}, {"formats": ("wds",)}, {"rank": 1, "world_size": 3}):
        with pytest.raises(UsageError, match="conflicts with .*share.json: this folder holds rank 1 of 2, formats bin"):
            verify(built.snapshot, dest, **flags)
    assert verify(built.snapshot, dest, rank=1, world_size=2, formats=("bin",)).ok  # agreeing flags are fine
    assert not verify(built.snapshot, dest, use_record=False).ok  # the whole snapshot is not there


def test_a_whole_pull_can_verify_any_share_of_it(store: LocalStore, tmp_path: Path) -> None:
    built = build_snapshot(store, tmp_path / "work")
    dest = tmp_path / "dest"
    pull(store, built.snapshot, dest, formats=("bin",))
    assert read_share_record(dest) is not None
    assert verify(built.snapshot, dest, rank=0, world_size=2).ok  # a share of what it holds
    assert verify(built.snapshot, dest, rank=0, world_size=2).share.formats == ("bin",)
    with pytest.raises(UsageError, match="conflicts"):
        verify(built.snapshot, dest, formats=("wds",))


def test_a_damaged_share_record_is_a_usage_error_naming_it(store: LocalStore, tmp_path: Path) -> None:
    built = build_snapshot(store, tmp_path / "work")
    dest = tmp_path / "dest"
    pull(store, built.snapshot, dest, rank=0, world_size=2)
    for body in (b"{", b'{"schema": "prep.share/1"}', json.dumps({
            "schema": "prep.share/1", "snapshot": built.snapshot.id, "rank": 2, "world_size": 2,
            "formats": None}).encode()):
        share_path(dest).write_bytes(body)
        with pytest.raises(UsageError, match="share.json: not a valid prep.share/1"):
            verify(built.snapshot, dest)


def test_a_record_of_another_snapshot_is_not_applied(store: LocalStore, tmp_path: Path) -> None:
    old = build_snapshot(store, tmp_path / "old", seed=1, ref="v1")
    new = build_snapshot(store, tmp_path / "new", seed=2, ref="v2")
    dest = tmp_path / "dest"
    pull(store, old.snapshot, dest, rank=0, world_size=2)
    report = verify(new.snapshot, dest, rank=1, world_size=3)
    assert not report.from_record and (report.share.rank, report.share.world_size) == (1, 3)


def test_the_record_spec_describes_itself() -> None:
    assert ShareSpec(1, 4, ("bin",)).describe() == "rank 1 of 4, formats bin"
    assert ShareSpec(None, None, None).describe() == "the whole snapshot, all formats"
