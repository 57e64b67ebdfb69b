"""The cluster rounds' stars: alternating large-star and small-star over any number of ranges ends
in one star per component, centred on its smallest document, as a union-find of all the pairs at
once gives; large-star says settled exactly on star forests; a forest that is not stars is refused."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prep.errors import IntegrityError
from prep.neardup.stars import (
    held_both_ways,
    held_by_larger,
    large_star,
    route_of,
    small_star,
    star_leaves,
)
from tests.neardup.unionfind import clusters

Array = np.ndarray[Any, Any]
EDGES = st.lists(st.tuples(st.integers(0, 60), st.integers(0, 60)), max_size=80)


def ranges(owner: Array, neighbour: Array, bits: int) -> list[tuple[Array, Array]]:
    """The edges each of `2**bits` ranges holds, by the top bits of the owner's route."""
    bucket = (route_of(owner) >> np.uint64(64 - bits)).astype(np.int64) if bits else np.zeros(len(owner), dtype=np.int64)
    return [(owner[bucket == index], neighbour[bucket == index]) for index in range(1 << bits)]


def rounds(left: Array, right: Array, bits: int) -> tuple[dict[int, int], list[int], int]:
    """Leaf -> centre, the star sizes and the pairs of rounds taken, the rounds run range by range."""
    held = ranges(*held_both_ways(left, right), bits)
    count = 0
    while True:
        count += 1
        after = [large_star(owner, neighbour) for owner, neighbour in held]
        if all(settled for _, _, settled in after):
            break
        larger = ranges(*held_by_larger(np.concatenate([a for a, _, _ in after]),
                                        np.concatenate([b for _, b, _ in after])), bits)
        small = [small_star(owner, neighbour) for owner, neighbour in larger]
        held = ranges(*held_both_ways(np.concatenate([a for a, _ in small]), np.concatenate([b for _, b in small])), bits)
    stars = [star_leaves(owner, neighbour) for owner, neighbour in held]
    leaves = {int(a): int(b) for leaf, centre, _ in stars for a, b in zip(leaf, centre)}
    return leaves, sorted(int(size) for _, _, sizes in stars for size in sizes), count


def as_arrays(edges: list[tuple[int, int]]) -> tuple[Array, Array]:
    """The edges as two uint64 arrays, spread over the number space as global numbers are."""
    spread = np.array([a for a, _ in edges] + [b for _, b in edges], dtype=np.uint64) * np.uint64(0x10001) << np.uint64(8)
    return spread[:len(edges)], spread[len(edges):]


@settings(max_examples=100)
@given(EDGES, st.integers(0, 4))
def test_the_rounds_over_any_ranges_end_in_the_union_finds_clusters(edges: list[tuple[int, int]], bits: int) -> None:
    left, right = as_arrays(edges)
    joined = clusters(left.astype(np.int64), right.astype(np.int64))
    dropped = joined.duplicates()
    leaves, sizes, _ = rounds(left, right, bits)
    assert leaves == dict(zip(dropped.tolist(), joined.representative_of(dropped).tolist()))
    _, members = np.unique(joined.representatives[joined.representatives != joined.documents], return_counts=True)
    assert sizes == sorted((members + 1).tolist())


def test_a_long_path_settles_in_few_rounds() -> None:
    """The worst shape for label propagation (a path, its numbers shuffled) takes O(log² n) rounds."""
    order = np.random.default_rng(3).permutation(20_000).astype(np.uint64)
    leaves, sizes, count = rounds(order[:-1], order[1:], 2)
    assert sizes == [20_000] and set(leaves.values()) == {0} and len(leaves) == 19_999
    assert count <= 20


@given(EDGES)
def test_large_star_is_settled_exactly_on_star_forests_and_then_changes_nothing(edges: list[tuple[int, int]]) -> None:
    left, right = as_arrays(edges)
    owner, neighbour = held_both_ways(left, right)
    new_left, new_right, settled = large_star(owner, neighbour)
    distinct = {(min(a, b), max(a, b)) for a, b in zip(left.tolist(), right.tolist()) if a != b}
    lower: dict[int, set[int]] = {}
    upper: dict[int, set[int]] = {}
    for a, b in distinct:
        lower.setdefault(b, set()).add(a)
        upper.setdefault(a, set()).add(b)
    stars = all(len(lower[node]) == 1 and node not in upper for node in lower)
    assert settled == stars
    if settled:
        assert {(int(b), int(a)) for a, b in zip(new_left, new_right)} == distinct


def test_small_star_links_each_node_and_its_smaller_neighbours_to_the_smallest() -> None:
    owner, neighbour = held_by_larger(np.array([7, 3, 9], dtype=np.uint64), np.array([5, 7, 7], dtype=np.uint64))
    left, right = small_star(owner, neighbour)
    assert sorted(zip(left.tolist(), right.tolist())) == [(5, 3), (7, 3), (9, 7)]


def test_a_forest_that_is_not_stars_is_refused() -> None:
    owner, neighbour = held_both_ways(np.array([1, 2], dtype=np.uint64), np.array([2, 3], dtype=np.uint64))
    with pytest.raises(IntegrityError, match="not stars"):
        star_leaves(owner, neighbour)


def test_the_route_is_a_bijection_that_spreads_consecutive_numbers() -> None:
    numbers = np.arange(1 << 16, dtype=np.uint64) | np.uint64(7 << 32)
    routes = route_of(numbers)
    assert len(np.unique(routes)) == len(numbers)
    counts = np.bincount((routes >> np.uint64(60)).astype(np.int64), minlength=16)
    assert counts.min() > 0.8 * len(numbers) / 16
