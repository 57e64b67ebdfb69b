"""A seeded pseudo-random permutation of [0, n) computed on demand: no O(n) array is stored.

Indices are encrypted with a four-round Feistel network over the smallest even power of two that
holds n, and values that land outside [0, n) are encrypted again (cycle walking) until they fall
inside; since the network is a bijection of its domain, the walk is a bijection of [0, n). The
domain is less than 4n, so a walk takes under four steps on average.
"""

from __future__ import annotations

import numpy as np

_ROUNDS = 4
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix(values: np.ndarray, key: np.uint64) -> np.ndarray:
    """A splitmix64-style finalizer of `values` keyed by `key` (uint64, wrapping)."""
    with np.errstate(over="ignore"):
        z = values + key
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


class IndexPermutation:
    """`perm[i]` for i in [0, size): a bijection fixed by (size, seed)."""

    def __init__(self, size: int, seed: int) -> None:
        if size < 0:
            raise ValueError(f"permutation size must not be negative, got {size}")
        self.size = size
        bits = max(2, (max(size, 1) - 1).bit_length())
        self._half = (bits + 1) // 2
        self._mask = np.uint64((1 << self._half) - 1)
        seeds = np.arange(_ROUNDS, dtype=np.uint64) + np.uint64(seed & 0xFFFFFFFFFFFFFFFF)
        self._keys = [np.uint64(key) for key in _mix(seeds * np.uint64(0x9E3779B97F4A7C15), np.uint64(size))]

    def _encrypt(self, values: np.ndarray) -> np.ndarray:
        half = np.uint64(self._half)
        left, right = values >> half, values & self._mask
        for key in self._keys:
            left, right = right, left ^ (_mix(right, key) & self._mask)
        return (left << half) | right

    def __call__(self, indices: np.ndarray) -> np.ndarray:
        """The images of `indices` (an integer array of values in [0, size))."""
        values = np.asarray(indices, dtype=np.uint64)
        if values.size and (int(values.max()) >= self.size or int(np.asarray(indices).min()) < 0):
            raise IndexError(f"permutation indices must lie in [0, {self.size})")
        out = self._encrypt(values)
        outside = out >= np.uint64(self.size)
        while outside.any():
            out[outside] = self._encrypt(out[outside])
            outside = out >= np.uint64(self.size)
        return out.astype(np.int64)

    def at(self, index: int) -> int:
        """The image of one index."""
        return int(self(np.asarray([index]))[0])
