"""The built-in Gopher quality filter (`use = "gopher_quality"`): the quality rules of Rae et al. 2021.

The rules of the Gopher paper ("Scaling Language Models: Methods, Analysis & Insights from
Training Gopher", appendix A.1.1), each with its published threshold as the default of its own
setting, checked in this order (the first rule a document breaks is its drop reason):

- word count: at least `min_words` (50) and at most `max_words` (100,000) words that hold a
  word character (a token of punctuation or symbols alone, such as "-" or "...", is not counted);
- mean word length of those words within [`min_mean_word_length`, `max_mean_word_length`] (3, 10);
- symbol-to-word ratio: "#" characters, then ellipses ("..." or "…"), per word at most
  `max_symbol_word_ratio` (0.1);
- at most `max_bullet_lines_ratio` (0.9) of the lines start with a bullet ("•" or "-", after
  leading whitespace) and at most `max_ellipsis_lines_ratio` (0.3) end with an ellipsis (before
  trailing whitespace);
- at least `min_alpha_words_ratio` (0.8) of the words hold an alphabetic character;
- at least `min_stop_words` (2) of the stop words the, be, to, of, and, that, have, with occur.

Choices the paper leaves open (datatrove's GopherQualityFilter is the reference reproduction):
words are whitespace-separated tokens (`text.split()`, as the length filter counts them), not a
language's word tokenizer, so punctuation stays attached to its word ("end." is one word of 4
characters): the mean word length counts it, the ratios divide by these words. Lines are
`str.splitlines()` (a lone "\\r" ends a line; empty lines count). Alphabetic is a word character
that is no decimal digit or "_" (`str.isalpha`, and the numerals such as "²" or "½" that are
neither digits nor letters). A stop word counts where it stands lower-case between word boundaries
("the," counts, "The" and "theme" do not). A document with no word (or no line) breaks no ratio
rule. The rules are made for languages that separate words by spaces: a page of Chinese is a few
long "words". The work is linear in the text and runs in C: `split`, `str.isalpha` over the words
and a precompiled pattern over the few words that are not all letters, `count`, `splitlines`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from itertools import compress
from operator import methodcaller, not_
from typing import ClassVar

from prep.steps.catalog import register
from prep.steps.protocol import DocumentStep, Drop, Outcome, SettingError, StepDocument

STOP_WORDS = ("the", "be", "to", "of", "and", "that", "have", "with")
"""The Gopher stop words; a document needs `min_stop_words` of them."""
REASONS = ("gopher: too few words", "gopher: too many words", "gopher: mean word length too short",
           "gopher: mean word length too long", "gopher: hash ratio", "gopher: ellipsis ratio",
           "gopher: bullet lines", "gopher: ellipsis lines", "gopher: alphabetic words", "gopher: stop words")
"""The drop reasons, in the order the rules are checked."""

LETTER = re.compile(r"[^\W\d_]")
"""A letter: a word character other than a decimal digit or "_"."""
WORD_CHARACTER = re.compile(r"\w")
STOP_WORD = re.compile(r"\b(?:" + "|".join(STOP_WORDS) + r")\b")
"""A stop word standing alone."""
STARTS_WITH_BULLET = methodcaller("startswith", ("•", "-"))
ENDS_WITH_ELLIPSIS = methodcaller("endswith", ("...", "…"))


@register
@dataclass(frozen=True)
class GopherQuality(DocumentStep):
    """Drops documents that break one of Gopher's quality rules (the module docstring lists them)."""

    use: ClassVar[str] = "gopher_quality"
    min_words: int = 50
    max_words: int = 100_000
    min_mean_word_length: float = 3.0
    max_mean_word_length: float = 10.0
    max_symbol_word_ratio: float = 0.1
    max_bullet_lines_ratio: float = 0.9
    max_ellipsis_lines_ratio: float = 0.3
    min_alpha_words_ratio: float = 0.8
    min_stop_words: int = 2

    def check(self) -> None:
        """Counts and lengths are >= 0, each minimum at most its maximum, fractions within [0, 1]."""
        self.require_at_least(("min_words", "max_words", "min_mean_word_length", "max_mean_word_length",
                               "max_symbol_word_ratio"), 0)
        self.require_fractions(("max_bullet_lines_ratio", "max_ellipsis_lines_ratio", "min_alpha_words_ratio"))
        if not 0 <= self.min_stop_words <= len(STOP_WORDS):
            raise SettingError("min_stop_words", f"must be within [0, {len(STOP_WORDS)}], got {self.min_stop_words}")
        self.require_ordered(("words", "mean_word_length"))

    def apply(self, document: StepDocument) -> Outcome:
        """Drop with the first rule the document breaks ("gopher: too few words" and so on); else keep."""
        text = document.text
        words = text.split()
        letterless = _without(LETTER, _without(str.isalpha, words))  # most words are all letters: one C call each
        symbol_words = _without(WORD_CHARACTER, letterless)
        counted = len(words) - len(symbol_words)
        if counted < self.min_words:
            return Drop("gopher: too few words")
        if counted > self.max_words:
            return Drop("gopher: too many words")
        if counted:
            mean = (sum(map(len, words)) - sum(map(len, symbol_words))) / counted
            if mean < self.min_mean_word_length:
                return Drop("gopher: mean word length too short")
            if mean > self.max_mean_word_length:
                return Drop("gopher: mean word length too long")
        return self._symbols_and_lines(text, len(words)) or self._words(text, len(words), len(letterless))

    def _symbols_and_lines(self, text: str, words: int) -> Drop | None:
        """The symbol-to-word ratios, then the bullet and ellipsis line fractions."""
        if words:
            if text.count("#") / words > self.max_symbol_word_ratio:
                return Drop("gopher: hash ratio")
            if (text.count("...") + text.count("…")) / words > self.max_symbol_word_ratio:
                return Drop("gopher: ellipsis ratio")
        lines = text.splitlines()
        if lines:
            if sum(map(STARTS_WITH_BULLET, map(str.lstrip, lines))) / len(lines) > self.max_bullet_lines_ratio:
                return Drop("gopher: bullet lines")
            if sum(map(ENDS_WITH_ELLIPSIS, map(str.rstrip, lines))) / len(lines) > self.max_ellipsis_lines_ratio:
                return Drop("gopher: ellipsis lines")
        return None

    def _words(self, text: str, words: int, letterless: int) -> Drop | None:
        """The fraction of words with a letter, then the stop words."""
        if words and (words - letterless) / words < self.min_alpha_words_ratio:
            return Drop("gopher: alphabetic words")
        if self.min_stop_words:
            found: set[str] = set()
            for match in STOP_WORD.finditer(text):
                found.add(match.group())
                if len(found) >= self.min_stop_words:
                    return None
            return Drop("gopher: stop words")
        return None


def _without(test: re.Pattern[str] | Callable[[str], bool], words: list[str]) -> list[str]:
    """The words that fail `test` (a predicate, or a pattern found nowhere in them), mapped in C."""
    found = map(test.search, words) if isinstance(test, re.Pattern) else map(test, words)
    return list(compress(words, map(not_, found)))
