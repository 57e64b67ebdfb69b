"""The shard vocabulary: the units a shard is written in, and the artifact files each unit makes.

A unit is one output format (`output.formats`): `bin` writes a Megatron .bin and .idx, `wds` a
WebDataset .tar. Each artifact format has the folder and extension that name its file in a
snapshot (`bin/00003.idx`), and a family: one shard's artifacts of one family travel together.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

BIN = "bin"
"""The `bin` unit (output format), and the artifact format of its Megatron token file."""
IDX = "idx"
"""The artifact format of the `bin` unit's Megatron index."""
WDS = "wds"
"""The `wds` unit (output format), and the artifact format of its WebDataset tar."""
SHARD_DIGITS = 5
"""Shard indices in artifact names are zero-padded to at least this many digits (layout 1)."""
KEY_NAME_DIGITS = 16
"""Shards named by their key range's start have names of this many hex digits (layouts 2 and 3)."""


@dataclass(frozen=True)
class ArtifactFormat:
    """One kind of shard file: its manifest `format`, its path's folder and extension, its family."""

    name: str
    folder: str
    extension: str
    family: str


@dataclass(frozen=True)
class Unit:
    """One unit of shard work, named by the output format that asks for it, and the files it writes."""

    name: str
    formats: tuple[ArtifactFormat, ...]

    @property
    def format_names(self) -> tuple[str, ...]:
        """The manifest `format` of each file the unit writes, in order."""
        return tuple(fmt.name for fmt in self.formats)


UNITS: tuple[Unit, ...] = (
    Unit(BIN, (ArtifactFormat(BIN, "bin", "bin", "megatron"), ArtifactFormat(IDX, "bin", "idx", "megatron"))),
    Unit(WDS, (ArtifactFormat(WDS, "wds", "tar", "wds"),)),
)
"""Every unit, in the order a shard's units are planned, written and listed."""
UNIT_NAMES: tuple[str, ...] = tuple(unit.name for unit in UNITS)
ARTIFACT_FORMATS: dict[str, ArtifactFormat] = {fmt.name: fmt for unit in UNITS for fmt in unit.formats}
_UNITS_BY_NAME = {unit.name: unit for unit in UNITS}
_FORMATS_BY_FILE = {(fmt.folder, fmt.extension): fmt.name for fmt in ARTIFACT_FORMATS.values()}


def unit(name: str) -> Unit:
    """The unit `name` (an output format); ValueError names the known ones."""
    found = _UNITS_BY_NAME.get(name)
    if found is None:
        raise ValueError(f"unknown shard unit {name!r}: expected one of {', '.join(UNIT_NAMES)}")
    return found


def units_for(formats: Iterable[str]) -> list[str]:
    """The units the output formats ask for, in unit order (each output format is one unit)."""
    wanted = set(formats)
    return [name for name in UNIT_NAMES if name in wanted]


def unit_formats(name: str) -> tuple[str, ...]:
    """The artifact formats unit `name` writes: `bin` -> ("bin", "idx"), `wds` -> ("wds",)."""
    return unit(name).format_names


def artifact_format(fmt: str) -> ArtifactFormat:
    """The artifact format `fmt` (a manifest `format`); ValueError names the known ones."""
    found = ARTIFACT_FORMATS.get(fmt)
    if found is None:
        raise ValueError(f"unknown artifact format {fmt!r}: expected one of {', '.join(ARTIFACT_FORMATS)}")
    return found


def family_of(fmt: str) -> str:
    """The family of artifact format `fmt`; a format this version does not know is a family of its own."""
    known = ARTIFACT_FORMATS.get(fmt)
    return fmt if known is None else known.family


def artifact_path(fmt: str, shard_index: int) -> str:
    """Where a shard's artifact sits in a snapshot named by position (layout 1):
    ("idx", 3) -> "bin/00003.idx"."""
    if shard_index < 0:
        raise ValueError(f"shard index must not be negative, got {shard_index}")
    spec = artifact_format(fmt)
    return f"{spec.folder}/{shard_index:0{SHARD_DIGITS}d}.{spec.extension}"


def named_artifact_path(fmt: str, name: str) -> str:
    """Where a shard's artifact sits in a snapshot named by key range (layouts 2 and 3):
    ("idx", "3a00000000000000") -> "bin/3a00000000000000.idx"."""
    if len(name) != KEY_NAME_DIGITS or any(c not in "0123456789abcdef" for c in name):
        raise ValueError(f"shard name {name!r} must be {KEY_NAME_DIGITS} lowercase hex digits")
    spec = artifact_format(fmt)
    return f"{spec.folder}/{name}.{spec.extension}"


def parse_artifact_path(path: str) -> tuple[str, int]:
    """The (format, shard index) of a path `artifact_path` makes: "bin/00003.idx" -> ("idx", 3)."""
    folder, _, name = path.partition("/")
    stem, _, extension = name.partition(".")
    fmt = _FORMATS_BY_FILE.get((folder, extension))
    if fmt is None or not (stem.isascii() and stem.isdigit()) or artifact_path(fmt, int(stem)) != path:
        raise ValueError(f"{path!r} is not a shard artifact path such as {artifact_path(IDX, 3)}")
    return fmt, int(stem)
