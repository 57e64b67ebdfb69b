"""The C4 filter: each line rule removes exactly its line (the document comes back changed) and keeps
it once switched off; lorem ipsum, a curly brace and too few sentences drop the document; settings
are checked; the changed text keeps only lines that pass every line rule."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prep.steps.c4 import C4, END_MARKS, REASONS
from prep.steps.protocol import Change, Drop, SettingError, StepDocument
from tests.helpers import within
from tests.steps.stepsupport import build_with_step, config_error

LINES = ["The river runs past the old mill.", "It carries the leaves of autumn down to the sea.",
         "Nobody remembers who built the mill.", "Everyone in the village has a story about it!",
         "Would you like to hear one?"]
BASE = "\n".join(LINES)  # five sentences, each line kept as it is


def _outcome(text: str, **settings: Any) -> object:
    return C4(**settings).apply(StepDocument("d", text))


LINE_CASES = [
    ("Click here to subscribe", {"require_terminal_punctuation": False}),
    ("And then the story went on...", {"require_terminal_punctuation": False}),
    ("Okay then.", {"min_words_per_line": 2}),
    ("See " + "a" * 1001 + " for details.", {"max_word_length": 0}),
    ("Please enable JavaScript to view this page.", {"drop_javascript_lines": False}),
    ("By using this site you agree to our Terms of Use.", {"drop_policy_lines": False}),
    ("This website USES COOKIES to improve your experience.", {"drop_policy_lines": False}),
    ("Lorem ipsum dolor sit amet", {"require_terminal_punctuation": False, "drop_lorem_ipsum": False}),
    ("function show() {", {"require_terminal_punctuation": False, "drop_curly_brace": False}),
]


@pytest.mark.parametrize(("line", "off"), LINE_CASES)
def test_each_line_rule_removes_its_line_and_keeps_it_once_off(line: str, off: dict[str, Any]) -> None:
    text = "\n".join([*LINES[:2], line, *LINES[2:]])
    assert _outcome(text) == BASE
    assert _outcome(text, **off) is None


@pytest.mark.parametrize(("reason", "line", "off"), [
    ("c4: lorem ipsum", "Lorem IPSUM dolor sit amet.", {"drop_lorem_ipsum": False}),
    ("c4: curly brace", "The set {a, b} has two items.", {"drop_curly_brace": False}),
    ("c4: too few sentences", None, {"min_sentences": 4}),
])
def test_each_page_rule_drops_the_document_and_keeps_it_once_off(reason: str, line: str | None, off: dict[str, Any]) -> None:
    text = "\n".join([*LINES[:4], line]) if line else "\n".join(LINES[:4])
    assert _outcome(text) == Drop(reason)
    assert _outcome(text, **off) is None


def test_citations_are_cut_and_lines_stripped_and_joined_by_newlines() -> None:
    assert _outcome(BASE.replace("mill.\n", "mill.[12]\n", 1)) == BASE
    assert _outcome(BASE.replace("sea.", "sea.[edit]")) == BASE
    cited = "\n".join([*LINES, "Rome was founded long ago.[citation needed]"])
    assert _outcome(cited) == BASE + "\nRome was founded long ago."
    assert _outcome(cited, remove_citations=False) == BASE  # uncut, the line has no end mark
    assert _outcome("  " + BASE.replace("\n", " \r\n\n\t") + "\n\n") == BASE
    assert _outcome("\r".join(LINES)) == BASE  # a lone carriage return ends a line
    assert _outcome(BASE) is None


def test_sentences_are_counted_within_lines() -> None:
    two_lines = 'One sentence here. Another one here! A third, here?\n"A fourth," she said. "And a fifth."'
    assert _outcome(two_lines) is None
    assert _outcome(two_lines.replace('"', "”")) == Drop("c4: too few sentences")  # C4's end marks: ASCII only
    assert _outcome("Dr. Smith went home. He slept.\nIt was late.") == Drop("c4: too few sentences")  # counted 4
    assert _outcome("Values 3.5 and 4.2 are close.\n" * 4) == Drop("c4: too few sentences")  # no end inside 3.5


@pytest.mark.parametrize("text", ["", "   ", "\r", "\n\n", "这是一个句子。\n" * 6, "🙂🙂🙂 " * 5])
def test_texts_without_a_kept_line_are_dropped(text: str) -> None:
    assert _outcome(text) == Drop("c4: too few sentences")
    assert _outcome(text, min_sentences=0) == Drop("c4: no lines left")


def test_non_ascii_lines_with_end_marks_are_kept() -> None:
    text = "\n".join(LINES + ["我们 爱 数据。 Ça va très bien.", "I love it 🙂!"])
    assert _outcome(text) is None


def test_very_long_lines_are_decided_in_linear_time() -> None:
    with within(20):
        long_line = "word " * 400_000 + "end."
        assert _outcome(BASE + "\n" + long_line) is None
        assert _outcome(BASE + "\n" + "a" * 2_000_000 + " is long.") == BASE
        punctuation = "a b c " + "!" * 1_000_000 + "x."
        assert _outcome(BASE + "\n" + punctuation, max_word_length=0) is None


@pytest.mark.parametrize("key", ["max_word_length", "min_words_per_line", "min_sentences"])
def test_negative_counts_are_refused_naming_the_key(key: str) -> None:
    settings: dict[str, Any] = {key: -1}
    with pytest.raises(SettingError) as caught:
        C4(**settings).check()
    assert (caught.value.key, caught.value.message) == (key, "must be >= 0, got -1")
    assert config_error({"use": "c4", key: -1}) == f"p.toml: steps[0].{key}: must be >= 0, got -1"


def test_the_config_types_each_setting() -> None:
    assert config_error({"use": "c4", "drop_curly_brace": "no"}) == (
        "p.toml: steps[0].drop_curly_brace: expected bool, got str 'no'")
    assert config_error({"use": "c4", "min_sentences": True}) == "p.toml: steps[0].min_sentences: expected int, got bool True"
    assert config_error({"use": "c4", "drop_policy": False}) == "p.toml: steps[0].drop_policy: unknown key"
    C4(max_word_length=0, min_words_per_line=0, min_sentences=0).check()


LINE = st.lists(st.sampled_from(["word", "the", "a", "Lorem", "ipsum", "javascript", "{", "use", "cookies", "[1]", "数据",
                                 "🙂", ".", "!", "?", '"', "...", " ", " ", "  ", "\t"]), max_size=12).map("".join)
SWITCHES = st.fixed_dictionaries({key: st.booleans() for key in ("remove_citations", "require_terminal_punctuation",
                                                                  "drop_lorem_ipsum", "drop_javascript_lines",
                                                                  "drop_curly_brace", "drop_policy_lines")})


@given(st.lists(LINE, max_size=12), st.sampled_from(["\n", "\r\n", "\r", "\n\n"]), SWITCHES, st.integers(0, 4),
       st.integers(0, 6))
def test_the_changed_text_holds_only_lines_that_pass_and_the_outcome_is_determined(
        lines: list[str], separator: str, switches: dict[str, bool], min_words: int, min_sentences: int) -> None:
    text = separator.join(lines)
    step = C4(min_words_per_line=min_words, min_sentences=min_sentences, **switches)
    outcome = step.apply(StepDocument(None, text))
    assert C4(min_words_per_line=min_words, min_sentences=min_sentences, **switches).apply(StepDocument("x", text)) == outcome
    if isinstance(outcome, Drop):
        assert outcome.reason in REASONS
        return
    assert not isinstance(outcome, Change)  # C4 sets no metadata
    result = text if outcome is None else outcome
    assert outcome != text and result and result == result.strip()
    for line in result.split("\n"):
        assert len(line.split()) >= min_words
        assert line == line.strip() or switches["remove_citations"]  # as C4, a line is not stripped again after a cut
        assert not switches["require_terminal_punctuation"] or line.endswith(END_MARKS) and not line.endswith("...")
        assert not switches["drop_javascript_lines"] or "javascript" not in line.lower()
        assert not switches["drop_curly_brace"] or "{" not in line


def test_a_build_counts_dropped_and_changed_documents(tmp_path: Path, tokenizer_path: Path) -> None:
    messy = "\n".join(["Home | About | Contact", *LINES, "That is the whole story.", "Enable JavaScript to go on.", "Share"])
    texts = {"clean": BASE, "messy": messy, "lorem": BASE + "\nLorem ipsum dolor sit amet.",
             "code": BASE + "\nThe object {x: 1} is small.", "short": "One line only."}
    stats, written, config = build_with_step(tmp_path, tokenizer_path, texts, 'use = "c4"\nmin_sentences = 5')
    assert written == {"clean": BASE, "messy": BASE + "\nThat is the whole story."}
    dropped = ("lorem", "code", "short")
    assert stats == {"use": "c4", "documents": 5, "text_bytes": sum(len(t.encode()) for t in texts.values()),
                     "kept": 2, "dropped": 3, "dropped_bytes": sum(len(texts[key].encode()) for key in dropped),
                     "changed": 1, "reasons": {"c4: curly brace": 1, "c4: lorem ipsum": 1, "c4: too few sentences": 1}}
    assert config == {"use": "c4", "max_word_length": 1000, "remove_citations": True, "require_terminal_punctuation": True,
                      "min_words_per_line": 3, "drop_lorem_ipsum": True, "drop_javascript_lines": True,
                      "drop_curly_brace": True, "drop_policy_lines": True, "min_sentences": 5}
