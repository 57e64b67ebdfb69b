"""The `wds` output format: one WebDataset `.tar` per shard, three members a document.

Registered here; the byte layout is prep.formats.wds, the shard writer
prep.stages.shard.write_tar_unit. Loads no numpy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prep.formats.registry import ArtifactFormat, DocumentSizes, OutputFormat, ShardCounts, register

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

WDS = "wds"
"""The `wds` unit (output format), and the artifact format of its WebDataset tar."""
TAR_BYTES_PER_DOCUMENT = 3 * 512 + 3 * 256
"""Three 512-byte tar header blocks and about half a block of padding per member (wds.BLOCK_SIZE:
not imported here, since prep.formats.wds loads numpy, which the driver never does)."""


def sample_spans(sizes: DocumentSizes) -> npt.NDArray[np.int64]:
    """A document's bytes in the tar: its three members, headers and padding included."""
    from prep.formats import wds

    return wds.sample_spans(sizes.json_sizes, wds.npy_sizes(sizes.tokens, sizes.dtype), sizes.text_bytes)


def weight(shard: ShardCounts) -> int:
    """About the tar's bytes: token ids, texts, and per document three header blocks and padding."""
    return shard.bin_size + shard.text_bytes + shard.documents * TAR_BYTES_PER_DOCUMENT


WEBDATASET = register(OutputFormat(WDS, (ArtifactFormat(WDS, "wds", "tar", WDS, sample_spans, "tar_off"),),
                                   writer="prep.stages.shard:write_tar_unit", weight=weight, needs_json=True))
