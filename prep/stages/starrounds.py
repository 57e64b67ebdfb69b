"""The near-duplicate cluster rounds' task bodies (issue 42), pure of stores and runners: a pairs
object's edges and nodes routed to ranges, one large-star or small-star round of a range
(`prep.neardup.stars`), and a finished range's drop records. Each task holds its range's edges
and nodes only, never the graph's (docs/build.md, "Near-duplicate removal")."""

from __future__ import annotations

from typing import Any

import numpy as np

from prep.errors import IntegrityError
from prep.neardup.stars import held_both_ways, held_by_larger, large_star, small_star, star_leaves
from prep.workfiles.drops import drop_records
from prep.workfiles.edges import edge_records, node_records
from prep.workfiles.pairs import CandidatePairs

Array = np.ndarray[Any, Any]


def routed_pairs(pairs: CandidatePairs) -> tuple[Array, Array]:
    """A pairs object's edges held both ways (the first round is large-star's) and its documents' nodes."""
    return edge_records(*held_both_ways(pairs.left, pairs.right)), node_records(pairs.documents, pairs.key_hi)


def star_round(edges: Array, large: bool) -> tuple[Array, bool]:
    """One round over a range's edges: large-star, its new edges held by their larger ends for
    small-star; or small-star, its new edges held both ways for large-star. With large-star,
    whether the range's edges were stars already (then the rounds are over when every range's were)."""
    if large:
        left, right, settled = large_star(edges["owner"], edges["neighbour"])
        return edge_records(*held_by_larger(left, right)), settled
    return edge_records(*held_both_ways(*small_star(edges["owner"], edges["neighbour"]))), False


def range_drops(edges: Array, nodes: Array) -> tuple[Array, Array]:
    """The drop records of a finished range (its stars' edges held both ways, its documents'
    nodes): each leaf with its centre, the cluster's first document; and the size of each star
    centred in the range."""
    leaves, centres, sizes = star_leaves(edges["owner"], edges["neighbour"])
    documents, keys = _node_keys(nodes)
    at = np.minimum(np.searchsorted(documents, leaves), max(len(documents) - 1, 0))
    if len(leaves) and (not len(documents) or bool((documents[at] != leaves).any())):
        raise IntegrityError("a document the cluster edges name is in no nodes object")
    return drop_records(leaves, centres, keys[at] if len(leaves) else leaves), sizes


def _node_keys(nodes: Array) -> tuple[Array, Array]:
    """The distinct documents of node records, sorted, with their order key high words;
    IntegrityError when one document comes with two keys."""
    order = np.lexsort((nodes["key_hi"], nodes["document"]))
    documents, keys = nodes["document"][order], nodes["key_hi"][order]
    first = np.ones(len(documents), dtype=bool)
    first[1:] = documents[1:] != documents[:-1]
    if bool((keys[1:][~first[1:]] != keys[:-1][~first[1:]]).any()):
        raise IntegrityError("one document is named with two different order keys by the buckets' pairs")
    return documents[first], keys[first]
