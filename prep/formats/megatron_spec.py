"""The `bin` output format: Megatron `.bin` (token ids) and `.idx` (its index), and in a build
with metadata fields each shard's `.metadata.parquet` (its documents' metadata), one family.

Registered here; the byte layouts are prep.formats.megatron, the shard writer
prep.stages.shard.write_bin_unit. Loads no numpy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prep.formats.registry import ArtifactFormat, DocumentSizes, OutputFormat, ShardCounts, register

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

BIN = "bin"
"""The `bin` unit (output format), and the artifact format of its Megatron token file."""
IDX = "idx"
"""The artifact format of the `bin` unit's Megatron index."""
BIN_METADATA = "bin_metadata"
"""The artifact format of the `bin` unit's per-shard metadata file (prep.formats.sidecar),
`bin/<shard>.metadata.parquet`: written only in a build with metadata fields."""
FAMILY = "megatron"


def token_spans(sizes: DocumentSizes) -> npt.NDArray[np.int64]:
    """A document's bytes in the .bin: its token ids, EOS included."""
    return sizes.tokens * sizes.dtype.itemsize


def weight(shard: ShardCounts) -> int:
    """The .bin's bytes (the .idx is 20 bytes a document)."""
    return shard.bin_size


MEGATRON = register(OutputFormat(
    BIN, (ArtifactFormat(BIN, "bin", "bin", FAMILY, token_spans, "bin_off"), ArtifactFormat(IDX, "bin", "idx", FAMILY),
          ArtifactFormat(BIN_METADATA, "bin", "metadata.parquet", FAMILY, with_metadata=True)),
    writer="prep.stages.shard:write_bin_unit", weight=weight))
