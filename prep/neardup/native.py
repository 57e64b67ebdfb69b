"""Near-duplicate signatures' loops compiled to machine code by numba (the `fast` extra).

Imported only by `prep.neardup.kernel`, which loads it on demand: importing numba costs a process
about a second. Each function computes integers the numpy code of `prep.neardup.signatures`
defines (its module docstring), so which one ran never shows in a signature:

* `minima`: the MinHash minimum of given shingle hashes (four shingles a pass over the
  multipliers, so each running minimum is loaded and stored once per four products);
* `text_minima`: a document's signature straight from its normalized UTF-8 in one pass: words
  (whitespace found 64 bytes a step, a bit a byte, by word-wide arithmetic; the words' edges
  taken from those bits lowest first), their hashes (8 bytes a load), shingle hashes (rolled on a
  word at a time) and the minimum, with no array the size of the text: a document of any size
  streams through a ring of `ngram` word hashes and `SCRATCH` shingle hashes;
* `lowered`: normalization where it needs no Unicode data but a case table: ASCII lowered 8
  bytes a step, every character the table (prep.neardup.normalization.case_table) calls safe
  replaced by its lowercase, every other stretch listed for Python;
* `pair_jaccards`: `verify`'s exact Jaccard of document pairs, each document's shingle hashes
  taken by the same pass as `text_minima`'s, sorted and made distinct once, each pair one merge.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

import llvmlite.binding
import numba
import numpy as np
from numba.core import config
from numba.cpython.unsafe.numbers import trailing_zeros as _trailing_zeros

# Hazard: numba's setting is the whole process's, and counts only before its first compile (numba's
# own NUMBA_CPU_FEATURES, when set, wins). LLVM tunes CPUs with AVX-512 to prefer 256-bit vectors;
# the MinHash fold runs 2.2x faster with 512-bit ones here (docs/performance.md); the integers are
# the same either way.
if getattr(config, "CPU_FEATURES", None) is None:
    config.__dict__["CPU_FEATURES"] = f"{llvmlite.binding.get_host_cpu_features().flatten()},-prefer-256-bit"

Array = np.ndarray[Any, Any]
Function = TypeVar("Function", bound=Callable[..., Any])
ALL_ONES = np.uint64(0xFFFFFFFFFFFFFFFF)
# signatures.GOLDEN, MIX1, MIX2 again: importing prep.neardup.signatures here would close an import
# cycle (signatures -> kernel -> native); tests/neardup/test_kernel.py catches any drift.
GOLDEN = np.uint64(0x9E3779B97F4A7C15)
MIX1, MIX2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
SHIFTS = np.uint64(30), np.uint64(27), np.uint64(31)
SCRATCH = 4096
"""Shingle hashes a document collects before they are folded into its minima (32 KiB: L1)."""


def _compiled(inline: bool = False) -> Callable[[Function], Function]:
    """numba's njit, cached on disk where numba finds a folder to write, releasing the GIL, without
    bounds checks (every index here is in range by construction); `inline`: into each caller, at
    numba's level."""
    options: dict[str, Any] = {"nogil": True, "boundscheck": False, "inline": "always" if inline else "never"}

    def decorate(function: Function) -> Function:
        try:
            compiled = numba.njit(cache=True, **options)(function)
        except RuntimeError:
            # Hazard: numba refuses `cache=True` when no cache folder is writable (a read-only
            # install beside an unwritable home, as in a locked-down container): compile in
            # memory instead, once a process, rather than fail the import.
            compiled = numba.njit(cache=False, **options)(function)
        return cast("Function", compiled)  # numba's Dispatcher calls as the function does

    return decorate


@_compiled(inline=True)
def _mix64(value: np.uint64) -> np.uint64:
    """splitmix64's finalizer (`signatures.mix64` on one value)."""
    value ^= value >> SHIFTS[0]
    value *= MIX1
    value ^= value >> SHIFTS[1]
    value *= MIX2
    return value ^ (value >> SHIFTS[2])


