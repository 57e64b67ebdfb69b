"""Global exact dedup decisions over text hashes only: keep the first occurrence in input order.

Works on 16-byte xxh3-128 hashes in numpy arrays (about 40 bytes of memory per document),
never on texts.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np

from prep.stages.columns import to_strings
from prep.stages.intermediate import hash_pairs, read_columns


def read_hashes(path: Path) -> np.ndarray:
    """A task's text hashes as an (n, 2) uint64 array, in row order."""
    return hash_pairs(read_columns(path, ["text_hash"]).column("text_hash"))


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


def check_unique_ids(source: str, paths: Iterable[Path]) -> None:
    """Ids must be unique within a file; tasks check their own part, this checks across the
    parts of one large file. Memory: the ids of one file."""
    from prep.errors import InputError

    seen: set[str] = set()
    for path in paths:
        for doc_id in to_strings(read_columns(path, ["id"]).column("id")):
            if doc_id is None:
                return
            if doc_id in seen:
                raise InputError(f"{source}: duplicate id {doc_id!r}")
            seen.add(doc_id)


def pack_mask(keep: np.ndarray) -> bytes:
    """Deterministic bytes of a keep mask: u64 little-endian length, then packed bits."""
    header: bytes = np.array([len(keep)], dtype="<u8").tobytes()
    return header + bytes(np.packbits(keep).tobytes())


def unpack_mask(data: bytes) -> np.ndarray:
    count = int(np.frombuffer(data[:8], dtype="<u8")[0])
    return np.unpackbits(np.frombuffer(data[8:], dtype=np.uint8), count=count).astype(bool)
