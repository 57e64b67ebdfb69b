"""The `mds` output format: one Mosaic MDS shard per shard (docs/formats-mds.md), read by
mosaicml-streaming's StreamingDataset.

Registered here; the byte layout is prep.formats.mds, the shard writer
prep.stages.mds_unit.write_mds_unit. Loads no numpy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prep.formats.registry import ArtifactFormat, DocumentSizes, HeldShard, OutputFormat, ShardCounts, register

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

MDS = "mds"
"""The `mds` unit (output format), and the artifact format of its shard files."""
FOLDER = "mds"
"""Where a snapshot's MDS shards and a pulled folder's index.json are."""
MDS_BYTES_PER_DOCUMENT = 4 + 12 + 3 + 24
"""A sample's offset, column sizes and token shape, and about an id (not counted by the plan)."""


def sample_spans(sizes: DocumentSizes) -> npt.NDArray[np.int64]:
    """A document's bytes in the shard: its sample (column sizes, id, metadata, text, token column)."""
    from prep.formats import mds

    return mds.SampleSizes(sizes.tokens, sizes.text_bytes, sizes.id_sizes, sizes.metadata_sizes).sample_bytes(sizes.dtype)


def header(documents: int, dtype: np.dtype[Any], with_metadata: bool) -> int:
    """The sample count, offsets and config (its columns: with metadata or not) before the first sample."""
    from prep.formats import mds

    return mds.header_size(dtype, documents, with_metadata)


def weight(shard: ShardCounts) -> int:
    """About the shard file's bytes."""
    return shard.bin_size + shard.text_bytes + shard.documents * MDS_BYTES_PER_DOCUMENT


def folder_index(shards: tuple[HeldShard, ...], dtype: str, metadata_keys: tuple[str, ...]) -> dict[str, bytes]:
    """`mds/index.json` listing the shards a folder holds, so StreamingDataset(local=DEST/mds) reads them."""
    import numpy as np

    from prep.formats import mds

    entries = [mds.ShardEntry(shard.path.rpartition("/")[2], shard.size, shard.documents, np.dtype(dtype),
                              bool(metadata_keys)) for shard in shards]
    return {f"{FOLDER}/{mds.INDEX_BASENAME}": mds.index_bytes(entries)}


MOSAIC = register(OutputFormat(MDS, (ArtifactFormat(MDS, FOLDER, "mds", MDS, sample_spans, head=header),),
                               writer="prep.stages.mds_unit:write_mds_unit", weight=weight, needs_ids=True,
                               folder_files=f"{__name__}:folder_index"))
