"""A document's placements in its shard's artifacts, from the registry: each artifact kind says
how many bytes a document takes in it (prep.formats.registry.ArtifactFormat.spans); an offset is
the sum of the spans of the documents before it. Kinds without spans (an index) and formats this
version does not know have no byte range."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from prep.formats import mds, wds
from prep.formats.registry import ArtifactFormat, DocumentSizes
from prep.formats.units import artifact_formats, unit_of
from prep.history.documents import DocumentOrigin, Placement


def placed_kinds(artifacts: list[dict[str, Any]]) -> list[ArtifactFormat]:
    """The kinds among `artifacts` a document has a byte range in."""
    known = artifact_formats()
    kinds = (known.get(str(artifact["format"])) for artifact in artifacts)
    return [kind for kind in kinds if kind is not None and kind.spans is not None]


@dataclass(frozen=True)
class Needs:
    """What the spans of some artifact kinds count besides tokens and texts."""

    json: bool  # the documents' `.json` members
    ids: bool  # the documents' ids (MDS samples, which then also hold the metadata column)
    metadata: bool = False  # the build had metadata fields: members, samples and headers carry it


def needs(kinds: list[ArtifactFormat], with_metadata: bool = False) -> Needs:
    """What the spans of `kinds` count, from their formats, in a build with metadata fields or not."""
    units = [unit for unit in map(unit_of, (kind.name for kind in kinds)) if unit is not None]
    return Needs(any(unit.needs_json for unit in units), any(unit.needs_ids for unit in units), with_metadata)


@dataclass(frozen=True)
class Named:
    """A document as its `.json` member and its MDS sample name it."""

    id: str
    source: str
    line: int
    tokens: int  # EOS included
    metadata: bytes | None = None  # its metadata (prep.inputs.metadata's spelling), in a build with metadata


def document_sizes(tokens: np.ndarray, text_bytes: np.ndarray, named: Sequence[Named], dtype: np.dtype[Any],
                   need: Needs) -> DocumentSizes:
    """Documents' sizes as the shard writers wrote them (token counts with EOS); `named` lists
    them when `need` counts `.json` members or ids, and may be empty otherwise."""
    zeros = np.zeros(len(tokens), dtype=np.int64)
    json_sizes = _sizes(len(wds.sample_json(d.id, d.source, d.line, d.tokens, d.metadata)) for d in named) \
        if need.json else zeros
    id_sizes = _sizes(len(d.id.encode("utf-8", "surrogatepass")) for d in named) if need.ids else zeros
    column = _sizes(len(mds.metadata_value(d.metadata or b"{}")) for d in named) if need.ids and need.metadata else None
    return DocumentSizes(tokens.astype(np.int64), text_bytes.astype(np.int64), json_sizes, id_sizes, dtype, column)


def _sizes(sizes: Iterable[int]) -> np.ndarray:
    return np.fromiter(sizes, dtype=np.int64)


def origin_sizes(origin: DocumentOrigin, dtype: np.dtype[Any], need: Needs) -> DocumentSizes:
    """`origin`'s sizes as the shard stage wrote it in a build without metadata (EOS added)."""
    named = Named(origin.id, origin.source, origin.line, origin.tokens + 1)
    return document_sizes(np.array([named.tokens]), np.array([origin.text_bytes]), [named], dtype, need)


def placements(artifacts: list[dict[str, Any]], shard: int, sequence: int, offsets: Mapping[str, int],
               one: DocumentSizes) -> tuple[Placement, ...]:
    """The document's placement in each artifact: at `offsets[format]`, as long as its span (`one`)."""
    found = []
    for artifact in artifacts:
        kind = artifact_formats().get(str(artifact["format"]))
        offset: int | None = None
        length: int | None = None
        if kind is not None and kind.spans is not None and kind.name in offsets:
            offset, length = offsets[kind.name], int(kind.spans(one)[0])
        found.append(Placement(artifact["path"], artifact["format"], shard, sequence, offset, length))
    return tuple(found)
