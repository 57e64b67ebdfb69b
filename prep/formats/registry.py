"""The output format registry: each output format (`output.formats`) is one registered value.

A format names its artifact kinds (folder, extension, family), weighs a shard for job balancing,
names its writer (`module:function`, imported only by the shard stage in a worker) and says
what it needs from the shard's documents. The built-in formats register themselves from their
own modules (BUILTIN, loaded on first use); a new format is one module calling `register`.
This module loads no numpy: the build driver and the CLI read it.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

BUILTIN = ("prep.formats.mds_spec", "prep.formats.megatron_spec", "prep.formats.wds_spec")
"""The modules of the built-in formats (each registers its own)."""
NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")
"""What a format or artifact kind name looks like (it is a folder, an extension and a manifest value)."""
EXTENSION = re.compile(rf"{NAME.pattern}(\.{NAME.pattern})?")
"""What an artifact's extension looks like: a name, or two joined by a dot (`metadata.parquet`)."""


class ShardCounts(Protocol):
    """What the driver knows of a shard before it is written (prep.workfiles.shardplan.ShardPlan)."""

    @property
    def documents(self) -> int: ...
    @property
    def bin_size(self) -> int: ...  # bytes of its token ids, EOS included
    @property
    def text_bytes(self) -> int: ...


@dataclass(frozen=True)
class DocumentSizes:
    """Documents of a shard as its writers see them, one array element each (for placements)."""

    tokens: npt.NDArray[np.int64]  # token ids, EOS included
    text_bytes: npt.NDArray[np.int64]
    json_sizes: npt.NDArray[np.int64]  # `.json` member bytes; zeros unless some format needs them
    id_sizes: npt.NDArray[np.int64]  # UTF-8 bytes of the document ids; zeros unless some format needs them
    dtype: np.dtype[Any]  # the token ids' dtype
    metadata_sizes: npt.NDArray[np.int64] | None = None  # MDS metadata column bytes, in a build with metadata


Spans = Callable[[DocumentSizes], "npt.NDArray[np.int64]"]
"""Bytes each document takes in an artifact kind, front to back (a document's offset is the sum before it)."""
Head = Callable[[int, "np.dtype[Any]", bool], int]
"""Bytes before the first document in an artifact of a shard of n documents (a header), in a
build with metadata fields or not."""


def no_head(documents: int, dtype: np.dtype[Any], with_metadata: bool) -> int:
    """Documents start at the first byte."""
    return 0


@dataclass(frozen=True)
class HeldShard:
    """One shard file a pulled folder holds, as its snapshot's manifest lists it."""

    path: str
    size: int
    documents: int


FolderFiles = Callable[[tuple[HeldShard, ...], str, tuple[str, ...]], dict[str, bytes]]
"""The files a pulled folder holds beside a format's shards (path -> bytes), from the shards it
holds in path order, the token dtype's name and the snapshot's metadata keys (config.recorded_metadata_keys)."""


@dataclass(frozen=True)
class ArtifactFormat:
    """One kind of shard file: its manifest `format`, its path's folder and extension, its family,
    the bytes each document takes in it (None: no byte range of its own, as an index), the bytes
    before the first one, the column of a layout-1 shuffle plan that held each document's offset
    in it, and whether it is written only in a build with metadata fields (`with_metadata`)."""

    name: str
    folder: str
    extension: str
    family: str
    spans: Spans | None = None
    layout1_offset: str | None = None
    head: Head = no_head
    with_metadata: bool = False


@dataclass(frozen=True)
class OutputFormat:
    """One output format: one unit of shard work that writes `artifacts`; `writer` is the
    `module:function` the shard stage calls (prep.stages.shard.UnitWriter), `weight` about the
    bytes it writes for a shard, `needs_json` and `needs_ids` whether its writer reads the `.json`
    members or the document ids, `folder_files` the `module:function` (FolderFiles) of the files
    `prep pull` writes beside its shards and `prep verify` checks (an index of them)."""

    name: str
    artifacts: tuple[ArtifactFormat, ...]
    writer: str
    weight: Callable[[ShardCounts], int]
    needs_json: bool = False
    needs_ids: bool = False
    folder_files: str | None = None

    @property
    def format_names(self) -> tuple[str, ...]:
        """The manifest `format` of each file the unit may write, in order."""
        return tuple(kind.name for kind in self.artifacts)

    @property
    def required_names(self) -> tuple[str, ...]:
        """The manifest `format` of each file the unit writes in every build (not only with metadata)."""
        return tuple(kind.name for kind in self.artifacts if not kind.with_metadata)

    def written(self, with_metadata: bool) -> tuple[ArtifactFormat, ...]:
        """The kinds of file the unit writes in a build with (or without) metadata fields."""
        return tuple(kind for kind in self.artifacts if with_metadata or not kind.with_metadata)


