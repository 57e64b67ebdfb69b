"""The compiled MinHash kernel: the same integers as numpy for any shingles and document bounds,
used from a batch's size on or once loaded, and never a difference in a signature."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from prep.neardup import kernel
from prep.neardup.kernel import Array
from prep.neardup.signatures import hash_family, minhash, numpy_minhash, shingle_hashes, signatures
from tests.neardup.neardupsupport import batch, document

pytestmark = pytest.mark.skipif(kernel.compiled() is None, reason="numba is not installed (the `fast` extra)")

EDGES = st.sampled_from([0, 1, 2**32 - 1, 2**32, 2**63, 2**64 - 1])


@given(st.lists(st.lists(st.integers(0, 2**64 - 1) | EDGES, max_size=12), max_size=8), st.integers(1, 40),
       st.integers(0, 2**32))
def test_the_kernel_computes_what_numpy_computes(documents: list[list[int]], permutations: int, seed: int) -> None:
    hashes = np.array([value for shingles in documents for value in shingles], dtype=np.uint64)
    bounds = np.concatenate([[0], np.cumsum([len(shingles) for shingles in documents])]).astype(np.int64)
    family = hash_family(seed, permutations)
    compiled = kernel.compiled()
    assert compiled is not None
    lows = np.empty((len(documents), permutations), dtype=np.uint64)
    compiled(hashes, bounds, family.multipliers, lows)
    assert np.array_equal((lows >> np.uint64(32)).astype(np.uint32), numpy_minhash(hashes, bounds, family))


def _texts(count: int) -> list[str]:
    rng = random.Random(7)
    return [" ".join(document(rng, rng.randrange(0, 400))) for _ in range(count)] + [""]


def test_signatures_are_the_same_with_the_kernel_or_without(monkeypatch: pytest.MonkeyPatch) -> None:
    blob, offsets = batch(_texts(300))
    monkeypatch.setattr(kernel, "KERNEL_PRODUCTS", 2**62)
    monkeypatch.setattr(kernel, "loaded", lambda: False)
    by_numpy = signatures(blob, offsets, 5, 128, 3)
    monkeypatch.setattr(kernel, "KERNEL_PRODUCTS", 0)
    by_kernel = signatures(blob, offsets, 5, 128, 3)
    assert np.array_equal(by_numpy, by_kernel)
    assert (by_kernel == 0xFFFFFFFF).all(axis=1).any()  # an empty document is in the batch


def test_a_small_batch_stays_on_numpy_until_the_kernel_is_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = kernel.compiled()
    assert real is not None

    def counting(*args: Array) -> None:
        calls.append(len(args[0]))
        real(*args)

    hashes, bounds = shingle_hashes(*batch(_texts(20)), 5)
    family = hash_family(0, 16)
    monkeypatch.setattr(kernel, "compiled", lambda: counting)
    monkeypatch.setattr(kernel, "loaded", lambda: False)
    small = minhash(hashes, bounds, family)
    assert calls == []
    monkeypatch.setattr(kernel, "KERNEL_PRODUCTS", len(hashes) * 16)
    assert np.array_equal(minhash(hashes, bounds, family), small)
    assert calls == [len(hashes)]
    monkeypatch.setattr(kernel, "KERNEL_PRODUCTS", 2**62)
    monkeypatch.setattr(kernel, "loaded", lambda: True)
    assert np.array_equal(minhash(hashes, bounds, family), small)
    assert calls == [len(hashes)] * 2
