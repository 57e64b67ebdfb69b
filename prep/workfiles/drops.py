"""Drops objects: every document near-duplicate removal drops, with the document it duplicates,
sorted by order key with a prefix index over its top bits, so an order task reads its own
bucket's drops with one read (docs/manifests.md, "Drops objects").

Documents are global numbers, `part ordinal << 32 | row`; a drop's representative is the first
document of its cluster in input order (the smallest number), the one kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from prep.hashing import Digest
from prep.workfiles.indexed import IndexedFile, RecordFormat, merge_indexed, write_indexed

DROP_DTYPE = np.dtype([("key_hi", "<u8"), ("document", "<u8"), ("representative", "<u8")])
"""One dropped document: its order key high word, its number, its cluster's representative; 24 bytes."""
DROP_ORDER = ("key_hi", "document")
"""The fields drop records are sorted by."""
DROPS = RecordFormat(b"PREPDRP1", "prep.drops/1", DROP_DTYPE, "key_hi", 8, "drops object")
Array = np.ndarray[Any, Any]


def drop_records(documents: Array, representatives: Array, key_hi: Array) -> Array:
    """Drop records of these documents, sorted by (key_hi, document) as a drops object holds them."""
    records = np.empty(len(documents), dtype=DROP_DTYPE)
    records["key_hi"], records["document"], records["representative"] = key_hi, documents, representatives
    ordered: Array = records[np.lexsort((records["document"], records["key_hi"]))]
    return ordered


def write_drops(path: Path, records: Array, header: dict[str, Any]) -> Digest:
    """Write a drops object of `drop_records`' records, with `header`'s fields."""
    return write_indexed(path, DROPS, records, header)


def merge_drops(path: Path, sources: Sequence[Path]) -> Digest:
    """Write the drops objects at `sources` (no document in two) as one, the object `write_drops`
    makes of all their records at once, in bounded memory (`indexed.merge_indexed`)."""
    return merge_indexed(sources, DROPS, DROP_ORDER, path, {})


def open_drops(path: Path, fd: int | None = None) -> IndexedFile:
    """A drops object opened for reading (`read_bucket`, `read_all`)."""
    return IndexedFile.open(path, DROPS, fd)
