"""The Gopher quality filter: each rule, tripped alone by a hand-written document, drops it with its
reason and keeps it once that rule is off; settings out of range are refused naming the key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prep.steps.gopher_quality import REASONS, GopherQuality
from prep.steps.protocol import Drop, SettingError, StepDocument
from tests.helpers import within
from tests.steps.stepsupport import build_with_step, config_error

SENTENCE = "The river runs past the old mill and carries the leaves of autumn down to the sea with quiet patience."
BASE = "\n".join([SENTENCE] * 3)  # 60 words, 3 lines: passes every rule
NO_STOP = "Bright lanterns glow above narrow streets while travellers wander slowly home."  # 11 words, no stop word


def _outcome(text: str, **settings: Any) -> object:
    return GopherQuality(**settings).apply(StepDocument("d", text))


CASES = [
    ("gopher: too few words", SENTENCE, {"min_words": 0}),
    ("gopher: too few words", " ".join(BASE.split()[:45] + ["—"] * 10), {"min_words": 45}),  # symbols don't count
    ("gopher: too many words", "the cat sat with me " * 20_001, {"max_words": 200_000}),
    ("gopher: mean word length too short", "we go to it of an by me is up " * 6, {"min_mean_word_length": 2}),
    ("gopher: mean word length too long", "the internationalization of telecommunications " * 15,
     {"max_mean_word_length": 11}),
    ("gopher: hash ratio", BASE + "\n#one #two #three #four #five #six #seven.", {"max_symbol_word_ratio": 0.2}),
    ("gopher: ellipsis ratio", BASE + "\nwait... and... then... so… well... yes... no... fine.",
     {"max_symbol_word_ratio": 0.2}),
    ("gopher: bullet lines", "\n".join(["- " + SENTENCE, "  • " + SENTENCE, "-" + SENTENCE]), {"max_bullet_lines_ratio": 1}),
    ("gopher: ellipsis lines", BASE[:-1] + "...  ", {"max_ellipsis_lines_ratio": 0.4}),
    ("gopher: ellipsis lines", "\r".join([SENTENCE[:-1] + "…", SENTENCE, SENTENCE]), {"max_ellipsis_lines_ratio": 0.5}),
    ("gopher: alphabetic words", BASE + "\n" + " ".join(str(n) for n in range(1, 17)), {"min_alpha_words_ratio": 0.75}),
    ("gopher: stop words", "\n".join([NO_STOP] * 5 + ["The THE theme the"]), {"min_stop_words": 1}),
]


@pytest.mark.parametrize(("reason", "text", "off"), CASES)
def test_each_rule_alone_drops_with_its_reason_and_keeps_once_relaxed(reason: str, text: str, off: dict[str, Any]) -> None:
    assert _outcome(text) == Drop(reason)
    assert _outcome(text, **off) is None


def test_documents_that_pass_every_rule_are_kept_as_they_are() -> None:
    assert _outcome(BASE) is None
    assert _outcome(BASE + " 数据 🙂 ünïcödé\r\n") is None  # an emoji is a symbol word, CJK letters count
    assert _outcome(" ".join(BASE.split()[:45] + ["—"] * 10 + ["real"] * 5)) is None  # 50 words, 10 symbols
    assert _outcome("\n".join([NO_STOP] * 5 + ["to be"])) is None
    assert _outcome("\n".join(["- " + SENTENCE] * 9 + [SENTENCE])) is None  # 90% bullets is allowed


@pytest.mark.parametrize("text", ["", "   \n\t ", "\r", "\r\r\n\u2028"])
def test_texts_without_words_are_too_short_and_break_no_other_rule(text: str) -> None:
    assert _outcome(text) == Drop("gopher: too few words")
    assert _outcome(text, min_words=0, min_stop_words=0) is None


def test_emoji_are_symbols_and_unspaced_cjk_is_one_long_word() -> None:
    assert _outcome("🙂" * 100) == Drop("gopher: too few words")
    assert _outcome("🙂" * 100, min_words=0, min_stop_words=0) == Drop("gopher: alphabetic words")
    assert _outcome("数据" * 5000, min_words=1, min_stop_words=0) == Drop("gopher: mean word length too long")
    assert _outcome("数据" * 5000, min_words=1, min_stop_words=0, max_mean_word_length=10_000) is None


def test_a_very_long_line_is_decided_in_linear_time() -> None:
    with within(20):
        assert _outcome(BASE + " " + "a" * 2_000_000) == Drop("gopher: mean word length too long")
        assert _outcome(BASE + " " + ".,;-" * 500_000) is None  # one symbol word: not counted
        assert _outcome((SENTENCE + " ") * 4_000) is None


@pytest.mark.parametrize(("settings", "key", "message"), [
    ({"min_words": -1}, "min_words", "must be >= 0, got -1"),
    ({"min_words": 60, "max_words": 50}, "min_words", "must be <= max_words (50), got 60"),
    ({"min_mean_word_length": 11.0}, "min_mean_word_length", "must be <= max_mean_word_length (10.0), got 11.0"),
    ({"max_symbol_word_ratio": -0.5}, "max_symbol_word_ratio", "must be >= 0, got -0.5"),
    ({"max_bullet_lines_ratio": 1.5}, "max_bullet_lines_ratio", "must be within [0, 1], got 1.5"),
    ({"max_ellipsis_lines_ratio": -0.1}, "max_ellipsis_lines_ratio", "must be within [0, 1], got -0.1"),
    ({"min_alpha_words_ratio": 2.0}, "min_alpha_words_ratio", "must be within [0, 1], got 2.0"),
    ({"min_stop_words": 9}, "min_stop_words", "must be within [0, 8], got 9"),
])
def test_settings_out_of_range_are_refused_naming_the_key(settings: dict[str, Any], key: str, message: str) -> None:
    with pytest.raises(SettingError) as caught:
        GopherQuality(**settings).check()
    assert (caught.value.key, caught.value.message) == (key, message)
    assert config_error({"use": "gopher_quality", **settings}) == f"p.toml: steps[0].{key}: {message}"


def test_the_config_types_each_setting() -> None:
    assert config_error({"use": "gopher_quality", "min_words": 2.5}) == "p.toml: steps[0].min_words: expected int, got float 2.5"
    assert config_error({"use": "gopher_quality", "max_symbol_word_ratio": True}).startswith(
        "p.toml: steps[0].max_symbol_word_ratio: expected float, got bool True")
    assert config_error({"use": "gopher_quality", "stop_words": ["a"]}) == "p.toml: steps[0].stop_words: unknown key"
    GopherQuality().check()
    GopherQuality(min_words=0, max_words=0, min_mean_word_length=0, max_symbol_word_ratio=0, min_stop_words=0).check()


TOKENS = st.sampled_from(["the", "of", "and", "word", "a", "1", "#", "...", "…", "-", "•", "数据", "🙂", "é",
                          " ", " ", "\n", "\r", "\n\n", "\t", ".", "theme"])
RATIO = st.floats(min_value=0, max_value=1)


@given(st.lists(TOKENS, max_size=300).map("".join), st.integers(0, 80), RATIO, RATIO, RATIO, st.integers(0, 8))
def test_the_outcome_is_determined_by_the_settings_and_text(text: str, min_words: int, symbols: float, bullets: float,
                                                            alpha: float, stop_words: int) -> None:
    settings: dict[str, Any] = {"min_words": min_words, "max_symbol_word_ratio": symbols, "max_bullet_lines_ratio": bullets,
                                "min_alpha_words_ratio": alpha, "min_stop_words": stop_words}
    outcome = _outcome(text, **settings)
    assert outcome is None or isinstance(outcome, Drop) and outcome.reason in REASONS
    assert GopherQuality(**settings).apply(StepDocument(None, text)) == outcome
    everything_off = {"min_words": 0, "min_mean_word_length": 0, "max_mean_word_length": 1e9, "max_symbol_word_ratio": 1e9,
                      "max_bullet_lines_ratio": 1, "max_ellipsis_lines_ratio": 1, "min_alpha_words_ratio": 0,
                      "min_stop_words": 0}
    assert _outcome(text, **everything_off) is None


def test_a_build_counts_the_documents_each_rule_dropped(tmp_path: Path, tokenizer_path: Path) -> None:
    texts = {"keep-1": BASE, "keep-2": BASE + "\nAnd the mill wheel turns.", "short": SENTENCE,
             "bullets": "\n".join("- " + SENTENCE for _ in range(3)), "no-stop": "\n".join([NO_STOP] * 6),
             "empty": ""}
    stats, written, config = build_with_step(tmp_path, tokenizer_path, texts, 'use = "gopher_quality"\nmin_words = 50')
    assert written == {"keep-1": BASE, "keep-2": texts["keep-2"]}
    dropped = ("short", "bullets", "no-stop", "empty")
    assert stats == {"use": "gopher_quality", "documents": 6, "text_bytes": sum(len(t.encode()) for t in texts.values()),
                     "kept": 2, "dropped": 4, "dropped_bytes": sum(len(texts[key].encode()) for key in dropped),
                     "changed": 0, "reasons": {"gopher: bullet lines": 1, "gopher: stop words": 1,
                                               "gopher: too few words": 2}}
    assert config == {"use": "gopher_quality", "min_words": 50, "max_words": 100_000, "min_mean_word_length": "3.0",
                      "max_mean_word_length": "10.0", "max_symbol_word_ratio": "0.1", "max_bullet_lines_ratio": "0.9",
                      "max_ellipsis_lines_ratio": "0.3", "min_alpha_words_ratio": "0.8", "min_stop_words": 2}
