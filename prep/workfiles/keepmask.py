"""The keep mask of store layout 1 (still read for old snapshots): its byte layout, and the exact
dedup rule it recorded, keep the first occurrence of each text hash in input order.

The rule works on 16-byte xxh3-128 hashes in numpy arrays (about 40 bytes of memory per document),
never on texts; history applies it again to layout-2 snapshots, which recorded no mask.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

import numpy as np

from prep.errors import IntegrityError


def keep_mask(hash_arrays: Iterable[np.ndarray], exact: bool) -> np.ndarray:
    """True for every document to keep, over all tasks concatenated in input order."""
    hashes = np.concatenate([h for h in hash_arrays] or [np.zeros((0, 2), np.uint64)])
    keep = np.ones(len(hashes), dtype=bool)
    if not exact or len(hashes) < 2:
        return keep
    order = np.lexsort((np.arange(len(hashes)), hashes[:, 1], hashes[:, 0]))
    sorted_hashes = hashes[order]
    repeat = np.all(sorted_hashes[1:] == sorted_hashes[:-1], axis=1)
    keep[order[1:][repeat]] = False
    return keep


# The keep mask (docs/manifests.md, "Binary objects"), defined here only: a u64 little-endian count
# of documents, then the flags packed 8 to a byte, document 0 in the most significant bit, padding 0.
MASK_COUNT_DTYPE = np.dtype("<u8")
MASK_HEADER_BYTES = MASK_COUNT_DTYPE.itemsize
MASK_BIT_ORDER: Literal["big"] = "big"


def mask_count(header: bytes | np.ndarray) -> int:
    """The document count a keep mask's first MASK_HEADER_BYTES bytes hold."""
    return int(np.frombuffer(bytes(header[:MASK_HEADER_BYTES]), dtype=MASK_COUNT_DTYPE)[0])


def mask_bytes_for(count: int) -> int:
    """How many bytes of packed flags follow the header of a mask of `count` documents."""
    return (count + 7) // 8


def unpack_flags(packed: np.ndarray, count: int) -> np.ndarray:
    """The first `count` keep flags of packed flag bytes, as booleans."""
    return np.unpackbits(np.asarray(packed, dtype=np.uint8), count=count, bitorder=MASK_BIT_ORDER).astype(bool)


def pack_mask(keep: np.ndarray) -> bytes:
    """Deterministic bytes of a keep mask: u64 little-endian length, then packed bits."""
    header: bytes = np.array([len(keep)], dtype=MASK_COUNT_DTYPE).tobytes()
    return header + bytes(np.packbits(np.asarray(keep, dtype=bool), bitorder=MASK_BIT_ORDER).tobytes())


def unpack_mask(data: bytes) -> np.ndarray:
    """The keep flags of a mask's bytes (`pack_mask` reversed); IntegrityError when its size is wrong."""
    if len(data) < MASK_HEADER_BYTES:
        raise IntegrityError(f"a keep mask has a {MASK_HEADER_BYTES}-byte header, got {len(data)} bytes")
    count = mask_count(data)
    if len(data) - MASK_HEADER_BYTES != mask_bytes_for(count):
        raise IntegrityError(f"keep mask of {count} documents has {len(data) - MASK_HEADER_BYTES} bytes of flags")
    return unpack_flags(np.frombuffer(data, dtype=np.uint8, offset=MASK_HEADER_BYTES), count)