@_compiled()
def _fold(shingle_hashes: Array, start: int, end: int, multipliers: Array, lows: Array) -> None:
    """lows[i] = min(lows[i], multipliers[i] * x) (mod 2^64) for every x in shingle_hashes[start:end]."""
    permutations = multipliers.shape[0]
    at = start
    while at + 4 <= end:
        x0, x1, x2, x3 = shingle_hashes[at], shingle_hashes[at + 1], shingle_hashes[at + 2], shingle_hashes[at + 3]
        for index in range(permutations):
            a = multipliers[index]
            lows[index] = min(min(lows[index], a * x0), min(min(a * x1, a * x2), a * x3))
        at += 4
    while at < end:
        x0 = shingle_hashes[at]
        for index in range(permutations):
            lows[index] = min(lows[index], multipliers[index] * x0)
        at += 1


@_compiled()
def minima(shingle_hashes: Array, bounds: Array, multipliers: Array, out: Array) -> None:
    """out[d, i] = max(uint64) or the least `multipliers[i] * x` (mod 2^64) over the shingle
    hashes x of document d, `shingle_hashes[bounds[d]:bounds[d + 1]]`."""
    lows = np.empty(multipliers.shape[0], dtype=np.uint64)
    for document in range(bounds.shape[0] - 1):
        lows[:] = ALL_ONES
        _fold(shingle_hashes, bounds[document], bounds[document + 1], multipliers, lows)
        out[document] = lows


@_compiled(inline=True)
def _separator(text: Array, at: int, end: int) -> int:
    """The byte length of the non-ASCII whitespace character at `text[at]` (`signatures.WHITESPACE`),
    0 when it starts none: U+0085 and U+00A0 (C2 ..), U+1680 (E1 9A 80), U+2000-U+200A, U+2028,
    U+2029, U+202F (E2 80 ..), U+205F (E2 81 9F), U+3000 (E3 80 80)."""
    lead = text[at]
    if lead < 0xC2 or lead > 0xE3 or at + 1 >= end:
        return 0
    second = text[at + 1]
    if lead == 0xC2:
        return 2 if second == 0x85 or second == 0xA0 else 0
    if at + 2 >= end:
        return 0
    third = text[at + 2]
    if lead == 0xE1:
        return 3 if second == 0x9A and third == 0x80 else 0
    if lead == 0xE2:
        if second == 0x80 and (third <= 0x8A or third == 0xA8 or third == 0xA9 or third == 0xAF):
            return 3
        return 3 if second == 0x81 and third == 0x9F else 0
    return 3 if lead == 0xE3 and second == 0x80 and third == 0x80 else 0


@_compiled(inline=True)
def _word_hash(lanes: Array, start: int, end: int) -> np.uint64:
    """The hash of the word `text[start:end]` (`signatures.word_hashes`), `lanes[i]` being the
    little-endian 8 bytes at text offset i."""
    length = end - start
    total = np.uint64(0)
    lane = 0
    for at in range(start, end, 8):
        left = end - at
        value = lanes[at] if left >= 8 else lanes[at] & ((np.uint64(1) << np.uint64(8 * left)) - np.uint64(1))
        total += _mix64(value ^ (np.uint64(lane + 1) * GOLDEN))
        lane += 1
    return _mix64(total ^ np.uint64(length))


@_compiled(inline=True)
def _power(base: np.uint64, exponent: int) -> np.uint64:
    """base ** exponent (mod 2^64)."""
    value = np.uint64(1)
    for _ in range(exponent):
        value *= base
    return value


@_compiled(inline=True)
def _rolled(word: np.uint64, words: int, rolling: np.uint64, slot: int, ring: Array,
            top: np.uint64) -> tuple[np.uint64, int]:
    """Take the `words`-th word's hash: the polynomial sum(w_j * G^(k-1-j)) of the last k <= ngram
    words (what a shingle hash adds to k * G^k) rolled on, and the ring slot of the oldest word.
    `top` is G^(ngram-1), the oldest word's weight, taken out as it leaves."""
    if words < ring.shape[0]:
        ring[words] = word
        return rolling * GOLDEN + word, slot
    rolling = (rolling - ring[slot] * top) * GOLDEN + word
    ring[slot] = word
    return rolling, slot + 1 if slot + 1 < ring.shape[0] else 0


ONES, HIGH, LOW7 = np.uint64(0x0101010101010101), np.uint64(0x8080808080808080), np.uint64(0x7F7F7F7F7F7F7F7F)
TRAILING_ZEROS = cast("Callable[[np.uint64], int]", _trailing_zeros)
"""numba's intrinsic for LLVM's cttz (one instruction); typed here as what it computes."""
GATHER = np.uint64(0x0102040810204080)
"""Multiplying byte bits 0, 8, ..., 56 by this puts them at bits 56-63, in order, with no carries."""


