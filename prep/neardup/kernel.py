"""The near-duplicate signatures' compiled loops (prep.neardup.native, numba from the `fast`
extra), when numba is installed, and when a batch is worth loading them.

numpy signs a batch in whole-array passes: the words, their hashes, the shingles and the MinHash
products each an array of the batch's size, the minimum taken per document with
`minimum.reduceat` (about 3-5 ns a product). The compiled loops take each document's normalized
text to its signature in one pass (whitespace found 8 bytes at a time, words hashed 8 bytes a
load, each shingle's hash rolled on from the one before, folded into the running minima 4,096 at
a time, about 0.25-0.5 ns a product, SIMD), or fold given shingle hashes alone (`minima`). Both compute the same
integers (wrapping uint64 arithmetic, a minimum, a shift), so which one ran never shows in a
signature or a snapshot id (tests/neardup/test_kernel.py).

Loading them costs a process about 1 s (numba's import and its compiled code, cached on disk
beside prep.neardup.native or in numba's cache folder): `signatures` uses them only for a batch of
at least `KERNEL_PRODUCTS` products, or once loaded, and a build's workers load them while the
driver starts (`prep.runner.tasks.prepare_worker`) when the pipeline has `[dedup.near]`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

Array = np.ndarray[Any, Any]
KERNEL_PRODUCTS = 50_000_000
"""Products (shingles x permutations) from which a batch loads the kernels: about 0.2 s of numpy
(2 MB of text at 128 permutations); a process that has them uses them for every batch after."""
BYTES_A_SHINGLE = 6
"""About one shingle (one word) in this many bytes of text: a batch's products estimated from its size."""


@dataclass(frozen=True)
class Kernels:
    """The compiled loops (prep.neardup.native)."""

    minima: Callable[[Array, Array, Array, Array], None]
    """minima(shingle_hashes, bounds, multipliers, out): out[d, i] (uint64) = the least
    multipliers[i] * x over document d's shingle hashes, max(uint64) for none."""
    text_minima: Callable[[Array, Array, Array, int, Array, Array], None]
    """text_minima(text, lanes, offsets, ngram, multipliers, out): out[d, i] (uint32) = document
    d's signature from its normalized UTF-8; `lanes[i]` the 8 bytes at offset i (8 zero bytes pad)."""


@functools.cache
def compiled() -> Kernels | None:
    """The compiled loops, loaded or compiled once a process; None without numba (numpy then
    computes the same values)."""
    try:
        from prep.neardup import native
    except ImportError:
        return None
    kernels = Kernels(native.minima, native.text_minima)
    ones = np.ones(1, dtype=np.uint64)
    kernels.minima(ones, np.array([0, 1], dtype=np.int64), ones, np.empty((1, 1), dtype=np.uint64))
    text = np.frombuffer(b"a b" + bytes(8), dtype=np.uint8)
    kernels.text_minima(text, lanes(text), np.array([0, 3], dtype=np.int64), 2, ones, np.empty((1, 1), dtype=np.uint32))
    return kernels


def loaded() -> bool:
    """Whether this process has the kernels compiled or loaded already (then they cost nothing more)."""
    return compiled.cache_info().currsize > 0 and compiled() is not None


def chosen(products: int) -> Kernels | None:
    """The kernels for a batch of `products` (shingles x permutations), when they are loaded or the
    batch repays loading them; None for numpy."""
    return compiled() if loaded() or products >= KERNEL_PRODUCTS else None


def lanes(padded: Array) -> Array:
    """The little-endian uint64 at every byte offset of `padded` (uint8, its last 8 bytes padding):
    a view, one unaligned load each."""
    return np.ndarray(shape=(len(padded) - 8,), dtype="<u8", buffer=padded, strides=(1,))
