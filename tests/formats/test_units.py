"""The shard vocabulary: units, their artifact formats, and artifact paths that parse back."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prep.formats import megatron
from prep.formats.megatron_spec import BIN_METADATA
from prep.formats.units import (
    BIN,
    IDX,
    WDS,
    artifact_format,
    artifact_formats,
    artifact_path,
    family_of,
    named_artifact_path,
    parse_artifact_path,
    required_formats,
    unit,
    unit_formats,
    unit_names,
    units,
    units_for,
)
from prep.quality.sourcemix import SourceMix
from prep.runner import publish
from prep.runner.sharding import ShardOut
from prep.stages import specs
from prep.transfer import shares
from prep.workfiles.shardplan import ShardPlan


@settings(max_examples=300, deadline=None)
@given(fmt=st.sampled_from(sorted(artifact_formats())), index=st.integers(min_value=0, max_value=10**12))
def test_artifact_paths_parse_back(fmt: str, index: int) -> None:
    path = artifact_path(fmt, index)
    assert parse_artifact_path(path) == (fmt, index)
    spec = artifact_format(fmt)
    assert path.startswith(f"{spec.folder}/") and path.endswith(f".{spec.extension}")


_NEAR_PATHS = st.builds(lambda folder, digits, extension: f"{folder}/{digits}.{extension}",
                        st.sampled_from(["bin", "wds", "tar", "idx", "", "x"]),
                        st.text(alphabet="0123456789-+ ０٣", max_size=8),
                        st.sampled_from(["bin", "idx", "tar", "wds", "", "idx.x"]))


@settings(max_examples=500, deadline=None)
@given(path=st.one_of(_NEAR_PATHS, st.text(max_size=20)))
def test_whatever_parses_is_exactly_what_artifact_path_makes(path: str) -> None:
    try:
        fmt, index = parse_artifact_path(path)
    except ValueError:
        return
    assert artifact_path(fmt, index) == path


def test_artifact_paths_are_the_published_ones() -> None:
    """Pinned: these strings are in every snapshot manifest, so their id depends on them."""
    assert [artifact_path(fmt, 3) for fmt in (BIN, IDX, WDS)] == ["bin/00003.bin", "bin/00003.idx", "wds/00003.tar"]
    assert artifact_path(IDX, 123456) == "bin/123456.idx"
    assert parse_artifact_path("bin/123456.idx") == (IDX, 123456)


@pytest.mark.parametrize("path", ["bin/3.idx", "bin/000003.idx", "bin/00003.tar", "wds/00003.idx", "bin/-0003.bin",
                                  "bin/０００03.bin", "bin/00003", "bin/00003.idx/x", "/bin/00003.bin", "00003.bin", ""])
def test_other_paths_do_not_parse(path: str) -> None:
    with pytest.raises(ValueError):
        parse_artifact_path(path)


def test_unknown_names_and_negative_shards_are_refused() -> None:
    for bad in (lambda: artifact_path("npy", 0), lambda: artifact_path(BIN, -1), lambda: unit("idx"),
                lambda: unit_formats("tar")):
        with pytest.raises(ValueError):
            bad()


def test_the_units_are_exactly_the_registered_output_formats() -> None:
    assert unit_names() == (BIN, "mds", WDS)
    assert units_for(reversed(unit_names())) == list(unit_names())  # unit order, whatever the order asked
    assert units_for([WDS]) == [WDS]
    assert units_for([]) == []


def test_every_artifact_format_belongs_to_one_unit_and_one_family() -> None:
    assert {name: unit_formats(name) for name in unit_names()} == {BIN: (BIN, IDX, BIN_METADATA), "mds": ("mds",),
                                                                   WDS: (WDS,)}
    assert {name: required_formats(name) for name in unit_names()} == {BIN: (BIN, IDX), "mds": ("mds",), WDS: (WDS,)}
    owners = [fmt.name for item in units() for fmt in item.artifacts]
    assert sorted(owners) == sorted(artifact_formats())  # no format in two units
    families = {item.name: {fmt.family for fmt in item.artifacts} for item in units()}
    assert all(len(found) == 1 for found in families.values())  # a unit's files travel together
    assert len({next(iter(found)) for found in families.values()}) == len(units())
    assert {fmt: family_of(fmt) for fmt in artifact_formats()} == {BIN: "megatron", IDX: "megatron",
                                                                   BIN_METADATA: "megatron", "mds": "mds", WDS: "wds"}
    assert family_of("future") == "future"
    files = {(fmt.folder, fmt.extension) for fmt in artifact_formats().values()}
    assert len(files) == len(artifact_formats())  # every path names one format


def test_extensions_match_what_the_format_writers_name_their_files() -> None:
    assert megatron.bin_path("x").suffix == f".{artifact_format(BIN).extension}"
    assert megatron.idx_path("x").suffix == f".{artifact_format(IDX).extension}"


def test_publish_lists_every_file_of_every_unit_at_its_artifact_path() -> None:
    plan = ShardPlan(7, 0x3A << 56, 8, ((0, 0, 2),), 2, 9, 18, 40, "0" * 64)
    shard = ShardOut(plan, tuple((fmt, "sha256:" + str(n) * 64) for n, fmt in enumerate((BIN, IDX, WDS))),
                     ((BIN, 18), (IDX, 82), (WDS, 4096)), SourceMix(1, ((0, 2),)))
    listed = publish.artifacts([shard], (WDS, BIN))
    assert [(a["path"], a["format"], a["shard"]) for a in listed] == [
        ("bin/3a00000000000000.bin", BIN, 7), ("bin/3a00000000000000.idx", IDX, 7), ("wds/3a00000000000000.tar", WDS, 7)]
    assert [a["path"] for a in publish.artifacts([shard], (WDS,))] == ["wds/3a00000000000000.tar"]


@pytest.mark.parametrize("name", ["3a", "3A00000000000000", "3a0000000000000g", "3a00000000000000.bin"])
def test_shard_names_are_sixteen_lowercase_hex_digits(name: str) -> None:
    with pytest.raises(ValueError):
        named_artifact_path(BIN, name)


def test_the_old_tables_are_gone() -> None:
    """One vocabulary: no module keeps its own copy of the unit or artifact tables."""
    for module, name in ((specs, "UNIT_FILES"), (specs, "UNITS"), (publish, "ARTIFACT_FILES"), (publish, "units"),
                         (shares, "FORMAT_FAMILY")):
        assert not hasattr(module, name), f"{module.__name__}.{name}"