@_compiled(inline=True)
def _lowest(bits: np.uint64) -> int:
    """The index of the lowest set bit of `bits` (not 0): one instruction (LLVM's cttz)."""
    return int(TRAILING_ZEROS(bits))


@_compiled(inline=True)
def _at_least(low7: np.uint64, bound: int) -> np.uint64:
    """Bit 7 of each byte of `low7` (bytes below 0x80) set where the byte is at least `bound` (1-128)."""
    return (low7 + np.uint64(0x80 - bound) * ONES) & HIGH


@_compiled(inline=True)
def _zero_bytes(value: np.uint64) -> np.uint64:
    """Bit 7 of each byte of `value` set exactly where the byte is zero."""
    return ~(((value & LOW7) + LOW7) | value) & HIGH


@_compiled(inline=True)
def _spaces(text: Array, chunk: np.uint64, at: int, end: int) -> tuple[np.uint64, int]:
    """Bit 7 of each of the 8 bytes at `text[at]` (`chunk`) set where it belongs to whitespace (or
    lies at or past `end`), and how many bytes past these 8 the last whitespace character runs."""
    low7 = chunk & LOW7
    spaces = ((_at_least(low7, 9) & ~_at_least(low7, 14)) | (_at_least(low7, 28) & ~_at_least(low7, 33))) & \
        ~(chunk & HIGH)
    past = end - at
    if past < 8:
        spaces |= HIGH & ~((np.uint64(1) << np.uint64(8 * past)) - np.uint64(1))
    spill = 0
    if chunk & HIGH:  # a lead byte of a wide whitespace character (prep.neardup.signatures.WIDE_WHITESPACE)?
        leads = (_zero_bytes(chunk ^ (np.uint64(0xC2) * ONES)) | _zero_bytes(chunk ^ (np.uint64(0xE1) * ONES)) |
                 _zero_bytes(chunk ^ (np.uint64(0xE2) * ONES)) | _zero_bytes(chunk ^ (np.uint64(0xE3) * ONES))) & ~spaces
        while leads:
            byte = _lowest(leads) >> 3
            width = _separator(text, at + byte, end)
            for index in range(byte, min(byte + width, 8)):
                spaces |= np.uint64(0x80) << np.uint64(8 * index)
            spill = max(spill, byte + width - 8)
            leads &= leads - np.uint64(1)
    return spaces, spill


@_compiled(inline=True)
def _packed(high: np.uint64) -> np.uint64:
    """Bit 7 of each byte of `high` (its other bits clear) gathered into the low 8 bits, byte i's at bit i."""
    return ((high >> np.uint64(7)) * GATHER) >> np.uint64(56)


@_compiled(inline=True)
def _space_mask(text: Array, lanes: Array, at: int, end: int, spill: int) -> tuple[np.uint64, int]:
    """Bit i set where `text[at + i]` (i < 64) belongs to whitespace or lies at or past `end`, and
    how many bytes past these 64 the last whitespace character runs; `spill` is that count for the
    64 bytes before."""
    mask = np.uint64(0)
    for lane in range(8):
        offset = at + 8 * lane
        spaces, next_spill = _spaces(text, lanes[offset], offset, end) if offset < end else (HIGH, 0)
        if spill:
            spaces |= HIGH & ((np.uint64(1) << np.uint64(8 * spill)) - np.uint64(1))
        spill = next_spill
        mask |= _packed(spaces) << np.uint64(8 * lane)
    return mask, spill


