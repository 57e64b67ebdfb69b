"""The near-duplicate signatures' compiled loops (prep.neardup.native, numba from the `fast`
extra), when numba is installed, and when a batch is worth loading them.

numpy signs a batch in whole-array passes: the words, their hashes, the shingles and the MinHash
products each an array of the batch's size, the minimum taken per document with
`minimum.reduceat` (about 3-5 ns a product). The compiled loops lower the batch where no more
normalization is needed (`lowered`, prep.neardup.normalization), then take each document's
normalized text to its signature in one pass (whitespace found 64 bytes a step, words hashed 8
bytes a load, each shingle's hash rolled on from the one before, folded into the running minima
4,096 at a time, about 0.1-0.2 ns a product, SIMD), or fold given shingle hashes alone
(`minima`); `verify`'s exact Jaccards take each document's shingle hashes by the same pass
(`pair_jaccards`). Each computes what numpy computes (the same integers: wrapping uint64
arithmetic, a minimum, a shift; the same floats: one division of two counts), so which one ran
never shows in a signature or a snapshot id (tests/neardup/test_kernel.py,
tests/neardup/test_normalization.py).

Loading them costs a process about 1 s (numba's import and its compiled code, cached on disk
beside prep.neardup.native or in numba's cache folder): `signatures` uses them only for a batch of
at least `KERNEL_PRODUCTS` products, or once loaded, and a build's workers load them while the
driver starts (`prep.runner.tasks.prepare_worker`) when the pipeline has `[dedup.near]`.
"""

from __future__ import annotations

import functools
import sys
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
KERNEL_TEXT_BYTES = 2 * 2**20
"""Text from which `verify`'s pair Jaccards load the kernels (numpy shingles and compares about
10 MB/s of short documents, so about 0.2 s of it)."""


@dataclass(frozen=True)
class Kernels:
    """The compiled loops (prep.neardup.native)."""

    minima: Callable[[Array, Array, Array, Array], None]
    """minima(shingle_hashes, bounds, multipliers, out): out[d, i] (uint64) = the least
    multipliers[i] * x over document d's shingle hashes, max(uint64) for none."""
    text_minima: Callable[[Array, Array, Array, int, Array, Array], None]
    """text_minima(text, lanes, offsets, ngram, multipliers, out): out[d, i] (uint32) = document
    d's signature from its normalized UTF-8; `lanes[i]` the 8 bytes at offset i (8 zero bytes pad)."""
    lowered: Callable[[Array, Array, Array, Array, Array, Array, Array, Array, int, int], tuple[int, int, int]]
    """lowered(text, lanes, offsets, whole, table, out, out_lanes, segments, first, at): the batch
    lowercased into `out` where a character needs no more, the stretches Python must normalize
    listed (prep.neardup.normalization.compiled_normalized)."""
    pair_jaccards: Callable[[Array, Array, Array, int, Array, Array, Array], None]
    """pair_jaccards(text, lanes, offsets, ngram, left, right, out): out[i] (float64) = the exact
    Jaccard of normalized documents left[i] and right[i] on their distinct shingle hashes."""


@functools.cache
def compiled() -> Kernels | None:
    """The compiled loops, loaded or compiled once a process; None without numba, or when numba
    cannot store what it compiled (numpy then computes the same values, slower: said on stderr)."""
    try:
        from prep.neardup import native
    except ImportError:
        return None
    kernels = Kernels(native.minima, native.text_minima, native.lowered, native.pair_jaccards)
    try:
        _warm(kernels)
    except OSError as exc:  # Hazard: numba writes each compiled loop to its cache folder; a full disk there
        print(f"prep: warning: near-duplicate kernels unavailable, numpy computes the same values, slower ({exc})",
              file=sys.stderr)
        return None
    return kernels


def _warm(kernels: Kernels) -> None:
    """Compile (or load) each loop for the argument types its callers pass."""
    ones = np.ones(1, dtype=np.uint64)
    kernels.minima(ones, np.array([0, 1], dtype=np.int64), ones, np.empty((1, 1), dtype=np.uint64))
    for data in (b"a b", b""):  # the argument types the callers pass (an empty text's lanes are contiguous)
        text = np.frombuffer(data + bytes(8), dtype=np.uint8)
        bounds, out = np.array([0, len(data)], dtype=np.int64), np.zeros(len(text), dtype=np.uint8)
        kernels.lowered(text, lanes(text), bounds, np.zeros(1, dtype=np.bool_), np.zeros(1, dtype=np.uint32), out,
                        lanes(out), np.empty((1, 2), dtype=np.int64), 0, 0)
        kernels.text_minima(out, lanes(out), bounds, 2, ones, np.empty((1, 1), dtype=np.uint32))
        first = np.zeros(1, dtype=np.int64)
        kernels.pair_jaccards(out, lanes(out), bounds, 2, first, first, np.empty(1, dtype=np.float64))


def loaded() -> bool:
    """Whether this process has the kernels compiled or loaded already (then they cost nothing more)."""
    return compiled.cache_info().currsize > 0 and compiled() is not None


def chosen(products: int) -> Kernels | None:
    """The kernels for a batch of `products` (shingles x permutations), when they are loaded or the
    batch repays loading them; None for numpy."""
    return compiled() if loaded() or products >= KERNEL_PRODUCTS else None


def chosen_for_text(size: int) -> Kernels | None:
    """The kernels for `verify`'s pair Jaccards over `size` bytes of text, when they are loaded or
    the text repays loading them; None for numpy."""
    return compiled() if loaded() or size >= KERNEL_TEXT_BYTES else None


def lanes(padded: Array) -> Array:
    """The little-endian uint64 at every byte offset of `padded` (uint8, its last 8 bytes padding):
    a view, one unaligned load each."""
    return np.ndarray(shape=(len(padded) - 8,), dtype="<u8", buffer=padded, strides=(1,))
