"""Hypothesis strategies for adversarial documents: every Unicode plane, runs, specials, CR/LF."""

from __future__ import annotations

from hypothesis import strategies as st

SPECIAL_STRINGS = ("<|endoftext|>", "<|im_start|>", "<pad>", " <pad> ", "endoftext", "hello world",
                   "<|endoftext", "|>", "<|endoftext|><|endoftext|>")
PIECES = ("'s", "'S", "'ll", "'t", "'re", "'ve", "'m", "'d", "'", " '", "e\u0301", "\u0301\u0302",
          "👨\u200d👩\u200d👧", "🏳\ufe0f\u200d🌈", "👍🏽", "\u200d", "\ufeff", "\u00a0", "\u3000", "\u2028",
          "\u0085", "\u180e", "\u200b", "\x00", "\x1b", "\x7f", "ǅ", "İ", "ß", "ﬁ", "Σ", "٣", "𝟙", "Ⅻ", "½",
          "\r", "\n", "\r\n", "\n\r", "\t", " ", "?!", "...", "$", "_", "a_b", "x.y", "3.14")
RUN_UNITS = (" ", "\t", "\n", "\r\n", "\u3000", "0", "7", "a", "é", "数", "😀", "-")


def _plane_char(plane: int, offset: int) -> str:
    code_point = (plane << 16) | offset
    return "\ufffd" if 0xD800 <= code_point < 0xE000 else chr(code_point)


# Any code point of any plane (astral, private-use and unassigned ones included), no surrogates.
plane_chars = st.builds(_plane_char, st.integers(0, 16), st.integers(0, 0xFFFF))
runs = st.builds(lambda unit, count: unit * count, st.sampled_from(RUN_UNITS), st.integers(1, 300))
long_words = st.builds(lambda unit, count: unit * count, st.sampled_from(("x", "Ж", "ab1")), st.integers(100, 3000))
pieces = st.one_of(
    st.sampled_from(PIECES),
    st.sampled_from(SPECIAL_STRINGS),
    plane_chars,
    st.text(st.characters(exclude_categories=["Cs"]), max_size=6),
    st.text("abc xyz019", max_size=12),
    runs,
    long_words,
)
documents = st.lists(pieces, max_size=30).map("".join)
batches = st.lists(documents, min_size=1, max_size=6)
