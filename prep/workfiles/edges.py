"""Edges and nodes objects: what the near-duplicate cluster rounds hand each other (docs/manifests.md,
"Edges and nodes objects").

Both are indexed record objects sorted by `route` (`prep.neardup.stars.route_of` of the owner or
document), so a range task reads its range of each with one read. An edges object holds the
edges one task wrote, each under the end that holds it (`owner`), distinct; a nodes object holds
every document one pairs object names with its order key high word, which the range tasks give
each dropped document's drop record so the order task of its bucket finds it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from prep.errors import IntegrityError
from prep.hashing import Digest
from prep.neardup.stars import route_of
from prep.workfiles.entries import descriptor
from prep.workfiles.indexed import IndexedFile, RecordFormat, write_indexed

Array = np.ndarray[Any, Any]
EDGE_DTYPE = np.dtype([("route", "<u8"), ("owner", "<u8"), ("neighbour", "<u8")])
NODE_DTYPE = np.dtype([("route", "<u8"), ("document", "<u8"), ("key_hi", "<u8")])
EDGES = RecordFormat(b"PREPEDG1", "prep.edges/1", EDGE_DTYPE, "route", 8, "edges object")
NODES = RecordFormat(b"PREPNOD1", "prep.nodes/1", NODE_DTYPE, "route", 8, "nodes object")
_ROUTED_BY = {EDGES.schema: "owner", NODES.schema: "document"}


def edge_records(owner: Array, neighbour: Array) -> Array:
    """Edge records of (owner, neighbour), loops left out, each once, in the order an edges object holds them."""
    owner, neighbour = np.asarray(owner, dtype=np.uint64), np.asarray(neighbour, dtype=np.uint64)
    linked = owner != neighbour
    records = _routed(EDGES, owner[linked], neighbour=neighbour[linked])
    return _distinct(records, "neighbour")


def node_records(documents: Array, key_hi: Array) -> Array:
    """Node records of documents with their order key high words, each once, in a nodes object's order."""
    documents = np.asarray(documents, dtype=np.uint64)
    records = _routed(NODES, documents, key_hi=np.asarray(key_hi, dtype=np.uint64))
    return _distinct(records, "key_hi")


def _routed(form: RecordFormat, owner: Array, **fields: Array) -> Array:
    """Records of `form` routed by `owner`, with the other fields given."""
    records = np.empty(len(owner), dtype=form.dtype)
    records["route"], records[_ROUTED_BY[form.schema]] = route_of(owner), owner
    for name, values in fields.items():
        records[name] = values
    return records


def _distinct(records: Array, last: str) -> Array:
    """`records` sorted by route, then (the route being a bijection of the owner) owner, then
    their `last` field, the one field left; each distinct record once."""
    records = records[np.lexsort((records[last], records["route"]))]
    fresh = np.ones(len(records), dtype=bool)
    fresh[1:] = (records["route"][1:] != records["route"][:-1]) | (records[last][1:] != records[last][:-1])
    distinct: Array = records[fresh]
    return distinct


def write_edges(path: Path, records: Array, header: dict[str, Any]) -> Digest:
    """Write an edges object of `edge_records`' records."""
    return write_indexed(path, EDGES, records, header)


def write_nodes(path: Path, records: Array, header: dict[str, Any]) -> Digest:
    """Write a nodes object of `node_records`' records."""
    return write_indexed(path, NODES, records, header)


def read_range(paths: Sequence[Path], form: RecordFormat, bucket: int, bits: int) -> Array:
    """Range `bucket` of `2**bits` of every object at `paths` (one read each), every record's
    route checked against its owner: IntegrityError on a damaged record."""
    pieces = []
    for path in paths:
        with descriptor(path) as fd:
            records = IndexedFile.open(path, form, fd).read_bucket(bucket, bits, fd)
        if not np.array_equal(records["route"], route_of(records[_ROUTED_BY[form.schema]])):
            raise IntegrityError(f"{path}: a record's route is not its {form.what}'s owner's")
        pieces.append(records)
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype=form.dtype)
