"""The built-in C4 filter (`use = "c4"`): C4's line and page rules (Raffel et al. 2020), a filter and a map.

The rules are those of C4's own code (TensorFlow Datasets' `c4_utils.clean_page`, which made the
dataset), in its order, each switchable. Every line (`str.splitlines()`, so a lone "\\r" ends
one) is stripped of surrounding whitespace, then:

1. removed when a word (whitespace-separated) is longer than `max_word_length` (1000; 0: off);
2. Wikipedia-style citations ("[12]", "[]", "[edit]", "[citation needed]") are cut out of it
   (`remove_citations`);
3. removed unless it ends in terminal punctuation: ".", "?", "!" or '"', but not "..."
   (`require_terminal_punctuation`; C4's list: datatrove's C4QualityFilter also takes "'");
4. removed when it has fewer than `min_words_per_line` words (3, the paper's; TFDS' code default is
   5; 0: off);
5. the document is dropped when the line says "lorem ipsum", any case (`drop_lorem_ipsum`,
   reason `c4: lorem ipsum`);
6. removed when it says "javascript", any case (`drop_javascript_lines`);
7. the document is dropped when the line holds a "{" (`drop_curly_brace`, reason `c4: curly brace`);
8. removed when it holds a policy phrase, any case: "terms of use", "privacy policy",
   "cookie policy", "uses cookies", "use of cookies", "use cookies" (`drop_policy_lines`). C4
   removes the line, not the document, and so does this step.

As in C4, rules 5 and 7 look only at the lines that rules 1 to 4 kept: a "{" on a line that
ends without punctuation (most code) drops that line, not the document. The kept lines, joined by
"\\n" and stripped, are the new text, unless they hold fewer than `min_sentences` (5, the paper's;
TFDS' code default is 3; 0: off) sentences (`c4: too few sentences`), or nothing is left
(`c4: no lines left`, possible only with `min_sentences = 0`). C4 counts sentences with NLTK's
Punkt tokenizer; this step counts, per kept line, the runs of ".", "?" or "!" (closing quotes or
brackets after them allowed) followed by whitespace or the line's end, at least one a line. That
is close for prose but counts an abbreviation ("Dr. Smith") as a sentence end, where Punkt does
not, so a few documents C4 dropped are kept. The step returns the new text only when it differs
from the document's (None otherwise); stripping the lines and removing blank ones is a change.

C4's other page rules are not here: the bad-words list (`LDNOOBW`), English detection, the length
cap, and the corpus-wide deduplication of repeated three-sentence spans (of lines, in the code).
The work is one pass over the lines with `str` methods and precompiled patterns, linear in the
text (the sentence pattern starts only at the start of a punctuation run).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

from prep.steps.catalog import register
from prep.steps.protocol import DocumentStep, Drop, Outcome, StepDocument

END_MARKS = (".", "?", "!", '"')
"""The terminal punctuation a kept line ends with (C4's list)."""
REASONS = ("c4: lorem ipsum", "c4: curly brace", "c4: too few sentences", "c4: no lines left")
"""The drop reasons; lines are removed without one."""
POLICY = re.compile("terms of use|privacy policy|cookie policy|uses cookies|use of cookies|use cookies")
"""A policy phrase in a lower-cased line."""
CITATION = re.compile(r"\[\d*\]|\[edit\]|\[citation needed\]")
"""A Wikipedia-style citation mark, cut out of a line."""
SENTENCE_END = re.compile(r"(?<![.?!])[.?!]+[\"'’”)\]]*(?=\s|$)")
"""The end of a sentence: a run of terminal punctuation, closing quotes or brackets, then a space or the end."""


@register
@dataclass(frozen=True)
class C4(DocumentStep):
    """Removes the lines C4 removes; drops documents with lorem ipsum, a curly brace or too few sentences."""

    use: ClassVar[str] = "c4"
    max_word_length: int = 1000
    remove_citations: bool = True
    require_terminal_punctuation: bool = True
    min_words_per_line: int = 3
    drop_lorem_ipsum: bool = True
    drop_javascript_lines: bool = True
    drop_curly_brace: bool = True
    drop_policy_lines: bool = True
    min_sentences: int = 5

    def check(self) -> None:
        """The counts are >= 0."""
        self.require_at_least(("max_word_length", "min_words_per_line", "min_sentences"), 0)

    def apply(self, document: StepDocument) -> Outcome:
        """The text of the kept lines (None when that is the text as it was), or a Drop."""
        text = document.text
        kept: list[str] = []
        sentences = 0
        longest, min_words = self.max_word_length, self.min_words_per_line
        for line in text.splitlines():
            line = line.strip()
            if longest and len(line) > longest and max(map(len, line.split())) > longest:
                continue
            if self.remove_citations and "[" in line:
                line = CITATION.sub("", line)
            if self.require_terminal_punctuation and (not line.endswith(END_MARKS) or line.endswith("...")):
                continue
            if min_words and len(line.split(maxsplit=min_words)) < min_words:
                continue
            lower = line.lower()
            if self.drop_lorem_ipsum and "lorem ipsum" in lower:
                return Drop("c4: lorem ipsum")
            if self.drop_javascript_lines and "javascript" in lower:
                continue
            if self.drop_curly_brace and "{" in line:
                return Drop("c4: curly brace")
            if self.drop_policy_lines and POLICY.search(lower):
                continue
            if sentences < self.min_sentences:
                sentences += max(1, len(SENTENCE_END.findall(line)))
            kept.append(line)
        if sentences < self.min_sentences:
            return Drop("c4: too few sentences")
        cleaned = "\n".join(kept).strip()
        if not cleaned:
            return Drop("c4: no lines left")
        return None if cleaned == text else cleaned