@dataclass(frozen=True)
class Tables:
    """The registry's lookups, rebuilt when a format is added or removed (artifact paths are
    parsed and named per file of snapshots of 80,000 shards)."""

    formats: tuple[OutputFormat, ...]  # in unit order: by name
    names: tuple[str, ...]
    kinds: Mapping[str, ArtifactFormat]  # by manifest `format`
    files: Mapping[tuple[str, str], str]  # (folder, extension) -> manifest `format`

    @classmethod
    def of(cls, formats: Mapping[str, OutputFormat]) -> Tables:
        """The lookups of these formats."""
        ordered = tuple(formats[name] for name in sorted(formats))
        kinds = {kind.name: kind for fmt in ordered for kind in fmt.artifacts}
        return cls(ordered, tuple(sorted(formats)), kinds,
                   {(kind.folder, kind.extension): kind.name for kind in kinds.values()})


class _Registry:
    """The registered formats by name, and their lookups."""

    def __init__(self) -> None:
        self.formats: dict[str, OutputFormat] = {}
        self.loaded = False
        self.cached: Tables | None = None

    def all(self) -> dict[str, OutputFormat]:
        """Every format, the built-ins loaded first (their modules call `register`)."""
        if not self.loaded:
            self.loaded = True
            for module in BUILTIN:
                importlib.import_module(module)
        return self.formats

    def tables(self) -> Tables:
        """The lookups of every format."""
        formats = self.all()
        if self.cached is None:
            self.cached = Tables.of(formats)
        return self.cached

    def put(self, fmt: OutputFormat) -> None:
        self.all()[fmt.name] = fmt
        self.cached = None

    def remove(self, name: str) -> None:
        self.all().pop(name, None)
        self.cached = None


_REGISTRY = _Registry()


def register(fmt: OutputFormat) -> OutputFormat:
    """Add `fmt` (again: a no-op); ValueError when a name, folder or file clashes with another format's."""
    formats = _REGISTRY.all()
    if formats.get(fmt.name) == fmt:
        return fmt
    _check_new(fmt, formats.values())
    _REGISTRY.put(fmt)
    return fmt


def unregister(name: str) -> None:
    """Remove the format `name` (a test's own format, once the test is done)."""
    _REGISTRY.remove(name)


def tables() -> Tables:
    """The registry's lookups as they are now."""
    return _REGISTRY.tables()


def _check_new(fmt: OutputFormat, others: Collection[OutputFormat]) -> None:
    """Refuse a malformed name, or a name, folder or file another format has."""
    kinds = [kind for other in others for kind in other.artifacts]
    for name in (fmt.name, *(word for k in fmt.artifacts for word in (k.name, k.folder))):
        if not NAME.fullmatch(name):
            raise ValueError(f"format name {name!r} must match {NAME.pattern}")
    for kind in fmt.artifacts:
        if not EXTENSION.fullmatch(kind.extension):
            raise ValueError(f"extension {kind.extension!r} must match {EXTENSION.pattern}")
    clash = ({fmt.name} | set(fmt.format_names)) & ({k.name for k in kinds} | {o.name for o in others})
    files = {(k.folder, k.extension) for k in kinds}
    if clash or not fmt.artifacts or any((k.folder, k.extension) in files for k in fmt.artifacts):
        raise ValueError(f"format {fmt.name!r} clashes with a registered format (names, folders and extensions)")


def output_formats() -> tuple[OutputFormat, ...]:
    """Every registered format in unit order, by name: the order units are planned, written and
    listed, whatever the order their modules were imported in."""
    return tables().formats


def names() -> tuple[str, ...]:
    """Every registered format's name, in unit order."""
    return tables().names


def output_format(name: str) -> OutputFormat:
    """The format `name`; ValueError names the known ones."""
    found = _REGISTRY.all().get(name)
    if found is None:
        raise ValueError(f"unknown shard unit {name!r}: expected one of {', '.join(names())}")
    return found


def load(dotted: str) -> object:
    """The object a format names as `module:function` (imported now)."""
    module, _, name = dotted.partition(":")
    return getattr(importlib.import_module(module), name)


def unknown(wanted: tuple[str, ...] | list[str]) -> list[str]:
    """The names in `wanted` no registered format has, sorted."""
    return sorted(set(wanted) - set(names()))
