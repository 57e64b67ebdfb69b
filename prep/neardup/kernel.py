"""The MinHash minimum compiled to machine code by numba (the `fast` extra), when it is installed.

numpy computes the signatures' products a chunk at a time and takes their minimum per document
with `minimum.reduceat`, about 3-5 ns a product; the compiled loop keeps a document's running
minima in one array and multiplies each shingle by every multiplier in turn, about 0.3-0.7 ns a
product here (SIMD). Both compute the same integers (a wrapping uint64 multiply, a minimum, a
shift), so which one ran never shows in a signature or a snapshot id (tests/neardup/test_kernel.py).

Loading the kernel costs a process about 1 s (numba's import and its compiled code, cached on
disk beside this module or in numba's cache folder): `signatures.minhash` uses it only for a
batch with at least `KERNEL_PRODUCTS` products, or once it is loaded, and a build's workers load
it while the driver starts (`prep.runner.tasks.prepare_worker`) when the pipeline has `[dedup.near]`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

Array = np.ndarray[Any, Any]
Kernel = Callable[[Array, Array, Array, Array], None]
KERNEL_PRODUCTS = 50_000_000
"""Products (shingles x permutations) from which a batch loads the kernel: about 0.2 s of numpy
(2 MB of text at 128 permutations); a process that has it uses it for every batch after."""


def _minima(shingle_hashes: Array, bounds: Array, multipliers: Array, out: Array) -> None:
    """out[d, i] = max(uint64) or the least `multipliers[i] * x` (mod 2^64) over the shingle
    hashes x of document d, `shingle_hashes[bounds[d]:bounds[d + 1]]`; four shingles a pass over
    the multipliers, so each running minimum is loaded and stored once per four products."""
    permutations = multipliers.shape[0]
    lows = np.empty(permutations, dtype=np.uint64)
    for document in range(bounds.shape[0] - 1):
        lows[:] = np.uint64(0xFFFFFFFFFFFFFFFF)
        at, end = bounds[document], bounds[document + 1]
        while at + 4 <= end:
            x0, x1, x2, x3 = shingle_hashes[at], shingle_hashes[at + 1], shingle_hashes[at + 2], shingle_hashes[at + 3]
            for index in range(permutations):
                a = multipliers[index]
                lows[index] = min(min(lows[index], a * x0), min(min(a * x1, a * x2), a * x3))
            at += 4
        while at < end:
            x0 = shingle_hashes[at]
            for index in range(permutations):
                lows[index] = min(lows[index], multipliers[index] * x0)
            at += 1
        out[document] = lows


@functools.cache
def compiled() -> Kernel | None:
    """The compiled `_minima`, None without numba (numpy then computes the same values)."""
    try:
        import numba
    except ImportError:
        return None
    kernel: Kernel = numba.njit(cache=True, nogil=True, boundscheck=False)(_minima)
    probe = np.empty((1, 1), dtype=np.uint64)
    kernel(np.ones(1, dtype=np.uint64), np.array([0, 1], dtype=np.int64), np.ones(1, dtype=np.uint64), probe)
    return kernel


def loaded() -> bool:
    """Whether this process has the kernel compiled or loaded already (then it costs nothing more)."""
    return compiled.cache_info().currsize > 0 and compiled() is not None
