"""Pairs objects: the candidate near-duplicate pairs one LSH bucket task found, and the order key
high word of every document they name (docs/manifests.md, "Pairs objects").

Documents are global numbers, `part ordinal << 32 | row`: input order. The key of every named
document is kept, not only the right one's: a document that is the first of every band bucket it
shares may still lose to a smaller one through another document, and the cluster task must route
its drop to its order bucket all the same.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from prep.errors import IntegrityError
from prep.hashing import Digest, HashingWriter
from prep.workfiles.entries import descriptor, object_head, read_head
from prep.workfiles.intermediate import io_errors, pread_into

Array = np.ndarray[Any, Any]
PAIR_DTYPE = np.dtype([("left", "<u8"), ("right", "<u8")])
DOCUMENT_DTYPE = np.dtype([("document", "<u8"), ("key_hi", "<u8")])
MAGIC = b"PREPPAR1"
SCHEMA = "prep.pairs/1"
WHAT = "pairs object"


@dataclass(frozen=True, eq=False)
class CandidatePairs:
    """Pairs (left[i], right[i]) of global document numbers, left < right, sorted, each once; and
    the documents they name (sorted, distinct) with their order key high words."""

    left: Array
    right: Array
    documents: Array
    key_hi: Array

    @classmethod
    def empty(cls) -> CandidatePairs:
        """No pairs."""
        return cls(*(np.zeros(0, dtype=np.uint64) for _ in range(4)))


def write_pairs(path: Path, pairs: CandidatePairs, header: dict[str, Any]) -> Digest:
    """Write a pairs object: head (`header`'s fields with schema and counts), pairs, documents."""
    records = np.empty(len(pairs.left), dtype=PAIR_DTYPE)
    records["left"], records["right"] = pairs.left, pairs.right
    named = np.empty(len(pairs.documents), dtype=DOCUMENT_DTYPE)
    named["document"], named["key_hi"] = pairs.documents, pairs.key_hi
    head = {**header, "schema": SCHEMA, "count": len(records), "documents": len(named)}
    with io_errors("writing", path), HashingWriter(path, durable=False) as out:
        out.write(object_head(MAGIC, head))
        out.write(records.view(np.uint8).data)
        out.write(named.view(np.uint8).data)
    return out.close()


def read_pairs(path: Path, fd: int | None = None) -> CandidatePairs:
    """A pairs object's pairs and documents; IntegrityError when its size, order or documents are wrong."""
    header, start = read_head(path, MAGIC, WHAT, fd)
    named_count = header.get("documents")
    if header.get("schema") != SCHEMA or not isinstance(named_count, int) or named_count < 0:
        raise IntegrityError(f"{path}: {WHAT} header is malformed")
    records = np.empty(header["count"], dtype=PAIR_DTYPE)
    named = np.empty(named_count, dtype=DOCUMENT_DTYPE)
    with descriptor(path, fd) as opened, io_errors("reading", path):
        if os.fstat(opened).st_size != start + records.nbytes + named.nbytes:
            raise IntegrityError(f"{path}: its size is not the {WHAT} its header says")
        pread_into(opened, records.view(np.uint8).data, start)
        pread_into(opened, named.view(np.uint8).data, start + records.nbytes)
    pairs = CandidatePairs(records["left"].copy(), records["right"].copy(), named["document"].copy(),
                           named["key_hi"].copy())
    check_pairs(pairs, str(path))
    return pairs


def check_pairs(pairs: CandidatePairs, where: str) -> None:
    """IntegrityError unless the pairs are ordered, each once, left < right, and every document
    they name is among the (sorted, distinct) documents."""
    left, right, documents = pairs.left, pairs.right, pairs.documents
    if bool((left >= right).any()):
        raise IntegrityError(f"{where}: a pair whose left document is not the smaller")
    if len(left) > 1 and not bool(((left[1:] > left[:-1]) | ((left[1:] == left[:-1]) & (right[1:] > right[:-1]))).all()):
        raise IntegrityError(f"{where}: its pairs are out of order or repeated")
    if len(documents) > 1 and bool((documents[1:] <= documents[:-1]).any()):
        raise IntegrityError(f"{where}: its documents are out of order or repeated")
    ends = np.concatenate([left, right])
    found = np.minimum(np.searchsorted(documents, ends), max(len(documents) - 1, 0))
    if len(ends) and (not len(documents) or bool((documents[found] != ends).any())):
        raise IntegrityError(f"{where}: a pair names a document it does not list")