@_compiled()
def _document(text: Array, lanes: Array, start: int, end: int, ring: Array, scratch: Array,
              multipliers: Array, lows: Array) -> int:
    """Fold the shingle hashes of the normalized document `text[start:end]` into `lows`: 64 bytes a
    step, a bit a byte set for whitespace (word-wide arithmetic), the words' edges taken from it
    lowest bit first, each shingle's hash rolled on from the one before (a polynomial in G). The
    last `scratch`ful stays in it, and how many is returned: every shingle hash of the document, in
    text order, when `scratch` is longer than the document has shingles."""
    ngram = ring.shape[0]
    head, top = np.uint64(ngram) * _power(GOLDEN, ngram), _power(GOLDEN, ngram - 1)
    rolling = np.uint64(0)
    words = kept = spill = slot = 0
    word_start = -1
    for at in range(start, end + 1, 64):  # one byte past the end closes the last word
        spaces, spill = _space_mask(text, lanes, at, end, spill)
        before = np.uint64(0) if word_start >= 0 else np.uint64(1)  # the byte before `at`: a space?
        edges = spaces ^ ((spaces << np.uint64(1)) | before)  # where a word starts or ends
        while edges:
            edge = at + _lowest(edges)
            edges &= edges - np.uint64(1)
            if word_start < 0:
                word_start = edge
                continue
            word = _word_hash(lanes, word_start, edge)
            rolling, slot = _rolled(word, words, rolling, slot, ring, top)
            words += 1
            word_start = -1
            if words >= ngram:
                scratch[kept] = _mix64(head + rolling)
                kept += 1
                if kept == scratch.shape[0]:
                    _fold(scratch, 0, kept, multipliers, lows)
                    kept = 0
    if 0 < words < ngram:  # fewer words than a shingle: one shingle of them all
        scratch[kept] = _mix64(np.uint64(words) * _power(GOLDEN, words) + rolling)
        kept += 1
    _fold(scratch, 0, kept, multipliers, lows)
    return kept


UNSAFE, SIGMA = 0xFFFFFFFF, 0xFFFFFFFE
"""Case table entries (`lowered`): a character Python normalizes, with the character before it; the
capital sigma (its document is normalized whole). normalization.UNSAFE and SIGMA again: importing
it here would close an import cycle (tests/neardup/test_normalization.py checks they agree)."""


@_compiled(inline=True)
def _lowered_ascii(value: np.uint64) -> np.uint64:
    """8 ASCII bytes with A-Z lowered (bit 5 set where a byte is 0x41-0x5A)."""
    return value | ((_at_least(value, 0x41) & ~_at_least(value, 0x5B)) >> np.uint64(2))


@_compiled(inline=True)
def _character(text: Array, at: int, table: Array) -> tuple[int, int]:
    """The lowercase code point the case table gives the non-ASCII UTF-8 character at `text[at]`
    (UNSAFE beyond the Basic Multilingual Plane) and the character's byte length."""
    lead = int(text[at])
    if lead < 0xE0:
        return int(table[((lead & 0x1F) << 6) | (int(text[at + 1]) & 0x3F)]), 2
    if lead < 0xF0:
        return int(table[((lead & 0x0F) << 12) | ((int(text[at + 1]) & 0x3F) << 6) | (int(text[at + 2]) & 0x3F)]), 3
    return UNSAFE, 4


@_compiled(inline=True)
def _put(out: Array, at: int, code: int, width: int) -> None:
    """Write code point `code` at `out[at]` as UTF-8 of `width` (2 or 3) bytes."""
    if width == 2:
        out[at], out[at + 1] = 0xC0 | (code >> 6), 0x80 | (code & 0x3F)
    else:
        out[at], out[at + 1], out[at + 2] = 0xE0 | (code >> 12), 0x80 | ((code >> 6) & 0x3F), 0x80 | (code & 0x3F)


@_compiled(inline=True)
def _closed(segments: Array, count: int, opened: int, at: int) -> tuple[int, int]:
    """End the stretch for Python opened at `opened` (none when -1) at `at`: (stretches listed, -1)."""
    if opened < 0:
        return count, opened
    segments[count, 0], segments[count, 1] = opened, at
    return count + 1, -1


@_compiled()
def lowered(text: Array, lanes: Array, offsets: Array, whole: Array, table: Array, out: Array, out_lanes: Array,
            segments: Array, first: int, at: int) -> tuple[int, int, int]:
    """Copy the UTF-8 documents `text[offsets[d]:offsets[d + 1]]` from document `first`, byte
    `at`, to `out` (and `out_lanes`, its 8-byte view), lowercased where that is all NFC + lower
    does: ASCII (8 bytes a step), and each character whose `table` entry is a code point (its
    lowercase, of the same byte length). Every stretch Python must normalize goes to `segments`
    as [start, end): a run of other characters with the character before it (within its
    document); `whole[d]` is set for a document holding a capital sigma. Stops when `segments` is
    full; returns (document, byte, count of segments) to go on from (document == len(offsets) - 1
    when done)."""
    count = 0
    for document in range(first, offsets.shape[0] - 1):
        start, end = offsets[document], offsets[document + 1]
        at = max(at, start)
        opened = -1  # the start of the stretch being collected for Python
        previous = at  # the start of the character before `at`
        while at < end:
            if at + 8 <= end and not lanes[at] & HIGH:
                count, opened = _closed(segments, count, opened, at)
                out_lanes[at] = _lowered_ascii(lanes[at])
                previous, at = at + 7, at + 8
                continue
            byte = text[at]
            if byte < 0x80:
                count, opened = _closed(segments, count, opened, at)
                out[at] = byte | 0x20 if 0x41 <= byte <= 0x5A else byte
                previous, at = at, at + 1
                continue
            code, width = _character(text, at, table)
            if code >= SIGMA:
                whole[document] |= code == SIGMA
                if opened < 0:
                    if count == segments.shape[0]:
                        return document, previous, count
                    opened = previous
                out[at:at + width] = text[at:at + width]
            else:
                count, opened = _closed(segments, count, opened, at)
                _put(out, at, code, width)
            previous, at = at, at + width
        count, _ = _closed(segments, count, opened, end)
        at = 0
    return offsets.shape[0] - 1, 0, count


