"""The near-duplicate tests' and benchmark's oracle for clusters: a vectorized union-find over
candidate pairs held at once, and merges (a build joins clusters in partitioned rounds instead,
prep/neardup/stars.py, and must end in what this gives).

A cluster's representative is its smallest document number, its first document in input order
(the one dedup keeps). Components do not depend on the order pairs come in, so neither does the
result; merging the results of two sets of pairs gives the result of all the pairs at once.
Memory is O(documents the pairs touch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

Array = np.ndarray[Any, Any]


@dataclass(frozen=True, eq=False)
class Clusters:
    """`documents` (int64, sorted, distinct: those some pair touched) and each one's cluster
    representative (`representatives[i] <= documents[i]`)."""

    documents: Array
    representatives: Array

    def representative_of(self, documents: Array) -> Array:
        """The representative of each of `documents`; a document no pair touched is its own."""
        documents = np.asarray(documents, dtype=np.int64)
        if not len(self.documents):
            return documents.copy()
        found = np.minimum(np.searchsorted(self.documents, documents), len(self.documents) - 1)
        return np.where(self.documents[found] == documents, self.representatives[found], documents)

    def duplicates(self) -> Array:
        """The documents that are not their cluster's representative: those dedup drops."""
        dropped: Array = self.documents[self.representatives != self.documents]
        return dropped


def clusters(left: Array, right: Array) -> Clusters:
    """The clusters that pairs (left[i], right[i]) of document numbers join."""
    ends = np.concatenate([np.asarray(left, dtype=np.int64), np.asarray(right, dtype=np.int64)])
    documents, nodes = _numbered(ends)
    parent = _components(nodes[:len(ends) // 2], nodes[len(ends) // 2:], len(documents))
    return Clusters(documents, documents[parent])


def _numbered(values: Array) -> tuple[Array, Array]:
    """The distinct `values`, sorted, and each value's place among them (one argsort: numpy's
    unique and searchsorted are several times slower on millions)."""
    order = np.argsort(values)
    ordered = values[order]
    new = np.ones(len(values), dtype=bool)
    new[1:] = ordered[1:] != ordered[:-1]
    places = np.empty(len(values), dtype=np.int64)
    places[order] = np.cumsum(new) - 1
    return ordered[new], places


def merge(first: Clusters, second: Clusters) -> Clusters:
    """The clusters of the pairs of both: each result is a star of pairs (document, representative)."""
    return clusters(np.concatenate([first.documents, second.documents]),
                    np.concatenate([first.representatives, second.representatives]))


def _components(u: Array, v: Array, count: int) -> Array:
    """Each node's smallest connected node, for edges (u[i], v[i]) over nodes 0 .. count - 1: hook
    every edge's larger root under its smaller one, then shortcut every path, until no edge joins
    two roots. parent[x] <= x throughout, so a component's root is its smallest node."""
    parent = np.arange(count, dtype=np.int64)
    while True:
        pu, pv = parent[u], parent[v]
        apart = pu != pv
        if not apart.any():
            return parent
        np.minimum.at(parent, np.maximum(pu[apart], pv[apart]), np.minimum(pu[apart], pv[apart]))
        _shortcut(parent)


def _shortcut(parent: Array) -> None:
    """Point every node at its root (pointer jumping: halves every path each pass)."""
    while True:
        grand = parent[parent]
        if np.array_equal(grand, parent):
            return
        parent[:] = grand
