"""The built-in length filter (`use = "length"`): keeps documents whose length is within bounds.

Characters are Unicode code points (`len(text)`); words are whitespace-separated tokens
(`len(text.split())`). Each bound is optional and inclusive: a document is kept iff
min_chars <= chars <= max_chars and min_words <= words <= max_words.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar

from prep.steps.catalog import register
from prep.steps.protocol import DocumentStep, Drop, Outcome, SettingError, StepDocument


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
        for field in fields(self):
            value = getattr(self, field.name)
            if value is not None and value < 0:
                raise SettingError(field.name, f"must be >= 0, got {value}")
        for unit in ("chars", "words"):
            low, high = getattr(self, f"min_{unit}"), getattr(self, f"max_{unit}")
            if low is not None and high is not None and low > high:
                raise SettingError(f"min_{unit}", f"must be <= max_{unit} ({high}), got {low}")

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
