"""The `mds` unit of a shard: one Mosaic MDS shard file (prep.formats.mds), planned from the
documents' sizes, then written front to back a block of documents at a time, each block's
token ids and texts gathered from the intermediates at once."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from prep.errors import InputError
from prep.faults import crash_point
from prep.formats import little_endian, mds
from prep.formats.mds_spec import MDS
from prep.stages.shard import PAYLOAD_BYTES, PartReader, ShardDocuments, ShardSource, chunks
from prep.stages.sink import Written


@dataclass(frozen=True)
class _Metadata:
    """A window's metadata column values (streaming's json spelling) and their n + 1 offsets."""

    values: bytes
    offsets: np.ndarray

    @classmethod
    def of(cls, docs: ShardDocuments) -> _Metadata:
        bounds = docs.metadata_offsets.tolist()
        values = [mds.metadata_value(docs.metadata[start:end]) for start, end in zip(bounds[:-1], bounds[1:])]
        offsets = np.zeros(len(values) + 1, dtype=np.int64)
        np.cumsum([len(value) for value in values], out=offsets[1:])
        return cls(b"".join(values), offsets)


def _sizes(docs: ShardDocuments, with_metadata: bool) -> mds.SampleSizes:
    """What the shard's layout needs of a window: token counts (EOS included), text and id bytes
    (and its metadata column's)."""
    metadata = np.diff(_Metadata.of(docs).offsets) if with_metadata else None
    return mds.SampleSizes(docs.n_tokens + 1, docs.text_bytes, np.diff(docs.id_offsets), metadata)


def _block(docs: ShardDocuments, start: int, end: int, reader: PartReader, little: np.dtype[Any],
           eos_id: int, metadata: _Metadata | None) -> mds.Documents:
    """Documents [start, end) of a window, their token ids (EOS appended) and texts gathered."""
    counts = docs.n_tokens[start:end] + 1
    token_ends = np.cumsum(counts)
    tokens = np.empty(int(token_ends[-1]), dtype=little)
    reader.gather(tokens.view(np.uint8), docs.part[start:end], docs.tokens_offset[start:end],
                  (counts - 1) * little.itemsize, (token_ends - counts) * little.itemsize)
    tokens[token_ends - 1] = eos_id
    text_sizes = docs.text_bytes[start:end]
    text_ends = np.cumsum(text_sizes)
    texts = np.empty(int(text_ends[-1]), dtype=np.uint8)
    reader.gather(texts, docs.part[start:end], docs.text_offset[start:end], text_sizes, text_ends - text_sizes)
    id_offsets = docs.id_offsets[start:end + 1]
    values, value_offsets = None, None
    if metadata is not None:
        value_offsets = metadata.offsets[start:end + 1]
        values = metadata.values[int(value_offsets[0]):int(value_offsets[-1])]
        value_offsets = value_offsets - value_offsets[0]
    try:
        return mds.Documents(tokens, np.concatenate(([0], token_ends)), texts.tobytes(),
                             np.concatenate(([0], text_ends)), docs.ids[int(id_offsets[0]):int(id_offsets[-1])],
                             id_offsets - id_offsets[0], values, value_offsets)
    except ValueError as exc:  # an id <source>:<line> of a file name that is not UTF-8: MDS columns are UTF-8
        raise InputError(f"the mds format stores texts and ids as UTF-8: {exc}") from None


def write_mds_unit(source: ShardSource, reader: PartReader, dtype: np.dtype[Any], eos_id: int,
                   paths: Mapping[str, Path], read_back: bool) -> dict[str, Written]:
    """The `mds` unit: the shard's MDS file (hashed as written; not read back past the page cache)."""
    little = little_endian(dtype)
    with_metadata = bool(source.metadata_keys)
    layout = mds.ShardLayout.plan(little, (_sizes(docs, with_metadata) for docs in source.windows()), with_metadata)
    with mds.ShardWriter(paths[MDS], layout) as writer:
        for docs in source.windows():
            metadata = _Metadata.of(docs) if with_metadata else None
            for start, end in chunks(docs.n_tokens * little.itemsize + docs.text_bytes, PAYLOAD_BYTES):
                writer.write(_block(docs, start, end, reader, little, eos_id, metadata))
                crash_point("shard.mid_write")
        _, digest = writer.close()
    return {MDS: Written(paths[MDS], digest, read_back=False)}
