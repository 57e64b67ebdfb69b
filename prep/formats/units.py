"""The shard vocabulary, read from the format registry (prep.formats.registry): the units a shard
is written in, and the artifact files each unit makes.

A unit is one output format (`output.formats`): `bin` writes a Megatron .bin and .idx, `wds` a
WebDataset .tar, a registered format what it declares. Each artifact format has the folder and
extension that name its file in a snapshot (`bin/00003.idx`), and a family: one shard's
artifacts of one family travel together.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from prep.formats.megatron_spec import BIN as BIN
from prep.formats.megatron_spec import IDX as IDX
from prep.formats.registry import ArtifactFormat as ArtifactFormat
from prep.formats.registry import OutputFormat, names, output_format, output_formats, tables
from prep.formats.wds_spec import WDS as WDS

SHARD_DIGITS = 5
"""Shard indices in artifact names are zero-padded to at least this many digits (layout 1)."""
KEY_NAME_DIGITS = 16
"""Shards named by their key range's start have names of this many hex digits (layouts 2 and 3)."""


def units() -> tuple[OutputFormat, ...]:
    """Every unit, in the order a shard's units are planned, written and listed."""
    return output_formats()


def unit_names() -> tuple[str, ...]:
    """Every unit's name (output format), in unit order."""
    return names()


def artifact_formats() -> Mapping[str, ArtifactFormat]:
    """Every artifact format by its manifest `format`."""
    return tables().kinds


def unit(name: str) -> OutputFormat:
    """The unit `name` (an output format); ValueError names the known ones."""
    return output_format(name)


def unit_of(fmt: str) -> OutputFormat | None:
    """The unit that writes artifact format `fmt`; None for a format this version does not know."""
    return next((found for found in output_formats() if fmt in found.format_names), None)


def units_for(formats: Iterable[str]) -> list[str]:
    """The units the output formats ask for, in unit order (each output format is one unit)."""
    wanted = set(formats)
    return [name for name in names() if name in wanted]


def unit_formats(name: str) -> tuple[str, ...]:
    """The artifact formats unit `name` may write: `bin` -> ("bin", "idx", "bin_metadata"), `wds` -> ("wds",)."""
    return unit(name).format_names


def required_formats(name: str) -> tuple[str, ...]:
    """The artifact formats unit `name` writes in every build (`bin` -> ("bin", "idx"), without
    the metadata file only a build with metadata fields writes)."""
    return unit(name).required_names


def artifact_format(fmt: str) -> ArtifactFormat:
    """The artifact format `fmt` (a manifest `format`); ValueError names the known ones."""
    known = artifact_formats()
    found = known.get(fmt)
    if found is None:
        raise ValueError(f"unknown artifact format {fmt!r}: expected one of {', '.join(known)}")
    return found


def family_of(fmt: str) -> str:
    """The family of artifact format `fmt`; a format this version does not know is a family of its own."""
    known = artifact_formats().get(fmt)
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
    fmt = tables().files.get((folder, extension))
    if fmt is None or not (stem.isascii() and stem.isdigit()) or artifact_path(fmt, int(stem)) != path:
        raise ValueError(f"{path!r} is not a shard artifact path such as {artifact_path(IDX, 3)}")
    return fmt, int(stem)
