"""Order keys: a document's 128-bit key is a keyed permutation of its 128-bit text hash, and the
key's top bits name its bucket. Tokenize lays an intermediate's documents out in key order with
them; route, order and the history commands place documents by them."""

from __future__ import annotations

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def splitmix64(values: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer of each uint64: a bijection that mixes every bit into every other."""
    with np.errstate(over="ignore"):
        z = values + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def order_keys(hashes: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The (hi, lo) 128-bit order key of each (n, 2) text hash: three Feistel rounds keyed by
    the seed, so distinct hashes get distinct keys and the order is a pure function of both."""
    rounds = splitmix64(np.array([seed, seed ^ 0x5851F42D4C957F2D, seed ^ 0x14057B7EF767814F], dtype=np.uint64))
    left, right = hashes[:, 0].astype(np.uint64), hashes[:, 1].astype(np.uint64)
    left = left ^ splitmix64(right ^ rounds[0])
    right = right ^ splitmix64(left ^ rounds[1])
    left = left ^ splitmix64(right ^ rounds[2])
    return left, right


def bucket_of(key_hi: np.ndarray, bits: int) -> np.ndarray:
    """The bucket of each key: its top `bits` bits (all keys are in bucket 0 when bits is 0)."""
    if bits == 0:
        return np.zeros(len(key_hi), dtype=np.int64)
    return (key_hi >> np.uint64(64 - bits)).astype(np.int64)
