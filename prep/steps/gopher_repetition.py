"""The built-in Gopher repetition filter (`use = "gopher_repetition"`): Rae et al. 2021's repetition rules.

The repetition rules of the Gopher paper (appendix A.1.1, table A1), each threshold a setting with
the published value as its default. A document is dropped when a fraction is above its threshold,
checked in this order (the first names the reason):

- paragraphs: the fraction of paragraphs that repeat an earlier one (`max_dup_paragraph_fraction`,
  0.30), and the characters of those repeats over the text's characters
  (`max_dup_paragraph_char_fraction`, 0.20);
- lines, likewise (`max_dup_line_fraction` 0.30, `max_dup_line_char_fraction` 0.20);
- for n = 2, 3, 4, the characters of the most frequent word n-gram (its words joined by single
  spaces) times its count, over the text's characters (`max_top_2gram_char_fraction` 0.20,
  `max_top_3gram_char_fraction` 0.18, `max_top_4gram_char_fraction` 0.16);
- for n = 5 to 10, the characters of the words covered by a repeat of an earlier word n-gram over
  the text's characters (`max_dup_5gram_char_fraction` 0.15, 6: 0.14, 7: 0.13, 8: 0.12,
  9: 0.11, `max_dup_10gram_char_fraction` 0.10).

The paper defines the measures by name only; these follow datatrove's GopherRepetitionFilter (its
reference reproduction) with these choices, which are this step's own:

- Lines are `str.splitlines()` (a lone "\\r" ends one), each stripped of surrounding whitespace;
  blank lines are no lines. Paragraphs are the runs of lines between blank lines, so "\\r\\n\\r\\n"
  and a line of spaces separate paragraphs too (datatrove splits on "\\n\\n" only). A repeat is a
  line (paragraph) equal to an earlier one; the first occurrence is no repeat.
- Words are whitespace-separated tokens (`text.split()`), not a word tokenizer's, so punctuation
  stays on its word ("end." and "end" differ); n-grams are compared word by word.
- The top n-gram counts only when it occurs at least twice (a text without a repeated n-gram
  scores 0; datatrove scores a once-seen n-gram, dropping texts of a handful of words); among
  n-grams tied for the top count the longest is taken. Its fraction is capped at 1 (overlapping
  occurrences, as in "a a a a", could count a character twice), so a threshold of 1 turns a rule
  off, as it does every other rule.
- A duplicated n-gram's characters are its words' (no spaces, as datatrove's), each character
  counted once however many repeats cover it: the union of the repeats' spans, where datatrove
  skips ahead past each repeat it finds (so it may count fewer).
- An empty or whitespace-only text is kept (every fraction is 0).

The work is linear in the text and mostly in C: `splitlines` and `split`, `collections.Counter`
over lines, paragraphs and n-gram tuples, dictionaries of first occurrences; Python loops run
only over the repeats found. A text without a repeated word pair skips the 3- and 4-gram counts,
one without a repeated 5-gram every longer n-gram.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, fields
from itertools import accumulate, compress
from operator import ne
from typing import ClassVar

from prep.steps.catalog import register
from prep.steps.protocol import DocumentStep, Drop, Outcome, StepDocument

TOP_NGRAMS = (2, 3, 4)
DUP_NGRAMS = (5, 6, 7, 8, 9, 10)
REASONS = ("gopher: duplicate paragraphs", "gopher: duplicate paragraph chars", "gopher: duplicate lines",
           "gopher: duplicate line chars", *(f"gopher: top {n}-gram" for n in TOP_NGRAMS),
           *(f"gopher: duplicate {n}-grams" for n in DUP_NGRAMS))
"""The drop reasons, in the order the rules are checked."""
PARAGRAPH_BREAK = re.compile(r"\n{2,}")
"""Blank lines between paragraphs, once lines are stripped and joined by "\\n"."""


@register
@dataclass(frozen=True)
class GopherRepetition(DocumentStep):
    """Drops documents whose lines, paragraphs or word n-grams repeat too much (the module docstring
    defines each fraction)."""

    use: ClassVar[str] = "gopher_repetition"
    max_dup_paragraph_fraction: float = 0.30
    max_dup_paragraph_char_fraction: float = 0.20
    max_dup_line_fraction: float = 0.30
    max_dup_line_char_fraction: float = 0.20
    max_top_2gram_char_fraction: float = 0.20
    max_top_3gram_char_fraction: float = 0.18
    max_top_4gram_char_fraction: float = 0.16
    max_dup_5gram_char_fraction: float = 0.15
    max_dup_6gram_char_fraction: float = 0.14
    max_dup_7gram_char_fraction: float = 0.13
    max_dup_8gram_char_fraction: float = 0.12
    max_dup_9gram_char_fraction: float = 0.11
    max_dup_10gram_char_fraction: float = 0.10

    def check(self) -> None:
        """Every threshold is a fraction within [0, 1]."""
        self.require_fractions(field.name for field in fields(self))

    def apply(self, document: StepDocument) -> Outcome:
        """Drop with the first rule broken ("gopher: duplicate lines" and so on); else keep."""
        text = document.text
        size = len(text)
        joined = "\n".join(map(str.strip, text.splitlines())).strip("\n")
        if not joined:
            return None
        paragraphs = PARAGRAPH_BREAK.split(joined)
        repeats, chars = _repeats(paragraphs)
        if repeats / len(paragraphs) > self.max_dup_paragraph_fraction:
            return Drop("gopher: duplicate paragraphs")
        if chars / size > self.max_dup_paragraph_char_fraction:
            return Drop("gopher: duplicate paragraph chars")
        lines = list(filter(None, joined.split("\n")))
        repeats, chars = _repeats(lines)
        if repeats / len(lines) > self.max_dup_line_fraction:
            return Drop("gopher: duplicate lines")
        if chars / size > self.max_dup_line_char_fraction:
            return Drop("gopher: duplicate line chars")
        return self._ngrams(text.split(), size)

    def _ngrams(self, words: list[str], size: int) -> Drop | None:
        """The top 2- to 4-gram fractions, then the duplicated 5- to 10-gram fractions. Each n
        looks only at the positions whose (n-1)-gram occurs twice or more: an n-gram elsewhere
        occurs once, so the counts of those looked at are exact."""
        positions: Sequence[int] = range(len(words) - 1)
        ends = list(accumulate(map(len, words), initial=0))  # ends[i]: characters of the first i words
        for n in (*TOP_NGRAMS, *DUP_NGRAMS):
            positions = positions[:bisect_right(positions, len(words) - n)]  # those with n words from there
            grams = _ngrams_at(words, positions, n)
            counts = Counter(grams)
            top = max(counts.values(), default=0)
            if top < 2:
                return None  # no repeated n-gram, so no repeated longer one either
            if n in TOP_NGRAMS:
                longest = max(map(_spaced_length, compress(counts, map(top.__eq__, counts.values()))))
                fraction, limit = min(1.0, top * longest / size), getattr(self, f"max_top_{n}gram_char_fraction")
            else:
                fraction = _covered(_repeat_starts(grams, positions), n, ends) / size
                limit = getattr(self, f"max_dup_{n}gram_char_fraction")
            if fraction > limit:
                return Drop(f"gopher: top {n}-gram" if n in TOP_NGRAMS else f"gopher: duplicate {n}-grams")
            positions = list(compress(positions, map((1).__lt__, map(counts.__getitem__, grams))))
        return None


def _repeats(items: list[str]) -> tuple[int, int]:
    """How many of `items` equal an earlier one, and their characters."""
    distinct = Counter(items)
    return len(items) - len(distinct), sum(map(len, items)) - sum(map(len, distinct))


def _ngrams_at(words: list[str], positions: Sequence[int], n: int) -> list[tuple[str, ...]]:
    """The word n-grams starting at `positions` (ascending; each with n words after it)."""
    if len(positions) == len(words) - n + 1:  # every position
        return list(zip(*(words[start:] for start in range(n))))
    return list(map(tuple, map(words.__getitem__, map(slice, positions, map(n.__add__, positions)))))


def _spaced_length(gram: tuple[str, ...]) -> int:
    """An n-gram's characters with its words joined by single spaces."""
    return sum(map(len, gram)) + len(gram) - 1


def _repeat_starts(grams: list[tuple[str, ...]], positions: Sequence[int]) -> list[int]:
    """The positions, ascending, of the n-grams that equal one at an earlier position."""
    first = dict(zip(reversed(grams), reversed(positions)))  # each n-gram's earliest position, written last
    return list(compress(positions, map(ne, map(first.__getitem__, grams), positions)))


def _covered(starts: list[int], n: int, ends: list[int]) -> int:
    """The characters of the words in the union of the spans [start, start + n) (starts ascending)."""
    covered = reached = 0
    for start in starts:
        begin, stop = max(start, reached), start + n
        covered += ends[stop] - ends[begin]
        reached = stop
    return covered
