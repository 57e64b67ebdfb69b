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


_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)
_WORD = (1 << 64) - 1
_TAIL = 16  # a walk with this few values left ends in Python ints: a numpy call costs more than an element then


def _mix(values: np.ndarray, key: np.uint64) -> np.ndarray:
    """A splitmix64-style finalizer of `values` (a 1-D uint64 array) keyed by `key` (wrapping: numpy's
    integer array arithmetic wraps without a warning, so no errstate, which cost more than the mix)."""
    z = values + key
    z ^= z >> _S30
    z *= _M1
    z ^= z >> _S27
    z *= _M2
    z ^= z >> _S31
    return z


def _mix_int(value: int, key: int) -> int:
    """_mix of one value, in Python ints (the same bits)."""
    z = (value + key) & _WORD
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _WORD
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _WORD
    return z ^ (z >> 31)


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
        self._int_keys = [int(key) for key in self._keys]  # for walks in Python ints

    def _encrypt(self, values: np.ndarray) -> np.ndarray:
        half = np.uint64(self._half)
        left, right = values >> half, values & self._mask
        for key in self._keys:
            mixed = _mix(right, key)
            mixed &= self._mask
            mixed ^= left
            left, right = right, mixed
        return (left << half) | right

    def _walk_one(self, value: int) -> int:
        """The walk of one value outside [0, size), in Python ints, until it falls inside."""
        half, mask, keys = self._half, (1 << self._half) - 1, self._int_keys
        while value >= self.size:
            left, right = value >> half, value & mask
            for key in keys:
                left, right = right, left ^ (_mix_int(right, key) & mask)
            value = (left << half) | right
        return value

    def __call__(self, indices: np.ndarray) -> np.ndarray:
        """The images of `indices` (an integer array of values in [0, size))."""
        shape = np.shape(indices)
        values = np.asarray(indices, dtype=np.uint64).reshape(-1)  # 1-D: a 0-d array's arithmetic is scalar and warns
        if values.size and (int(values.max()) >= self.size or int(np.asarray(indices).min()) < 0):
            raise IndexError(f"permutation indices must lie in [0, {self.size})")
        size = np.uint64(self.size)
        out = self._encrypt(values)
        todo = np.flatnonzero(out >= size)
        while len(todo) > _TAIL:  # walk only the values still outside [0, size)
            walked = self._encrypt(out[todo])
            out[todo] = walked
            todo = todo[walked >= size]
        if len(todo):
            out[todo] = [self._walk_one(value) for value in out[todo].tolist()]
        return out.astype(np.int64).reshape(shape)

    def at(self, index: int) -> int:
        """The image of one index."""
        return int(self(np.asarray([index]))[0])
