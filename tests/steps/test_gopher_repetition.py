"""The Gopher repetition filter: hand-written documents each break the rule named (a repeated
paragraph also repeats its lines, so that case breaks the line rule next), relaxing it keeps them;
apply agrees with a direct reading of the definitions on random texts; settings are checked."""

from __future__ import annotations

from collections import Counter
from itertools import product
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prep.steps.gopher_repetition import REASONS, GopherRepetition
from prep.steps.protocol import Drop, SettingError, StepDocument
from tests.helpers import within
from tests.steps.stepsupport import build_with_step, config_error

SYLLABLES = ("ba", "ke", "lo", "mi", "nu", "ra", "so", "ti", "vu", "ze")
WORDS = ["".join(letters) for letters in product(SYLLABLES, repeat=3)]  # 1,000 distinct words of 6 letters
DUP_LIMITS = {5: 0.15, 6: 0.14, 7: 0.13, 8: 0.12, 9: 0.11, 10: 0.10}


def _line(start: int, count: int = 6) -> str:
    """`count` distinct words, from WORDS[start]."""
    return " ".join(WORDS[start:start + count])


def _outcome(text: str, **settings: Any) -> object:
    return GopherRepetition(**settings).apply(StepDocument("d", text))


def _repeated_unit(unit: list[str], separators: int, units: int = 12) -> str:
    """`unit` (words) repeated `units` times, each followed by `separators` distinct words, on one line."""
    words: list[str] = []
    for index in range(units):
        words += unit + WORDS[300 + index * separators:300 + (index + 1) * separators]
    return " ".join(words)


def _duplicated_ngrams(n: int) -> str:
    """Three distinct n-word phrases, each twice, among distinct words: the repeats cover
    characters just above the n-gram limit (and below the shorter n-grams' limits)."""
    phrases = [WORDS[100 + 20 * index:100 + 20 * index + n] for index in range(3)]
    filler = iter(WORDS[500:])
    words: list[str] = []
    for phrase in phrases * 2:
        words += [*phrase, next(filler)]
    text = " ".join(words)
    while len(text) < 6 * n * 3 / (DUP_LIMITS[n] + 0.005) - 7:
        text += " " + next(filler)
    return text


PARAGRAPHS = [f"{_line(20 * index)}\n{_line(20 * index + 6)}\n{_line(20 * index + 12)}" for index in range(7)]
CASES = [
    ("gopher: duplicate paragraphs", "\n\n".join(["Yes", *[f"{p}\n\nYes" for p in PARAGRAPHS[:4]], *PARAGRAPHS[4:]]),
     {"max_dup_paragraph_fraction": 0.5}, None),
    ("gopher: duplicate paragraph chars", "\n\n".join(["x" * 60, _line(0), _line(10), _line(20), "x" * 60]),
     {"max_dup_paragraph_char_fraction": 0.5}, "gopher: duplicate line chars"),
    ("gopher: duplicate lines", "\n".join(["Yes", _line(0), "Yes", _line(10), "Yes", _line(20), "Yes", _line(30)]),
     {"max_dup_line_fraction": 0.5}, None),
    ("gopher: duplicate line chars", "\n".join(["x" * 80, _line(0), _line(10), _line(20), "x" * 80]),
     {"max_dup_line_char_fraction": 0.5}, None),
    ("gopher: top 2-gram", _repeated_unit(["big", "cat"], 3), {"max_top_2gram_char_fraction": 0.5}, None),
    ("gopher: top 3-gram", _repeated_unit(["big", "red", "cat"], 4), {"max_top_3gram_char_fraction": 0.5}, None),
    ("gopher: top 4-gram", _repeated_unit(["one", "red", "big", "cat"], 7), {"max_top_4gram_char_fraction": 0.5}, None),
    *((f"gopher: duplicate {n}-grams", _duplicated_ngrams(n), {f"max_dup_{n}gram_char_fraction": 0.5}, None)
      for n in DUP_LIMITS),
]


