"""A document's placements in its shard's artifacts, from the registry: each artifact kind says
how many bytes a document takes in it (prep.formats.registry.ArtifactFormat.spans); an offset is
the sum of the spans of the documents before it. Kinds without spans (an index) and formats this
version does not know have no byte range."""

from __future__ import annotations

from collections.abc import Mapping
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


def needs_json(kinds: list[ArtifactFormat]) -> bool:
    """Whether the spans of `kinds` count the documents' `.json` members."""
    return any(unit.needs_json for unit in map(unit_of, (kind.name for kind in kinds)) if unit is not None)


def origin_sizes(origin: DocumentOrigin, dtype: np.dtype[Any], with_json: bool) -> DocumentSizes:
    """`origin`'s sizes as the shard stage wrote it (EOS added; its `.json` member when `with_json`)."""
    tokens = origin.tokens + 1
    json_size = len(wds.sample_json(origin.id, origin.source, origin.line, tokens)) if with_json else 0
    return DocumentSizes(np.array([tokens], dtype=np.int64), np.array([origin.text_bytes], dtype=np.int64),
                         np.array([json_size], dtype=np.int64), dtype)


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
