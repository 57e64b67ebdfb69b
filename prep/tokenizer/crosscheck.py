"""The cross-check: a fast backend's tokens for a deterministic sample re-encoded by the reference.

The sample is bounded by bytes, since the reference is ~100x slower than gigatoken; it favours
documents with unusual characters, where backends disagree if they ever do, and always keeps
some ordinary ones. docs/tokenizers.md gives the measurements behind the default budget.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from prep.errors import TokenizerError
from prep.tokenizer import contains_special
from prep.tokenizer.backends import Backend, ReferenceBackend
from prep.tokenizer.spans import character_counts, documents_containing, offsets_of

DEFAULT_BUDGET_FRACTION = 0.0005
MIN_BUDGET_BYTES = 4 << 10
MAX_BUDGET_BYTES = 256 << 10
# Regular-expression checks run at ~15 MB/s, so only this many budgets' worth of documents get
# them; the cheap checks (non-ASCII, CR, special spellings) run on every document.
POOL_FACTOR = 2
ORDINARY_SHARE = 0.25

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
_LONG_RUN = re.compile(r"\s{32}|\d{16}|\S{100}")
# The opening of most chat/control special tokens, for spellings the given list misses.
_SPECIAL_LIKE = "<|"


@dataclass(frozen=True)
class CrossCheckReport:
    """How much a cross-check compared: documents and their UTF-8 bytes."""

    documents: int
    bytes: int


def sample_budget(batch_bytes: int) -> int:
    """The default cross-check budget for a batch: 0.2% of its bytes, within 16 KiB .. 256 KiB."""
    return min(MAX_BUDGET_BYTES, max(MIN_BUDGET_BYTES, int(batch_bytes * DEFAULT_BUDGET_FRACTION)))


def utf8_size(text: str) -> int:
    """Bytes of `text` in UTF-8 (no encoding needed for ASCII, which CPython flags)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def _cheap_score(text: str, others: tuple[str, ...]) -> int:
    """Unusual kinds found at memory speed: non-ASCII (O(1) in CPython), CR, special spellings
    (the generic one or `others`)."""
    score = 0 if text.isascii() else 1
    if "\r" in text:
        score += 1
    # A one-character search runs at memchr speed, several times faster than a two-character one.
    if ("|" in text and _SPECIAL_LIKE in text) or contains_special(text, others):
        score += 1
    return score


def _scanned_score(text: str) -> int:
    """Unusual kinds found by regular expressions: control characters; long runs of whitespace
    or digits, or very long words."""
    return (1 if _CONTROL.search(text) else 0) + (1 if _LONG_RUN.search(text) else 0)


def unusual_score(text: str, special_tokens: Sequence[str] = ()) -> int:
    """How many kinds of unusual content `text` has (0 for ordinary text)."""
    return _cheap_score(text, tuple(special_tokens)) + _scanned_score(text)


def utf8_batch(texts: Sequence[str]) -> tuple[bytes, np.ndarray[Any, Any]]:
    """Texts as one UTF-8 blob (lone surrogates kept, as utf8_size counts them) and n + 1 offsets."""
    encoded = [text.encode("utf-8", "surrogatepass") for text in texts]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded)), out=offsets[1:])
    return b"".join(encoded), offsets


def select_sample(texts: Sequence[str], budget_bytes: int, seed: int, *,
                  special_tokens: Sequence[str] = (), utf8: tuple[bytes, np.ndarray[Any, Any]] | None = None) -> list[int]:
    """Sorted indices of a deterministic sample of `texts` of at most `budget_bytes` UTF-8 bytes.

    Documents are visited in a seeded random order. A quarter of the budget goes to ordinary
    documents, the rest to the most unusual ones: every document gets the cheap checks, the
    first few budgets' worth also the regular-expression ones. Documents larger than the whole
    budget are never sampled. `utf8` is `utf8_batch(texts)` when the caller has it already;
    the cheap checks run over it with numpy, not per document."""
    if budget_bytes <= 0 or not texts:
        return []
    blob, offsets = utf8 if utf8 is not None else utf8_batch(texts)
    sizes = np.diff(offsets)
    chars, cheap = _cheap_scores(blob, offsets, np.flatnonzero(sizes <= budget_bytes), special_tokens)
    order = np.random.RandomState(seed % 2**32).permutation(len(texts))
    visit = order[sizes[order] <= budget_bytes]  # a larger document can never be taken
    before = np.cumsum(chars[visit]) - chars[visit]
    score = cheap[visit]
    for position in range(int(np.count_nonzero(before < POOL_FACTOR * budget_bytes))):  # a prefix
        score[position] += _scanned_score(texts[int(visit[position])])
    unusual = np.flatnonzero(score)
    unusual = unusual[np.argsort(-score[unusual], kind="stable")]
    chosen: list[int] = []
    used = 0

    def take(pending: np.ndarray[Any, Any], limit: int) -> np.ndarray[Any, Any]:
        """Take, in order, each pending document that still fits under `limit`; the rest stay pending."""
        nonlocal used
        picked: list[int] = []
        at = 0
        while used < limit:
            fits = np.flatnonzero(sizes[pending[at:]] <= limit - used)
            if not fits.size:
                break
            at += int(fits[0])
            picked.append(at)
            used += int(sizes[pending[at]])
            at += 1
        chosen.extend(pending[picked].tolist())
        return np.delete(pending, picked)

    ordinary = take(visit[score == 0], int(budget_bytes * ORDINARY_SHARE))
    take(visit[unusual], budget_bytes)
    take(ordinary, budget_bytes)
    return sorted(chosen)


