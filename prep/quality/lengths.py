"""The distribution of tokens per written document: exact counts of every length below
EXACT_BELOW, and counts by octave (log2 bucket) above, so that the median is exact wherever a
check can ask for it and the whole distribution stays a few kilobytes however large the corpus.

Tokens per document are the document's own tokens, without the EOS the .bin adds after each.
Octave k (k >= 1) holds the lengths n with n.bit_length() == k, i.e. 2**(k-1) <= n < 2**k;
octave 0 holds the empty documents (n == 0)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

EXACT_BELOW = 1024
"""Lengths below this are counted one by one: a median below it is exact (a power of two, so the
lengths above it fill whole octaves)."""
SHORT_BELOW = 16
"""A document with fewer tokens than this is very short (`stats.tokens_per_document.short`)."""


@dataclass(frozen=True)
class TokenLengths:
    """How many documents have each token length: `exact[n]` for n < EXACT_BELOW, `octaves[k]`
    for the longer lengths of octave k (entries below octave EXACT_BELOW.bit_length() are 0)."""

    exact: tuple[int, ...] = ()
    octaves: tuple[int, ...] = ()

    def __add__(self, other: TokenLengths) -> TokenLengths:
        """The distribution of both sets of documents."""
        return TokenLengths(_add(self.exact, other.exact), _add(self.octaves, other.octaves))

    @property
    def documents(self) -> int:
        return sum(self.exact) + sum(self.octaves)

    def histogram(self) -> list[tuple[int, int, int]]:
        """(min, max, documents) of every octave from 0 to the highest one holding a document."""
        counts = list(self.octaves)
        for length, count in enumerate(self.exact):
            octave = length.bit_length()
            counts.extend([0] * (octave + 1 - len(counts)))
            counts[octave] += count
        counts = list(_trimmed(counts))
        return [(0 if k == 0 else 1 << (k - 1), 0 if k == 0 else (1 << k) - 1, count) for k, count in enumerate(counts)]

    def below(self, limit: int) -> int:
        """Documents with fewer than `limit` tokens (`limit` <= EXACT_BELOW)."""
        if limit > EXACT_BELOW:
            raise ValueError(f"lengths are exact below {EXACT_BELOW} only, not {limit}")
        return sum(self.exact[:limit])

    def median(self) -> tuple[int, int]:
        """The lower median (the length of the document at rank ceil(n / 2) by length) as a
        (min, max) range: a single length below EXACT_BELOW, else its octave's bounds; (0, 0)
        for no documents."""
        rank = (self.documents + 1) // 2
        seen = 0
        for length, count in enumerate(self.exact):
            seen += count
            if count and seen >= rank:
                return length, length
        for octave, count in enumerate(self.octaves):
            seen += count
            if count and seen >= rank:
                return 1 << (octave - 1), (1 << octave) - 1
        return 0, 0

    def to_json(self) -> dict[str, list[int]]:
        return {"exact": list(self.exact), "octaves": list(self.octaves)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TokenLengths:
        exact, octaves = (tuple(int(count) for count in data[name]) for name in ("exact", "octaves"))
        if len(exact) > EXACT_BELOW or any(octaves[:EXACT_BELOW.bit_length()]) or min((*exact, *octaves, 0)) < 0:
            raise ValueError("token lengths out of their ranges")
        return cls(exact, octaves)


def measure(n_tokens: np.ndarray) -> TokenLengths:
    """The distribution of the token counts `n_tokens` (a numpy integer array), vectorized."""
    import numpy as np

    lengths = np.asarray(n_tokens, dtype=np.uint64)
    short = lengths < EXACT_BELOW
    exact = np.bincount(lengths[short].astype(np.int64), minlength=0)
    longer = lengths[~short]
    octaves = np.bincount(_bit_lengths(longer), minlength=0) if len(longer) else np.zeros(0, dtype=np.int64)
    return TokenLengths(_trimmed(exact.tolist()), _trimmed(octaves.tolist()))


def _bit_lengths(values: np.ndarray) -> np.ndarray:
    """n.bit_length() of each (positive) value, exactly: the float estimate corrected by one way or the other."""
    import numpy as np

    _, estimate = np.frexp(values.astype(np.float64))
    bits = estimate.astype(np.int64)
    too_high = (bits > 0) & ((values >> np.maximum(bits - 1, 0).astype(np.uint64)) == 0)
    corrected: np.ndarray = bits - too_high.astype(np.int64)
    return corrected


def _add(first: Sequence[int], second: Sequence[int]) -> tuple[int, ...]:
    longer, shorter = (first, second) if len(first) >= len(second) else (second, first)
    return tuple(count + (shorter[index] if index < len(shorter) else 0) for index, count in enumerate(longer))


def _trimmed(counts: Sequence[int]) -> tuple[int, ...]:
    """`counts` without trailing zeros."""
    end = len(counts)
    while end and not counts[end - 1]:
        end -= 1
    return tuple(int(count) for count in counts[:end])