@pytest.mark.parametrize(("reason", "text", "relaxed", "then"), CASES)
def test_each_rule_drops_with_its_reason_and_relaxing_it_keeps(reason: str, text: str, relaxed: dict[str, float],
                                                               then: str | None) -> None:
    assert _outcome(text) == Drop(reason)
    assert _outcome(text, **relaxed) == (Drop(then) if then else None)
    assert _reference(text, GopherRepetition()) == Drop(reason)


def test_documents_without_much_repetition_are_kept() -> None:
    prose = ("The river runs past the old mill and carries the leaves of autumn down to the sea.\n"
             "In the spring the water rises, and the mill wheel turns faster than the miller likes.\n\n"
             "Nobody in the village remembers who built the mill, but everyone has a story about it.")
    assert _outcome(prose) is None
    assert _outcome("\n\n".join(PARAGRAPHS)) is None
    assert _outcome(_line(0, 300)) is None
    assert _outcome("数据" * 1000 + " 🙂 " + "é" * 50) is None  # long words, no repeats
    assert _outcome("hello world") is None  # a short text has no repeated n-gram (datatrove would drop it)


@pytest.mark.parametrize("text", ["", "   ", "\r", "\n\n\n", "\r\n \t\r\n", "\u2028"])
def test_empty_and_blank_texts_are_kept(text: str) -> None:
    assert _outcome(text) is None


def test_a_lone_carriage_return_ends_a_line_and_blank_lines_of_spaces_end_paragraphs() -> None:
    assert _outcome("\r".join(["Yes", _line(0), "Yes", _line(10), "Yes"])) == Drop("gopher: duplicate lines")
    text = f"{_line(0)}\r\n  \r\nYes\r\n\r\n{_line(10)}\r\n\t\r\nYes\n \nYes"
    assert _outcome(text) == Drop("gopher: duplicate paragraphs")
    assert _outcome("数据\n数据\n数据\n" + _line(0)) == Drop("gopher: duplicate lines")


def test_long_and_repetitive_texts_are_decided_in_linear_time() -> None:
    with within(30):
        assert _outcome("a" * 3_000_000) is None
        assert _outcome("a " * 1_000_000) == Drop("gopher: top 2-gram")
        assert _outcome(" ".join(WORDS * 100)) == Drop("gopher: duplicate 5-grams")
        assert _outcome(" ".join(f"{word}{index}" for index in range(100) for word in WORDS)) is None


@pytest.mark.parametrize("key", ["max_dup_paragraph_fraction", "max_dup_line_char_fraction", "max_top_3gram_char_fraction",
                                 "max_dup_10gram_char_fraction"])
@pytest.mark.parametrize("value", [-0.1, 1.5])
def test_thresholds_outside_zero_to_one_are_refused_naming_the_key(key: str, value: float) -> None:
    with pytest.raises(SettingError) as caught:
        GopherRepetition(**{key: value}).check()
    assert (caught.value.key, caught.value.message) == (key, f"must be within [0, 1], got {value}")
    assert config_error({"use": "gopher_repetition", key: value}) == f"p.toml: steps[0].{key}: must be within [0, 1], got {value}"


def test_the_config_types_each_setting() -> None:
    assert config_error({"use": "gopher_repetition", "max_dup_line_fraction": "0.3"}) == (
        "p.toml: steps[0].max_dup_line_fraction: expected float, got str '0.3'")
    assert config_error({"use": "gopher_repetition", "max_dup_11gram_char_fraction": 0.1}) == (
        "p.toml: steps[0].max_dup_11gram_char_fraction: unknown key")
    GopherRepetition(**{key: 0.0 for key in GopherRepetition().settings()}).check()
    GopherRepetition(**{key: 1 for key in GopherRepetition().settings()}).check()


def _paragraphs(stripped: list[str]) -> list[str]:
    """The runs of non-blank lines, each joined by newlines."""
    paragraphs: list[str] = []
    current: list[str] = []
    for line in [*stripped, ""]:
        if line:
            current.append(line)
        elif current:
            paragraphs.append("\n".join(current))
            current = []
    return paragraphs


def _repeats(items: list[str]) -> tuple[int, int]:
    seen: set[str] = set()
    count = chars = 0
    for item in items:
        if item in seen:
            count, chars = count + 1, chars + len(item)
        seen.add(item)
    return count, chars


