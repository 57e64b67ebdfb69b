"""Clusters: the union-find's result is independent of pair order, merges equal one pass, chains join."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from tests.neardup.unionfind import Clusters, clusters, merge

PAIRS = st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), max_size=40)


def _of(pairs: list[tuple[int, int]]) -> Clusters:
    left = np.array([a for a, _ in pairs], dtype=np.int64)
    right = np.array([b for _, b in pairs], dtype=np.int64)
    return clusters(left, right)


def _same(first: Clusters, second: Clusters) -> bool:
    return np.array_equal(first.documents, second.documents) and \
        np.array_equal(first.representatives, second.representatives)


def _expected(pairs: list[tuple[int, int]]) -> dict[int, int]:
    """Each touched document's smallest connected document, by a plain dict union-find."""
    parent: dict[int, int] = {}

    def root(x: int) -> int:
        while parent.setdefault(x, x) != x:
            x = parent[x]
        return x

    for a, b in pairs:
        ra, rb = root(a), root(b)
        parent[max(ra, rb)] = min(ra, rb)
    return {x: root(x) for x in parent}


@given(PAIRS, st.randoms(use_true_random=False))
def test_pair_order_does_not_change_the_result(pairs: list[tuple[int, int]], rng: object) -> None:
    shuffled = [(b, a) if rng.random() < 0.5 else (a, b) for a, b in pairs]  # type: ignore[attr-defined]
    rng.shuffle(shuffled)  # type: ignore[attr-defined]
    result = _of(pairs)
    assert _same(result, _of(shuffled))
    assert dict(zip(result.documents.tolist(), result.representatives.tolist())) == _expected(pairs)


@given(PAIRS, PAIRS, PAIRS)
def test_merging_partial_results_equals_one_pass(first: list[tuple[int, int]], second: list[tuple[int, int]],
                                                 third: list[tuple[int, int]]) -> None:
    whole = _of(first + second + third)
    assert _same(merge(merge(_of(first), _of(second)), _of(third)), whole)
    assert _same(merge(_of(third), merge(_of(second), _of(first))), whole)


def test_chains_join_and_the_first_document_represents() -> None:
    result = _of([(7, 3), (3, 9), (9, 12), (20, 21), (5, 5)])
    assert dict(zip(result.documents.tolist(), result.representatives.tolist())) == \
        {3: 3, 5: 5, 7: 3, 9: 3, 12: 3, 20: 20, 21: 20}
    assert result.duplicates().tolist() == [7, 9, 12, 21]
    assert result.representative_of(np.array([12, 4, 21, 3])).tolist() == [3, 4, 20, 3]
    assert _of([]).representative_of(np.array([2])).tolist() == [2]


def test_a_long_chain_in_any_order() -> None:
    rng = np.random.default_rng(1)
    nodes = rng.permutation(100_000).astype(np.int64) * 3
    order = rng.permutation(len(nodes) - 1)
    result = clusters(nodes[:-1][order], nodes[1:][order])
    assert len(result.documents) == len(nodes) and (result.representatives == 0).all()
