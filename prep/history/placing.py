"""A document's placements in its shard's artifacts, from the registry: each artifact kind says
how many bytes a document takes in it (prep.formats.registry.ArtifactFormat.spans); an offset is
the sum of the spans of the documents before it. Kinds without spans (an index) and formats this
version does not know have no byte range."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from prep.formats import wds
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
    ids: bool  # the documents' ids


def needs(kinds: list[ArtifactFormat]) -> Needs:
    """What the spans of `kinds` count, from their formats."""
    units = [unit for unit in map(unit_of, (kind.name for kind in kinds)) if unit is not None]
    return Needs(any(unit.needs_json for unit in units), any(unit.needs_ids for unit in units))


def origin_sizes(origin: DocumentOrigin, dtype: np.dtype[Any], need: Needs) -> DocumentSizes:
    """`origin`'s sizes as the shard stage wrote it (EOS added; its `.json` member and id as `need` says)."""
    tokens = origin.tokens + 1
    json_size = len(wds.sample_json(origin.id, origin.source, origin.line, tokens)) if need.json else 0
    id_size = len(origin.id.encode("utf-8", "surrogatepass")) if need.ids else 0
    one = [np.array([size], dtype=np.int64) for size in (tokens, origin.text_bytes, json_size, id_size)]
    return DocumentSizes(one[0], one[1], one[2], one[3], dtype)


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
