"""Which texts hold code points unassigned in Python's Unicode database, checked cheaply.

gigatoken's Unicode tables are newer than the reference's regex engine, so such texts go to the
reference (prep.tokenizer.backends routes them).
"""

from __future__ import annotations

import functools
import sys
import unicodedata
from typing import Any

import numpy as np

from prep.machinecache import derived_bytes


@functools.cache
def _unassigned_tables() -> tuple[np.ndarray[Any, np.dtype[np.bool_]], np.ndarray[Any, np.dtype[np.bool_]]]:
    """Lookup tables of code points unassigned in Python's Unicode database (category Cn).

    The second table covers UTF-16 code units and also flags surrogates (astral characters).
    Building it takes about a second, so it is cached on disk under the Unicode database's
    version (the only thing it depends on) and every worker process loads it in milliseconds."""
    unassigned = _cached_unassigned_table()
    units = unassigned[:0x10000].copy()
    units[0xD800:0xE000] = True
    return unassigned, units


def _cached_unassigned_table() -> np.ndarray[Any, np.dtype[np.bool_]]:
    def build() -> bytes:
        table = np.fromiter((unicodedata.category(chr(c)) == "Cn" for c in range(0x110000)),
                            dtype=np.bool_, count=0x110000)
        return bytes(np.packbits(table).tobytes())

    packed = np.frombuffer(derived_bytes(f"unicode-unassigned-{unicodedata.unidata_version}.bits", build),
                           dtype=np.uint8)
    if packed.size * 8 < 0x110000:  # a damaged cache entry
        packed = np.frombuffer(build(), dtype=np.uint8)
    return np.unpackbits(packed, count=0x110000).astype(np.bool_)


# Every code point below U+0378 is assigned (and stays so: Unicode never unassigns a code point).
_FIRST_UNASSIGNED = 0x378


def _compact_header() -> int | None:
    """The size of a compact non-ASCII str's header, from sys.getsizeof; None where sizes do not
    follow CPython's compact layout (header + (length + 1) * bytes per character)."""
    try:
        header = sys.getsizeof(chr(0xE9) * 2) - 3  # built at run time: no cached UTF-8 copy
        sizes = [sys.getsizeof(chr(c) * 5) for c in (0xE9, 0x100, 0x10000)]
    except TypeError:  # interpreters without sys.getsizeof for str
        return None
    return header if sizes == [header + 6, header + 12, header + 24] else None


_COMPACT_HEADER = _compact_header()


def _char_width(text: str) -> int:
    """Bytes per character of a non-ASCII str read in O(1) from its size: 1 or 4 when the size says
    so, else 0 (two bytes, or unsure).

    Hazard: sys.getsizeof also counts a cached UTF-8 (or wchar_t) copy, and non-compact strings
    are bigger, so only 1 is a proof (all code points below U+0100): any other layout is bigger than
    header + length + 1. 4 is a hint only: callers must stay correct whatever the width."""
    if _COMPACT_HEADER is None or type(text) is not str:
        return 0
    extra = sys.getsizeof(text) - _COMPACT_HEADER
    length = len(text) + 1
    return 1 if extra == length else 4 if extra == 4 * length else 0


def _any_unassigned(table: np.ndarray[Any, np.dtype[np.bool_]], codes: np.ndarray[Any, np.dtype[Any]]) -> bool:
    """True when `table` flags any of `codes`; looks up only codes at or above U+0378 (few in most text)."""
    return bool(table[codes[codes >= _FIRST_UNASSIGNED]].any())


def has_unassigned_code_point(text: str) -> bool:
    """True when `text` holds a code point unassigned in Python's Unicode database.

    gigatoken's Unicode tables are newer than the reference's regex engine: it classes characters
    added by recent Unicode versions as letters, the reference as unassigned, so they split text
    differently. Python's database (14.0 on 3.11) predates both, so its gaps cover every such
    character. Cheap checks first: ASCII and one-byte (Latin-1) strings never qualify (O(1)); then
    UTF-16 code units, whose surrogates send astral text on to a check of its UTF-32 code points."""
    if text.isascii():
        return False
    width = _char_width(text)
    if width == 1:
        return False
    unassigned, units = _unassigned_tables()
    if width != 4:
        code_units = np.frombuffer(text.encode("utf-16-le", "surrogatepass"), dtype=np.uint16)
        if not _any_unassigned(units, code_units):
            return False
    code_points = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    return _any_unassigned(unassigned, code_points)


def documents_with_unassigned(blob: bytes, offsets: np.ndarray[Any, Any]) -> np.ndarray[Any, np.dtype[np.bool_]]:
    """For each valid UTF-8 span [offsets[i], offsets[i + 1]) of `blob`: whether it holds a code
    point `has_unassigned_code_point` flags. Decodes only the lead bytes of multi-byte sequences
    (all of a batch at once, with numpy), since every code point below U+0378 is assigned."""
    found = np.zeros(len(offsets) - 1, dtype=bool)
    if blob.isascii():
        return found
    data = np.frombuffer(blob, dtype=np.uint8)
    leads = np.flatnonzero(data >= 0xCD)  # a code point from U+0340 up starts with 0xCD or more
    if not leads.size:
        return found
    last = len(data) - 1  # a lead byte's continuation bytes follow it (valid UTF-8); clip at the end
    first, second, third, fourth = (data[np.minimum(leads + k, last)].astype(np.uint32) for k in range(4))
    code = np.where(first < 0xE0, (first & 0x1F) << 6 | (second & 0x3F),
                    np.where(first < 0xF0, (first & 0x0F) << 12 | (second & 0x3F) << 6 | (third & 0x3F),
                             (first & 0x07) << 18 | (second & 0x3F) << 12 | (third & 0x3F) << 6 | (fourth & 0x3F)))
    unassigned, _ = _unassigned_tables()
    hits = leads[unassigned[np.minimum(code, 0x10FFFF)]]
    found[np.searchsorted(offsets, hits, "right") - 1] = True
    return found
