"""has_unassigned_code_point gives the same answer as its previous, slower implementation (kept
here as the oracle) for every str: all planes, lone and paired surrogates, Latin-1, strings whose
size does not reveal their width (cached UTF-8, subclasses)."""

from __future__ import annotations

import ctypes
import re
import unicodedata

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from prep.tokenizer.unicode import _char_width, _unassigned_tables, has_unassigned_code_point

_ORACLE_BEYOND_FIRST_UNASSIGNED = re.compile(r"[^\x00-\u0377]")


def oracle(text: str) -> bool:
    """The implementation before the O(1) width check, verbatim."""
    if text.isascii() or not _ORACLE_BEYOND_FIRST_UNASSIGNED.search(text):
        return False
    unassigned, units = _unassigned_tables()
    code_units = np.frombuffer(text.encode("utf-16-le", "surrogatepass"), dtype=np.uint16)
    if not units[code_units].any():
        return False
    code_points = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    return bool(unassigned[code_points].any())


def _with_cached_utf8(text: str) -> str:
    """`text` (a fresh copy) after CPython cached its UTF-8 form, which sys.getsizeof then counts."""
    if len(text) < 2:
        return text  # one Latin-1 character is a shared singleton: leave it alone
    copy = "".join(list(text))
    as_utf8 = ctypes.pythonapi.PyUnicode_AsUTF8AndSize
    as_utf8.argtypes = [ctypes.py_object, ctypes.c_void_p]
    as_utf8.restype = ctypes.c_void_p
    if copy.encode("utf-8", "surrogatepass") == copy.encode("utf-8", "replace"):  # else it fails
        as_utf8(copy, None)
    return copy


class _Str(str):
    """A str subclass: CPython stores it apart from its header, so its size misleads."""


ANY_CHAR = st.characters(exclude_categories=())  # every code point, surrogates included
UNASSIGNED = st.sampled_from(["\u0378", "\u0530", "\u2065", "\ufdd0", "\U000323b0", "\U00050000", "\U000e0000"])
PIECE = st.one_of(
    st.text(ANY_CHAR, max_size=8),
    st.text(st.characters(max_codepoint=0xFF), max_size=20),
    st.text(st.characters(min_codepoint=0x100, max_codepoint=0x377), max_size=4),
    st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), max_size=3),
    st.text(st.characters(min_codepoint=0x10000, exclude_categories=()), max_size=3),
    UNASSIGNED,
    st.just("plain ascii text "),
)
TEXTS = st.lists(PIECE, max_size=12).map("".join)


@settings(max_examples=600, deadline=None)
@given(TEXTS)
@example("")
@example("\xe9")
@example("\xff" * 100)
@example("\ud800")
@example("a\udfff")
@example("\ud83d\ude00")  # two lone surrogates that pair up in UTF-16
@example("\U0001f600\ud800")
@example("\u0377\u0378")
@example("\U0010ffff")
@example("\uffff")
def test_same_answer_as_the_previous_implementation(text: str) -> None:
    expected = oracle(text)
    assert has_unassigned_code_point(text) is expected
    assert has_unassigned_code_point(_with_cached_utf8(text)) is expected
    assert has_unassigned_code_point(_Str(text)) is expected


@settings(max_examples=500, deadline=None)
@given(st.text(ANY_CHAR, max_size=50))
def test_same_answer_on_arbitrary_text(text: str) -> None:
    assert has_unassigned_code_point(text) is oracle(text)


def test_same_answer_on_every_code_point_in_blocks() -> None:
    """Every code point, 32 at a time, alone and beside Latin-1, BMP and astral text."""
    for start in range(0, 0x110000, 32):
        block = "".join(map(chr, range(start, start + 32)))
        for text in (block, "\xe9" + block, "\u0101" + block, block + "\U0001f600"):
            assert has_unassigned_code_point(text) is oracle(text), hex(start)


def test_width_is_read_only_when_the_size_proves_it() -> None:
    latin = "".join(["caf", chr(0xE9)] * 50)
    assert _char_width(latin) == 1
    assert _char_width("".join(["a", chr(0x10000)])) == 4
    assert _char_width("".join(["a", chr(0x101)])) == 0
    assert _char_width(_Str(latin)) == 0
    assert _char_width(_with_cached_utf8(latin)) == 0


def test_code_points_below_the_first_checked_are_assigned() -> None:
    unassigned, _ = _unassigned_tables()
    assert not unassigned[:0x378].any() and unassigned[0x378]
    assert all(unicodedata.category(chr(c)) != "Cn" for c in range(0x378))


@pytest.mark.parametrize("text", ["\xe9" * 10, "\u0101" * 10, "\U0001f600" * 10])
def test_strings_of_each_width_without_unassigned(text: str) -> None:
    assert not has_unassigned_code_point(text)
    assert has_unassigned_code_point(text + "\U00050000")


VALID_TEXTS = TEXTS.map(lambda text: text.encode("utf-8", "replace").decode("utf-8"))  # no lone surrogates


@settings(max_examples=300, deadline=None)
@given(st.lists(VALID_TEXTS, max_size=12))
def test_a_whole_batch_gets_the_per_text_answers(texts: list[str]) -> None:
    """documents_with_unassigned (numpy over a batch's UTF-8) agrees with the per-text oracle."""
    from prep.tokenizer.spans import offsets_of
    from prep.tokenizer.unicode import documents_with_unassigned

    encoded = [text.encode() for text in texts]
    found = documents_with_unassigned(b"".join(encoded), offsets_of([len(data) for data in encoded]))
    assert found.tolist() == [oracle(text) for text in texts]


def test_a_whole_batch_of_every_code_point() -> None:
    from prep.tokenizer.spans import offsets_of
    from prep.tokenizer.unicode import documents_with_unassigned

    texts = ["".join(chr(c) for c in range(start, start + 64) if not 0xD800 <= c < 0xE000) + "x"
             for start in range(0, 0x110000, 64)]
    encoded = [text.encode() for text in texts]
    found = documents_with_unassigned(b"".join(encoded), offsets_of([len(data) for data in encoded]))
    assert found.tolist() == [oracle(text) for text in texts]