def _cheap_scores(blob: bytes, offsets: np.ndarray[Any, Any], fit: np.ndarray[Any, Any],
                  special_tokens: Sequence[str]) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Characters and cheap score of each document, found only for the documents `fit` (those
    within the budget, the only ones a sample can take; zero for the others). When they are a
    small part of the batch (a batch of long documents holds few), their bytes are copied out
    and scanned alone, not the whole batch."""
    count = len(offsets) - 1
    if len(fit) == count:  # every document (short ones): the batch as it is
        return _scan(blob, offsets, special_tokens)
    starts, ends = offsets[fit], offsets[fit + 1]
    if 2 * int((ends - starts).sum()) < int(offsets[-1]):
        view = memoryview(blob)
        picked = b"".join([view[start:end] for start, end in zip(starts.tolist(), ends.tolist())])
        chars, cheap = _scan(picked, offsets_of(ends - starts), special_tokens)
    else:
        chars, cheap = (found[fit] for found in _scan(blob, offsets, special_tokens))
    all_chars, all_cheap = np.zeros(count, dtype=np.int64), np.zeros(count, dtype=np.int64)
    all_chars[fit], all_cheap[fit] = chars, cheap
    return all_chars, all_cheap


def _scan(blob: bytes, offsets: np.ndarray[Any, Any],
          special_tokens: Sequence[str]) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Each span's characters and cheap score (non-ASCII, CR, special spellings), by numpy over the bytes."""
    chars = character_counts(blob, offsets)
    wide = chars < np.diff(offsets)  # a multi-byte character makes a text's bytes outnumber its characters
    # A special token that contains the generic spelling is found by looking for that alone.
    others = [token.encode("utf-8", "surrogatepass") for token in special_tokens if _SPECIAL_LIKE not in token]
    cheap = (wide.astype(np.int64) + documents_containing(blob, offsets, [b"\r"])
             + documents_containing(blob, offsets, [_SPECIAL_LIKE.encode(), *others]))
    return chars, cheap


def first_difference(expected: np.ndarray[Any, Any], actual: np.ndarray[Any, Any]) -> int:
    """The first token position where two token arrays differ (the shorter length if one is a prefix)."""
    common = min(len(expected), len(actual))
    differing = np.flatnonzero(expected[:common] != actual[:common])
    return int(differing[0]) if differing.size else common


def crosscheck(fast: Backend, reference: ReferenceBackend, texts: Sequence[str],
               fast_tokens: Sequence[np.ndarray[Any, Any]], indices: Sequence[int],
               doc_names: Sequence[str]) -> CrossCheckReport:
    """Re-encode `texts[indices]` with the reference; raise TokenizerError naming the first
    document whose `fast_tokens` differ. Nothing to do when `fast` is the reference itself."""
    if not indices or isinstance(fast, ReferenceBackend):
        return CrossCheckReport(documents=0, bytes=0)
    expected = reference.encode_batch([texts[index] for index in indices])
    for index, want in zip(indices, expected):
        got = fast_tokens[index]
        if not np.array_equal(want, got):
            raise TokenizerError(f"tokenizer backend {fast.name} disagrees with the reference on document "
                                 f"{doc_names[index]}: first difference at token {first_difference(want, got)}")
    return CrossCheckReport(documents=len(indices), bytes=sum(utf8_size(texts[index]) for index in indices))