def _reference(text: str, step: GopherRepetition) -> Drop | None:
    """The rules read directly from the module docstring, one n-gram at a time."""
    stripped = [line.strip() for line in text.splitlines()]
    lines, paragraphs, size = [line for line in stripped if line], _paragraphs(stripped), len(text)
    if not lines:
        return None
    checks = []
    for name, items in (("paragraph", paragraphs), ("line", lines)):
        count, chars = _repeats(items)
        checks += [(f"gopher: duplicate {name}s", count / len(items), getattr(step, f"max_dup_{name}_fraction")),
                   (f"gopher: duplicate {name} chars", chars / size, getattr(step, f"max_dup_{name}_char_fraction"))]
    words = text.split()
    for n in range(2, 11):
        grams = [tuple(words[start:start + n]) for start in range(len(words) - n + 1)]
        if n <= 4:
            counts = Counter(grams)
            top = max(counts.values(), default=0)
            longest = max((len(" ".join(gram)) for gram, count in counts.items() if count == top), default=0)
            checks.append((f"gopher: top {n}-gram", min(1.0, top * longest / size) if top >= 2 else 0.0,
                           getattr(step, f"max_top_{n}gram_char_fraction")))
        else:
            seen: set[tuple[str, ...]] = set()
            covered: set[int] = set()
            for start, gram in enumerate(grams):
                if gram in seen:
                    covered.update(range(start, start + n))
                seen.add(gram)
            checks.append((f"gopher: duplicate {n}-grams", sum(len(words[index]) for index in covered) / size,
                           getattr(step, f"max_dup_{n}gram_char_fraction")))
    return next((Drop(reason) for reason, fraction, limit in checks if fraction > limit), None)


TOKENS = st.sampled_from(["a", "b", "cc", "a b", "a b cc", " ", " ", "  ", "\n", "\n", "\n\n", "\r", "\t", "数", "🙂", "é."])
TEXT = st.integers(0, 300).flatmap(lambda size: st.lists(TOKENS, min_size=size, max_size=size)).map("".join)
FRACTION = st.sampled_from([0.0, 0.1, 0.3, 1.0, 1.0, 1.0]) | st.floats(0, 1)  # often off, to reach the later rules
SETTINGS = st.fixed_dictionaries({key: FRACTION for key in sorted(GopherRepetition().settings())})


@given(TEXT, SETTINGS)
def test_apply_agrees_with_the_definitions_and_is_deterministic(text: str, settings: dict[str, float]) -> None:
    step = GopherRepetition(**settings)
    outcome = step.apply(StepDocument(None, text))
    assert outcome == _reference(text, step)
    assert outcome is None or isinstance(outcome, Drop) and outcome.reason in REASONS
    assert GopherRepetition(**settings).apply(StepDocument("other", text)) == outcome


def test_a_build_counts_the_documents_each_rule_dropped(tmp_path: Path, tokenizer_path: Path) -> None:
    texts = {"keep-1": "\n\n".join(PARAGRAPHS), "keep-2": _line(700, 80), "lines": CASES[2][1], "top-2": CASES[4][1],
             "dup-5": _duplicated_ngrams(5), "blank": "  \n  "}
    stats, written, config = build_with_step(tmp_path, tokenizer_path, texts,
                                             'use = "gopher_repetition"\nmax_dup_line_fraction = 0.3')
    assert written == {"keep-1": texts["keep-1"], "keep-2": texts["keep-2"], "blank": "  \n  "}
    dropped = ("lines", "top-2", "dup-5")
    assert stats == {"use": "gopher_repetition", "documents": 6, "text_bytes": sum(len(t.encode()) for t in texts.values()),
                     "kept": 3, "dropped": 3, "dropped_bytes": sum(len(texts[key].encode()) for key in dropped),
                     "changed": 0, "reasons": {"gopher: duplicate 5-grams": 1, "gopher: duplicate lines": 1,
                                               "gopher: top 2-gram": 1}}
    assert config["max_dup_line_fraction"] == "0.3" and config["max_dup_10gram_char_fraction"] == "0.1"