@_compiled()
def text_minima(text: Array, lanes: Array, offsets: Array, ngram: int, multipliers: Array, out: Array) -> None:
    """out[d, i] (uint32) = the MinHash signature of the normalized UTF-8 document
    `text[offsets[d]:offsets[d + 1]]`: max(uint32) everywhere for a document with no word.
    `lanes[i]` is the little-endian 8 bytes at offset i (the text padded with 8 zero bytes)."""
    ring = np.zeros(ngram, dtype=np.uint64)
    scratch = np.empty(SCRATCH, dtype=np.uint64)
    lows = np.empty(multipliers.shape[0], dtype=np.uint64)
    for document in range(offsets.shape[0] - 1):
        lows[:] = ALL_ONES
        _document(text, lanes, offsets[document], offsets[document + 1], ring, scratch, multipliers, lows)
        for index in range(lows.shape[0]):
            out[document, index] = np.uint32(lows[index] >> np.uint64(32))


@_compiled(inline=True)
def _distinct(values: Array, count: int) -> int:
    """Sort values[:count] in place and move its distinct values to the front; how many there are."""
    values[:count].sort()
    kept = 0
    for at in range(count):
        if at == 0 or values[at] != values[kept - 1]:
            values[kept] = values[at]
            kept += 1
    return kept


@_compiled(inline=True)
def _common(values: Array, a: int, a_count: int, b: int, b_count: int) -> int:
    """How many values the sorted distinct runs values[a:a + a_count] and values[b:b + b_count] share."""
    common, a_end, b_end = 0, a + a_count, b + b_count
    while a < a_end and b < b_end:
        if values[a] < values[b]:
            a += 1
        elif values[b] < values[a]:
            b += 1
        else:
            common += 1
            a += 1
            b += 1
    return common


@_compiled()
def pair_jaccards(text: Array, lanes: Array, offsets: Array, ngram: int, left: Array, right: Array, out: Array) -> None:
    """out[i] (float64) = |A ∩ B| / |A ∪ B| of the distinct shingle hashes of the normalized
    documents left[i] and right[i] (indexes into `offsets`; 1.0 when neither has a shingle), as
    `lsh.jaccard` of `signatures.shingle_sets`. Each document's hashes are collected once (room
    for (bytes + 1) // 2 + 2 of them: a word and the space after it take two bytes, but the last),
    sorted and made distinct in place; then each pair is one merge of two runs."""
    documents = offsets.shape[0] - 1
    starts = np.zeros(documents + 1, dtype=np.int64)
    for document in range(documents):
        starts[document + 1] = starts[document] + (offsets[document + 1] - offsets[document] + 1) // 2 + 2
    hashes = np.empty(starts[documents], dtype=np.uint64)
    counts = np.empty(documents, dtype=np.int64)
    ring = np.zeros(ngram, dtype=np.uint64)
    nothing = np.empty(0, dtype=np.uint64)
    for document in range(documents):
        room = hashes[starts[document]:starts[document + 1]]
        found = _document(text, lanes, offsets[document], offsets[document + 1], ring, room, nothing, nothing)
        counts[document] = _distinct(room, found)
    for index in range(left.shape[0]):
        a, b = left[index], right[index]
        common = _common(hashes, starts[a], counts[a], starts[b], counts[b])
        union = counts[a] + counts[b] - common
        out[index] = 1.0 if union == 0 else common / union
