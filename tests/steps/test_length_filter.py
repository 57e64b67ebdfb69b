"""The length filter: a document is kept iff its code points and whitespace-separated words are within bounds."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from prep.stages.textcolumns import TextColumns
from prep.steps.length import LengthFilter
from prep.steps.protocol import Drop, StepDocument

BOUND = st.none() | st.integers(min_value=0, max_value=40)
TEXT = st.text(alphabet=st.sampled_from("ab é数🙂\t\n\u3000\u00a0"), max_size=60)


def _within(value: int, low: int | None, high: int | None) -> bool:
    return (low is None or value >= low) and (high is None or value <= high)


@given(TEXT, BOUND, BOUND, BOUND, BOUND)
def test_a_document_is_kept_iff_its_counts_are_within_the_bounds(
        text: str, min_chars: int | None, max_chars: int | None, min_words: int | None, max_words: int | None) -> None:
    step = LengthFilter(min_chars, max_chars, min_words, max_words)
    outcome = step.apply(StepDocument("id", text))
    expected = _within(len(text), min_chars, max_chars) and _within(len(text.split()), min_words, max_words)
    assert (outcome is None) == expected
    assert outcome is None or isinstance(outcome, Drop)


def test_the_bounds_are_inclusive_and_count_code_points_and_whitespace_separated_words() -> None:
    emoji = "🙂é 数"  # 4 code points, 8 UTF-8 bytes, 2 words
    assert LengthFilter(min_chars=4, max_chars=4).apply(StepDocument(None, emoji)) is None
    assert LengthFilter(max_chars=3).apply(StepDocument(None, emoji)) == Drop("too many chars")
    assert LengthFilter(min_chars=5).apply(StepDocument(None, emoji)) == Drop("too few chars")
    assert LengthFilter(min_words=2, max_words=2).apply(StepDocument(None, " a\u3000b\n")) is None
    assert LengthFilter(min_words=3).apply(StepDocument(None, "a  b")) == Drop("too few words")
    assert LengthFilter(max_words=1).apply(StepDocument(None, "a b")) == Drop("too many words")
    assert LengthFilter().apply(StepDocument(None, "")) is None


@given(st.lists(TEXT | st.text(alphabet=st.sampled_from("ab \t\x1c\x1f.\n"), max_size=30), max_size=12),
       BOUND, BOUND, BOUND, BOUND)
def test_the_batch_path_decides_as_apply_does(texts: list[str], min_chars: int | None, max_chars: int | None,
                                              min_words: int | None, max_words: int | None) -> None:
    step = LengthFilter(min_chars, max_chars, min_words, max_words)
    batch = TextColumns.from_rows(range(len(texts)), [None] * len(texts), [text.encode() for text in texts])
    outcomes = step.apply_batch(batch)
    if outcomes is None:
        assert (min_words, max_words) != (None, None) and not batch.blob.isascii()
        return
    assert list(outcomes) == [step.apply(StepDocument(None, text)) for text in texts]
