"""Near-duplicate normalization: Unicode NFC, then `str.lower()`, of a batch of UTF-8 documents
(the definition: prep.neardup.signatures' docstring), by Python or by the compiled pass.

Both take the same shortcut, which gives the same bytes as the definition: NFC changes nothing
across the start of a character that has a boundary before it (UAX #15: a starter, NFC quick
check Yes, that composes with no character before it: every ASCII character and most others),
and `str.lower` maps each character alone but for the capital sigma (final or not, by the
letters around it; a document holding one is normalized whole). So only the stretches between
such boundaries that hold some other character (a combining mark, a Hangul jamo, a character NFC
replaces) need Python's normalization, each alone; the rest is lowered character by character.
"""

from __future__ import annotations

import functools
import unicodedata
from collections.abc import Iterator
from typing import Any

import numpy as np

from prep.neardup import kernel

Array = np.ndarray[Any, Any]
CAPITAL_SIGMA = "\u03a3".encode()
"""The one character `str.lower` maps by its context (final or not): a text holding it is lowered whole."""
MEMO_BYTES = 16
"""Stretches up to this long are normalized once a batch (the same accented letter, dash or quote recurs)."""
UNSAFE, SIGMA = 0xFFFFFFFF, 0xFFFFFFFE
"""Case table entries (`case_table`): a character left to Python; the capital sigma (its document
goes to Python whole)."""
SEGMENTS = 4096
"""Stretches the compiled pass hands to Python at once (64 KiB)."""


def normalized(blob: bytes, offsets: Array) -> tuple[bytes, Array]:
    """The documents in NFC, lowercase, as UTF-8, with their new offsets (whitespace is left for
    `words`, which treats every run of it as one separator). The batch is lowered byte-wise at
    once, which is all an ASCII document needs (its NFC is itself); only the documents holding a
    non-ASCII byte are normalized further, found by one pass over the batch."""
    offsets = np.asarray(offsets, dtype=np.int64)
    lowered = blob.lower()
    if blob.isascii():
        return lowered, offsets
    high = np.flatnonzero(np.frombuffer(blob, dtype=np.uint8) >= 0x80)
    lengths = np.diff(offsets)
    pieces, at, memo = [], 0, dict[bytes, bytes]()
    for document in np.unique(np.searchsorted(offsets, high, "right") - 1).tolist():
        start, end = int(offsets[document]), int(offsets[document + 1])
        data = blob[start:end]
        if CAPITAL_SIGMA in data:
            text = normalized_text(data)
        else:
            inside = high[np.searchsorted(high, start):np.searchsorted(high, end)] - start
            text = b"".join(_normalized_runs(data, lowered[start:end], inside, memo))
        pieces += [lowered[at:start], text]
        lengths[document], at = len(text), end
    pieces.append(lowered[at:])
    return b"".join(pieces), np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(lengths)])


def normalized_text(data: bytes) -> bytes:
    """NFC, then lowercase, of UTF-8 `data` (the definition)."""
    return unicodedata.normalize("NFC", data.decode("utf-8")).lower().encode("utf-8")


def _memoized(data: bytes, memo: dict[bytes, bytes]) -> bytes:
    """`normalized_text(data)`, from `memo` when `data` is short enough to recur."""
    if len(data) > MEMO_BYTES:
        return normalized_text(data)
    if (text := memo.get(data)) is not None:
        return text
    return memo.setdefault(data, normalized_text(data))


def _normalized_runs(data: bytes, lowered: bytes, high: Array, memo: dict[bytes, bytes]) -> Iterator[bytes]:
    """`normalized_text(data)` in pieces, for a text without a capital sigma whose non-ASCII
    bytes are at `high` and which `lowered` is lowered byte-wise: ASCII as lowered, and each run
    of non-ASCII characters, with the ASCII character before it, normalized alone."""
    gaps = np.flatnonzero(np.diff(high) > 1)
    starts, ends = np.concatenate([high[:1], high[gaps + 1]]), np.concatenate([high[gaps] + 1, high[-1:] + 1])
    at = 0
    for start, end in zip(starts.tolist(), ends.tolist()):
        start = max(start - 1, 0)  # the ASCII character before: it may compose with what follows
        yield lowered[at:start]
        yield _memoized(data[start:end], memo)
        at = end
    yield lowered[at:]


