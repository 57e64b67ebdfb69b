"""Helpers for the near-duplicate tests: batches of texts, and documents with planted word edits."""

from __future__ import annotations

import random
from typing import Any

import numpy as np

from prep.neardup.settings import NearDupSettings
from prep.neardup.signatures import signatures

Array = np.ndarray[Any, Any]
VOCABULARY = [f"w{index}" for index in range(5000)]
DEFAULTS = NearDupSettings()


def batch(texts: list[str]) -> tuple[bytes, Array]:
    """`texts` as one UTF-8 buffer and its offsets, as a tokenize batch holds them."""
    data = [text.encode("utf-8") for text in texts]
    offsets = np.zeros(len(data) + 1, dtype=np.int64)
    np.cumsum([len(item) for item in data], out=offsets[1:])
    return b"".join(data), offsets


def signatures_of(texts: list[str], settings: NearDupSettings = DEFAULTS) -> Array:
    """The signatures of `texts`, in one batch."""
    blob, offsets = batch(texts)
    return signatures(blob, offsets, settings.ngram, settings.permutations, settings.seed)


def document(rng: random.Random, words: int) -> list[str]:
    """`words` words drawn from a 5,000-word vocabulary."""
    return [rng.choice(VOCABULARY) for _ in range(words)]


def edited(rng: random.Random, words: list[str], rate: float) -> list[str]:
    """`words` with each replaced by a fresh word (one not in the vocabulary) with probability `rate`."""
    return [f"x{rng.getrandbits(40)}" if rng.random() < rate else word for word in words]


def true_jaccard(a: list[str], b: list[str], ngram: int = 5) -> float:
    """Jaccard of two word lists' n-gram sets, computed on the words themselves."""
    first = {tuple(a[i:i + ngram]) for i in range(max(1, len(a) - ngram + 1))}
    second = {tuple(b[i:i + ngram]) for i in range(max(1, len(b) - ngram + 1))}
    return len(first & second) / len(first | second)


def planted(rng: random.Random) -> list[list[str]]:
    """Unrelated documents and originals each followed by copies edited at 0 to 12% of words, in input order."""
    docs = [document(rng, rng.randint(40, 120)) for _ in range(60)]
    for _ in range(40):
        words = document(rng, rng.randint(80, 200))
        docs.append(words)
        docs.extend(edited(rng, words, rng.choice([0.0, 0.01, 0.03, 0.08, 0.12])) for _ in range(rng.randint(1, 2)))
    return docs
