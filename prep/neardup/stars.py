"""Connected components in partitioned rounds: the large-star and small-star operations of Kiveris
et al., "Connected components in MapReduce and beyond" (SoCC 2014), on the edges one range task
holds, and the star forest they end in.

Every edge is held by an owner, one of its two ends: a task holds the edges whose owner falls in
its range of `route_of` (a bijective mix of the document number, so ranges are balanced however
numbers cluster). Large-star needs a node's whole neighbourhood, so each edge is held by both
ends; small-star needs a node's smaller neighbours, so each edge is held by its larger end.
Alternating them ends, in O(log² n) rounds, in a forest of stars, each linking every document of
a component to the component's smallest number: the star `clusters.clusters` makes at once, the
same whatever the ranges. A task's memory is the edges its range holds, never the graph's.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from prep.errors import IntegrityError

Array = np.ndarray[Any, Any]
_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def route_of(documents: Array) -> Array:
    """The u64 a document's edges are routed by: splitmix64's finalizer, a bijection."""
    mixed = np.asarray(documents, dtype=np.uint64) + _GAMMA
    mixed = (mixed ^ (mixed >> np.uint64(30))) * _MIX1
    mixed = (mixed ^ (mixed >> np.uint64(27))) * _MIX2
    routed: Array = mixed ^ (mixed >> np.uint64(31))
    return routed


def held_both_ways(left: Array, right: Array) -> tuple[Array, Array]:
    """(owner, neighbour) of each edge held by both ends: what large-star reads."""
    return np.concatenate([left, right]), np.concatenate([right, left])


def held_by_larger(left: Array, right: Array) -> tuple[Array, Array]:
    """(owner, neighbour) of each edge held by its larger end: what small-star reads."""
    return np.maximum(left, right), np.minimum(left, right)


def large_star(owner: Array, neighbour: Array) -> tuple[Array, Array, bool]:
    """Large-star over every neighbourhood of the owners held: each neighbour larger than its owner
    is linked to the smallest of the owner and its neighbours. The new edges (left > right), and
    whether the edges held were a star forest already: each owner's neighbours all larger, or its
    one neighbour smaller (then nothing changes, and the rounds are over once every range says so)."""
    owner, neighbour, starts = adjacency(owner, neighbour)
    if not len(owner):
        return owner, neighbour, True
    group = _groups(starts, len(owner))
    smallest = np.minimum(np.minimum.reduceat(neighbour, starts), owner[starts])
    up = neighbour > owner
    below = np.add.reduceat((~up).astype(np.int64), starts)
    degree = np.diff(np.append(starts, len(owner)))
    settled = bool(((below == 0) | ((degree == 1) & (below == 1))).all())
    return neighbour[up], smallest[group[up]], settled


def small_star(owner: Array, neighbour: Array) -> tuple[Array, Array]:
    """Small-star over the smaller neighbours held by each owner: the owner and each of them are
    linked to the smallest of them all. The new edges (left > right)."""
    owner, neighbour, starts = adjacency(owner, neighbour)
    if not len(owner):
        return owner, neighbour
    group = _groups(starts, len(owner))
    smallest = np.minimum(np.minimum.reduceat(neighbour, starts), owner[starts])
    moved = neighbour != smallest[group]
    left = np.concatenate([neighbour[moved], owner[starts]])
    right = np.concatenate([smallest[group][moved], smallest])
    linked = left != right
    return left[linked], right[linked]


def star_leaves(owner: Array, neighbour: Array) -> tuple[Array, Array, Array]:
    """The stars of a finished forest, as a range holds them both ways: each owner that is a leaf
    with its centre (its one, smaller, neighbour), and the size of each star centred on an owner
    held (its leaves and itself). IntegrityError when the edges are not a star forest."""
    owner, neighbour, starts = adjacency(owner, neighbour)
    degree = np.diff(np.append(starts, len(owner)))
    below = np.add.reduceat((neighbour < owner).astype(np.int64), starts) if len(owner) else degree
    leaf = (degree == 1) & (below == 1)
    centre = below == 0
    if not bool((leaf | centre).all()):
        raise IntegrityError("the cluster rounds ended on edges that are not stars: a damaged edges object")
    return owner[starts[leaf]], neighbour[starts[leaf]], degree[centre] + 1


def adjacency(owner: Array, neighbour: Array) -> tuple[Array, Array, Array]:
    """The distinct edges (owner, neighbour), no loops, sorted by owner then neighbour, and where
    each owner's run starts."""
    owner, neighbour = np.asarray(owner, dtype=np.uint64), np.asarray(neighbour, dtype=np.uint64)
    linked = owner != neighbour
    owner, neighbour = owner[linked], neighbour[linked]
    order = np.lexsort((neighbour, owner))
    owner, neighbour = owner[order], neighbour[order]
    fresh = np.ones(len(owner), dtype=bool)
    fresh[1:] = (owner[1:] != owner[:-1]) | (neighbour[1:] != neighbour[:-1])
    owner, neighbour = owner[fresh], neighbour[fresh]
    first = np.ones(len(owner), dtype=bool)
    first[1:] = owner[1:] != owner[:-1]
    return owner, neighbour, np.flatnonzero(first)


def _groups(starts: Array, count: int) -> Array:
    """Each record's owner run, from where the runs start."""
    marks = np.zeros(count, dtype=np.int64)
    marks[starts] = 1
    groups: Array = np.cumsum(marks) - 1
    return groups
