"""Near-duplicate normalization, by Python and by the compiled pass, against its definition: NFC,
then `str.lower()`, of each document alone."""

from __future__ import annotations

import unicodedata
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prep.neardup import kernel, normalization
from tests.neardup.neardupsupport import batch

Array = np.ndarray[Any, Any]
COMPOSING = ["e", "E", "\u0301", "\u0327", "\u0308", "\u1100", "\u1161", "\u11a8", "\u212b", "\u212a", "\u2126", "İ",
             "Σ", "σ", "ς", "A", " ", "x", "\u0345", "\u1e9e", "ß", "ǅ", "\ufb01", "日", "\U0001d400", "\u0b47",
             "\u0b3e", "\uac00", "\u0f73", "É", "Ⱥ", "y" * 9]
"""Characters that compose, decompose, or lower in more than one way, or to another length, beside ASCII ones."""
NEEDS_KERNELS = pytest.mark.skipif(kernel.compiled() is None, reason="numba is not installed (the `fast` extra)")
TEXTS = st.lists(st.lists(st.sampled_from(COMPOSING), max_size=24).map("".join) | st.text(max_size=30), max_size=6)


def definition(texts: list[str]) -> list[bytes]:
    return [unicodedata.normalize("NFC", text).lower().encode() for text in texts]


def documents(text: bytes | Array, offsets: Array) -> list[bytes]:
    data = text if isinstance(text, bytes) else text.tobytes()
    return [data[start:end] for start, end in zip(offsets[:-1].tolist(), offsets[1:].tolist())]


def compiled(texts: list[str]) -> list[bytes]:
    kernels = kernel.compiled()
    assert kernels is not None
    padded, offsets = normalization.compiled_normalized(kernels, *batch(texts))
    assert padded[len(padded) - 8:].tobytes() == bytes(8) and offsets[-1] == len(padded) - 8
    return documents(padded, offsets)


@given(TEXTS)
def test_normalizing_a_run_of_non_ascii_characters_alone_is_normalizing_the_whole_text(texts: list[str]) -> None:
    assert documents(*normalization.normalized(*batch(texts))) == definition(texts)


@NEEDS_KERNELS
@settings(deadline=None)  # the first example may load the kernels and build the case table
@given(TEXTS)
def test_the_compiled_pass_normalizes_as_the_definition_does(texts: list[str]) -> None:
    assert compiled(texts) == definition(texts)


@NEEDS_KERNELS
@settings(deadline=None)
@given(TEXTS)
def test_the_compiled_pass_goes_on_where_it_stopped_when_python_has_more_stretches_than_it_holds(
        texts: list[str]) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(normalization, "SEGMENTS", 1)
        assert compiled(texts) == definition(texts)


@NEEDS_KERNELS
def test_every_character_of_the_basic_plane_normalizes_as_the_definition_in_every_place() -> None:
    """Each character alone, after an ASCII letter, before a combining acute, between two of itself
    and after a capital letter it may compose with: what the case table calls safe is safe. (Past
    the Basic Multilingual Plane, where the table gives every character to Python, every 61st.)"""
    codes = [*range(0x80, 0xD800), *range(0xE000, 0x10000), *range(0x10000, 0x30000, 61)]
    texts = [f"{char}a{char}\u0301{char}{char}E{char}" for char in map(chr, codes)]
    assert compiled(texts) == definition(texts)


@NEEDS_KERNELS
def test_every_canonical_pair_composes_in_the_compiled_pass_as_nfc_composes_it() -> None:
    """Each two-character canonical decomposition written out (its first then its second), and the
    Hangul jamo that compose by rule: NFC joins them, so the pass must leave each pair to Python."""
    pairs = [[chr(int(part, 16)) for part in parts] for code in range(0x110000)
             if len(parts := unicodedata.decomposition(chr(code)).split()) == 2 and not parts[0].startswith("<")]
    hangul = [["\u1100", "\u1161"], ["\u1112", "\u1175"], ["\uac00", "\u11a8"], ["\uc544", "\u11c2"]]
    texts = [f"{first}{second} x{first}{second}" for first, second in pairs + hangul]
    assert compiled(texts) == definition(texts)
    assert sum(len(text) for text in definition(texts)) < sum(len(text.encode()) for text in texts)  # they composed


@NEEDS_KERNELS
def test_a_capital_sigma_takes_its_document_to_python_whole_and_no_other() -> None:
    texts = ["ΟΔΟΣ ΟΔΟΣ.", "ΑΣ e\u0301", "plain e\u0301 É", "Σ"]
    assert compiled(texts) == definition(texts) == [b"\xce\xbf\xce\xb4\xce\xbf\xcf\x82 \xce\xbf\xce\xb4\xce\xbf\xcf\x82.",
                                                    "ας é".encode(), "plain é é".encode(), "σ".encode()]


def test_the_case_table_marks_unsafe_every_character_that_composes_with_one_before_it() -> None:
    table = normalization.case_table()
    for char in ["\u0301", "\u1161", "\u11a8", "\u0b3e", "\u212b", "\u0345", "İ"]:  # a second, jamo, singleton, 2 chars
        assert table[ord(char)] == normalization.UNSAFE, hex(ord(char))
    assert table[ord("É")] == ord("é") and table[ord("日")] == ord("日") and table[ord("Σ")] == normalization.SIGMA
    if kernel.compiled() is not None:
        from prep.neardup import native

        assert (native.UNSAFE, native.SIGMA) == (normalization.UNSAFE, normalization.SIGMA)
