"""The built-in length filter (`use = "length"`): keeps documents whose length is within bounds.

Characters are Unicode code points (`len(text)`); words are whitespace-separated tokens
(`len(text.split())`). Each bound is optional and inclusive: a document is kept iff
min_chars <= chars <= max_chars and min_words <= words <= max_words.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, ClassVar

from prep.steps.catalog import register
from prep.steps.protocol import BatchTexts, DocumentStep, Drop, Outcome, StepDocument

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

REASONS: tuple[Outcome, ...] = (None, Drop("too few chars"), Drop("too many chars"), Drop("too few words"),
                                Drop("too many words"))
"""The outcomes, in the order `apply` checks them: the first bound a document breaks names its reason."""
ASCII_SPACE = b" \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f"
"""The ASCII characters `str.split()` splits on."""


@register
@dataclass(frozen=True)
class LengthFilter(DocumentStep):
    """Drops documents with fewer or more characters or words than its bounds."""

    use: ClassVar[str] = "length"
    min_chars: int | None = None
    max_chars: int | None = None
    min_words: int | None = None
    max_words: int | None = None

    def check(self) -> None:
        """Every bound is >= 0, and no minimum is above its maximum."""
        self.require_at_least((field.name for field in fields(self)), 0)
        self.require_ordered(("chars", "words"))

    def apply_batch(self, batch: BatchTexts) -> Sequence[Outcome] | None:
        """The outcomes from the buffer with numpy: code points are bytes less UTF-8 continuation
        bytes; words are counted only in an ASCII batch (else None: `apply` counts them)."""
        import numpy as np

        words_wanted = self.min_words is not None or self.max_words is not None
        if words_wanted and not batch.blob.isascii():
            return None
        data = np.frombuffer(batch.blob, dtype=np.uint8)
        chars = np.diff(batch.offsets)  # bytes, less the continuation bytes of a non-ASCII batch
        if not batch.blob.isascii():
            chars -= _per_document((data & 0xC0) == 0x80, batch.offsets)
        checks = [(self.min_chars, chars, True), (self.max_chars, chars, False)]
        if words_wanted:
            table = np.zeros(256, dtype=bool)
            table[np.frombuffer(ASCII_SPACE, dtype=np.uint8)] = True
            space = table[data]
            after_space = np.concatenate([[True], space[:-1]])
            after_space[batch.offsets[:-1][batch.offsets[:-1] < len(data)]] = True  # a document starts a word
            words = _per_document(~space & after_space, batch.offsets)
            checks += [(self.min_words, words, True), (self.max_words, words, False)]
        codes = np.zeros(len(batch.offsets) - 1, dtype=np.int64)
        for code, (bound, counts, at_least) in reversed(list(enumerate(checks, start=1))):
            if bound is not None:
                codes[counts < bound if at_least else counts > bound] = code  # the first broken bound wins
        return [REASONS[code] for code in codes.tolist()]

    def apply(self, document: StepDocument) -> Outcome:
        """Drop with `too few words`, `too many chars` and so on; else keep."""
        text = document.text
        chars = len(text)
        if self.min_chars is not None and chars < self.min_chars:
            return Drop("too few chars")
        if self.max_chars is not None and chars > self.max_chars:
            return Drop("too many chars")
        if self.min_words is None and self.max_words is None:
            return None
        words = len(text.split())
        if self.min_words is not None and words < self.min_words:
            return Drop("too few words")
        if self.max_words is not None and words > self.max_words:
            return Drop("too many words")
        return None


def _per_document(marks: npt.NDArray[np.bool_], offsets: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """How many of `marks` fall in each document's bytes."""
    import numpy as np

    before = np.searchsorted(np.flatnonzero(marks), offsets)  # marks before each offset
    counts: npt.NDArray[np.int64] = np.diff(before).astype(np.int64)
    return counts