@functools.cache
def case_table() -> Array:
    """For each code point of the Basic Multilingual Plane (uint32), its lowercase where the
    compiled pass may lower it alone: a starter that NFC leaves as it is and that composes with
    no character before it, whose lowercase is one character of as many UTF-8 bytes; SIGMA for
    the capital sigma, UNSAFE for every other. Built from the running Python's Unicode data (0.2 s,
    once a process, when a batch first holds a non-ASCII byte)."""
    seconds = _composition_seconds()
    table = np.full(0x10000, UNSAFE, dtype=np.uint32)
    for code in range(0x10000):
        char = chr(code)
        if 0xD800 <= code < 0xE000 or code in seconds or unicodedata.combining(char):
            continue
        lower = char.lower()
        if unicodedata.normalize("NFC", char) == char and len(lower) == 1 and \
                len(lower.encode("utf-8")) == len(char.encode("utf-8")):
            table[code] = ord(lower)
    table[ord("\u03a3")] = SIGMA
    return table


def _composition_seconds() -> set[int]:
    """Every character NFC may compose with a character before it: the second of each canonical
    two-character decomposition, and the Hangul vowel and trailing jamo (composed by rule)."""
    seconds = set(range(0x1161, 0x1176)) | set(range(0x11A8, 0x11C3))
    for code in range(0x110000):
        parts = unicodedata.decomposition(chr(code)).split()
        if len(parts) == 2 and not parts[0].startswith("<"):
            seconds.add(int(parts[1], 16))
    return seconds


def compiled_normalized(kernels: kernel.Kernels, blob: bytes, offsets: Array) -> tuple[Array, Array]:
    """`normalized(blob, offsets)` by the compiled pass (prep.neardup.native.lowered), as uint8
    with 8 zero bytes of padding (what `kernel.lanes` reads), with the new offsets."""
    offsets = np.asarray(offsets, dtype=np.int64)
    source = np.frombuffer(blob + bytes(8), dtype=np.uint8)
    out = np.zeros(len(source), dtype=np.uint8)
    table = case_table() if not blob.isascii() else np.zeros(1, dtype=np.uint32)
    whole, source_lanes, out_lanes = np.zeros(len(offsets) - 1, dtype=np.bool_), kernel.lanes(source), kernel.lanes(out)
    segments, found = np.empty((SEGMENTS, 2), dtype=np.int64), []
    document, at, documents = 0, 0, len(offsets) - 1
    while document < documents:
        document, at, count = kernels.lowered(source, source_lanes, offsets, whole, table, out, out_lanes, segments,
                                              document, at)
        found.append(segments[:count].copy())
    del source, source_lanes  # a copy of the batch: gone before the splice makes another
    stretches = _with_whole_documents(np.concatenate(found) if found else np.zeros((0, 2), dtype=np.int64),
                                      offsets, whole)
    return (out, offsets) if not len(stretches) else _spliced(blob, out, offsets, stretches)


def _with_whole_documents(stretches: Array, offsets: Array, whole: Array) -> Array:
    """`stretches` (sorted [start, end) rows) with those inside a document of `whole` replaced by
    the whole document."""
    if not whole.any():
        return stretches
    inside = whole[np.searchsorted(offsets, stretches[:, 0], "right") - 1]
    documents = np.flatnonzero(whole)
    merged = np.concatenate([stretches[~inside], np.stack([offsets[documents], offsets[documents + 1]], axis=1)])
    return merged[np.argsort(merged[:, 0], kind="stable")]


def _spliced(blob: bytes, out: Array, offsets: Array, stretches: Array) -> tuple[Array, Array]:
    """`out` with each stretch [start, end) of `blob` replaced by its normalization, and the
    documents' offsets moved by the lengths that changed."""
    pieces, at, memo = [], 0, dict[bytes, bytes]()
    lengths = np.diff(offsets)
    for start, end in stretches.tolist():
        text = _memoized(blob[start:end], memo)
        pieces += [out[at:start], np.frombuffer(text, dtype=np.uint8)]
        lengths[np.searchsorted(offsets, start, "right") - 1] += len(text) - (end - start)
        at = end
    pieces.append(out[at:])  # the rest, and the padding
    return np.concatenate(pieces), np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(lengths)])
