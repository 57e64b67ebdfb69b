"""The near-duplicate cluster rounds' task bodies (issue 42), pure of stores and runners: a pairs
object's edges and nodes routed to ranges, one large-star or small-star round of a range
(`prep.neardup.stars`), and a finished range's drop records. Each task holds its range's edges
and nodes only, never the graph's (docs/build.md, "Near-duplicate removal")."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from prep.errors import IntegrityError
from prep.hashing import Digest
from prep.neardup.settings import MAX_ROUNDS
from prep.neardup.stars import held_both_ways, held_by_larger, large_star, small_star, star_leaves
from prep.workfiles.drops import drop_records, merge_drops, write_drops
from prep.workfiles.edges import EDGES, NODES, edge_records, node_records, read_range, write_edges, write_nodes
from prep.workfiles.pairs import CandidatePairs, read_pairs

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


def drops_in_one_process(pairs: Sequence[Path], work: Path, bits: int, out: Path) -> tuple[Digest, Array]:
    """The drops object the cluster rounds make of the pairs objects at `pairs` over `2**bits`
    ranges, written at `out`, and the sizes of every cluster: every round run here, range after
    range, on files under `work` (memory a range task's, the edges on disk). How a build makes
    the drops object again once the round tasks' records and objects are collected."""
    files = _Files(work)
    routed = [routed_pairs(read_pairs(path)) for path in pairs]
    edges = [files.written(write_edges, records) for records, _ in routed]
    nodes = [files.written(write_nodes, records) for _, records in routed]
    del routed
    for _ in range(MAX_ROUNDS):
        rounds = [star_round(read_range(edges, EDGES, bucket, bits), True) for bucket in range(1 << bits)]
        if all(settled for _, settled in rounds):
            break
        larger = [files.written(write_edges, records) for records, _ in rounds]
        del rounds
        following = [files.written(write_edges, star_round(read_range(larger, EDGES, bucket, bits), False)[0])
                     for bucket in range(1 << bits)]
        files.remove(edges + larger)
        edges = following
    else:
        raise IntegrityError(f"near-duplicate clusters did not settle in {MAX_ROUNDS} rounds: damaged pairs objects")
    drops, sizes = [], []
    for bucket in range(1 << bits):
        records, star_sizes = range_drops(read_range(edges, EDGES, bucket, bits), read_range(nodes, NODES, bucket, bits))
        drops.append(files.written(write_drops, records))
        sizes.append(star_sizes)
    files.remove(edges + nodes)
    digest = merge_drops(out, drops)
    files.remove(drops)
    return digest, np.concatenate(sizes)


class _Files:
    """Numbered scratch files under one folder."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder, self.count = folder, 0

    def written(self, writer: Callable[[Path, Array, dict[str, Any]], Digest], records: Array) -> Path:
        """A new file of `records` written by `writer`."""
        self.count += 1
        path = self.folder / f"{self.count}.records"
        writer(path, records, {})
        return path

    def remove(self, paths: Sequence[Path]) -> None:
        for path in paths:
            path.unlink(missing_ok=True)
