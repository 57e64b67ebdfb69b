"""Documents as spans of one UTF-8 buffer (`blob`, n + 1 `offsets`) and their tokens as spans of
one token array: the questions the tokenizer asks of a whole batch, answered with numpy."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar, overload

import numpy as np

TokenArray = np.ndarray[Any, np.dtype[Any]]
Offsets = np.ndarray[Any, np.dtype[np.int64]]


T = TypeVar("T")


class LazySequence(Sequence[T]):
    """A sequence whose item i is made only when asked for (`_item`), so a batch of documents needs
    no object per document until something reads one (an error message, a sample)."""

    def __len__(self) -> int:
        raise NotImplementedError

    def _item(self, index: int) -> T:
        raise NotImplementedError

    @overload
    def __getitem__(self, index: int) -> T: ...
    @overload
    def __getitem__(self, index: slice) -> list[T]: ...
    def __getitem__(self, index: int | slice) -> T | list[T]:
        if isinstance(index, slice):
            return [self._item(i) for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        return self._item(index)


class _Spans(LazySequence[T]):
    """Items made from spans [offsets[i], offsets[i + 1]) of one buffer."""

    def __init__(self, offsets: Offsets) -> None:
        self._offsets = offsets

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def _bounds(self, index: int) -> slice:
        return slice(int(self._offsets[index]), int(self._offsets[index + 1]))


class SpanTexts(_Spans[str]):
    """The texts of a UTF-8 buffer with offsets, each decoded only when asked for."""

    def __init__(self, blob: bytes, offsets: Offsets) -> None:
        super().__init__(offsets)
        self._blob = blob

    def _item(self, index: int) -> str:
        return self._blob[self._bounds(index)].decode("utf-8", "surrogatepass")


class TokenSpans(_Spans[TokenArray]):
    """The token array of document i of a flat token array (a view), made only when asked for."""

    def __init__(self, flat: TokenArray, offsets: Offsets) -> None:
        super().__init__(offsets)
        self._flat = flat

    def _item(self, index: int) -> TokenArray:
        return self._flat[self._bounds(index)]


def offsets_of(sizes: Sequence[int] | np.ndarray[Any, Any]) -> Offsets:
    """The n + 1 offsets of spans of these sizes laid end to end."""
    offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(np.asarray(sizes, dtype=np.int64), out=offsets[1:])
    return offsets


def documents_containing(blob: bytes, offsets: np.ndarray[Any, Any], needles: Sequence[bytes]) -> np.ndarray[Any, Any]:
    """Whether each span [offsets[i], offsets[i + 1]) of `blob` contains any of `needles` (a
    UTF-8 needle is in a UTF-8 text exactly when its string is in the text's string)."""
    found = np.zeros(len(offsets) - 1, dtype=bool)
    for needle in needles:
        if not needle:
            found[:] = True
            continue
        starts = occurrences(blob, needle)
        document = np.searchsorted(offsets, starts, "right") - 1
        found[document[starts + len(needle) <= offsets[document + 1]]] = True
    return found


def occurrences(blob: bytes, needle: bytes) -> np.ndarray[Any, Any]:
    """Every offset where `needle` starts in `blob` (overlapping ones too). `bytes.find` runs at
    memory speed for long needles, but slowly for two or three bytes, and costs a call per
    occurrence; short needles take numpy's way instead (candidates by the first byte, kept while
    each next byte matches), one byte too: `bytes.count` alone, to tell whether a byte is rare,
    took longer than numpy's whole search (1.9 against 0.8 ms for 7.8 MB)."""
    if len(needle) >= 4:
        positions, at = [], blob.find(needle)
        while at >= 0:
            positions.append(at)
            at = blob.find(needle, at + 1)
        return np.asarray(positions, dtype=np.int64)
    data = np.frombuffer(blob, dtype=np.uint8)
    starts = np.flatnonzero(data[:max(0, len(data) - len(needle) + 1)] == needle[0])
    for index in range(1, len(needle)):
        if not starts.size:
            break
        starts = starts[data[starts + index] == needle[index]]
    return starts


def _documents_of(positions: np.ndarray[Any, Any], offsets: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    return np.searchsorted(offsets, positions, "right") - 1


def character_counts(blob: bytes, offsets: np.ndarray[Any, Any]) -> Offsets:
    """Code points of each span (UTF-8, lone surrogates encoded as three bytes, count one each)."""
    sizes = np.diff(offsets).astype(np.int64)
    if blob.isascii():
        return sizes
    continuation = np.flatnonzero((np.frombuffer(blob, dtype=np.uint8) & 0xC0) == 0x80)
    return sizes - np.bincount(_documents_of(continuation, offsets), minlength=len(sizes))


def split_tokens(flat: TokenArray, offsets: np.ndarray[Any, Any]) -> list[TokenArray]:
    """One array (a view) per document."""
    bounds = offsets.tolist()
    return [flat[start:end] for start, end in zip(bounds[:-1], bounds[1:])]


def replace_spans(flat: TokenArray, offsets: Offsets, indices: Sequence[int],
                  replacements: Sequence[TokenArray]) -> tuple[TokenArray, Offsets]:
    """The token spans with span `indices[k]` (ascending) replaced by `replacements[k]`."""
    pieces: list[TokenArray] = []
    sizes = np.diff(offsets)
    at = 0
    for index, tokens in zip(indices, replacements):
        pieces.append(flat[offsets[at]:offsets[index]])
        pieces.append(np.asarray(tokens, dtype=flat.dtype))
        sizes[index] = len(tokens)
        at = index + 1
    pieces.append(flat[offsets[at]:])
    return np.concatenate(pieces), offsets_of(sizes)
