"""The line reader's bound: a line longer than `max_line` comes as a LongLine of its length and is
never held whole, while every other line comes as it is, for any split of the file into ranges."""

from __future__ import annotations

import io
import sys
import tracemalloc
from typing import BinaryIO, cast

from hypothesis import given, settings
from hypothesis import strategies as st

import prep.inputs.lines as line_reader
from prep.inputs.lines import LongLine, iter_line_blocks, iter_lines_in_range


def _expected(data: bytes) -> list[bytes]:
    lines = data.split(b"\n")
    return lines[:-1] if lines and lines[-1] == b"" else lines


def _split(data: bytes, cuts: list[int]) -> list[tuple[int, int]]:
    bounds = sorted({0, len(data), *(c for c in cuts if c < len(data))})
    return list(zip(bounds, bounds[1:]))


@settings(max_examples=150, deadline=None)
@given(lines=st.lists(st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")), max_size=20),
       trailing_newline=st.booleans(), cuts=st.lists(st.integers(0, 900), max_size=4),
       block=st.sampled_from([1, 3, 16, 1 << 20]), max_line=st.integers(0, 50))
def test_long_lines_come_as_their_length_and_the_rest_as_they_are(lines: list[bytes], trailing_newline: bool,
                                                                  cuts: list[int], block: int, max_line: int) -> None:
    data = b"\n".join(lines) + (b"\n" if trailing_newline and lines else b"")
    line_reader.LINE_BLOCK, original = block, line_reader.LINE_BLOCK
    try:
        found = [item for start, end in _split(data, cuts)
                 for item in iter_lines_in_range(io.BytesIO(data), start, end, max_line)]
        blocks = [item for start, end in _split(data, cuts)
                  for item in iter_line_blocks(io.BytesIO(data), start, end, block, max_line)]
    finally:
        line_reader.LINE_BLOCK = original
    expected = _expected(data)
    assert len(found) == len(expected)
    for item, line in zip(found, expected):
        assert item == line or (isinstance(item, LongLine) and item.length == len(line) > max_line)
    from_blocks = [piece for item in blocks
                   for piece in ([item] if isinstance(item, LongLine) else _expected(item))]
    assert from_blocks == found, "blocks and lines agree on every line and every long one"


class _Endless(io.RawIOBase):
    """`size` bytes of one line (no newline until the end), made as they are read, then a short line."""

    def __init__(self, size: int) -> None:
        self.left, self.tail, self.position = size, b"\nshort\n", 0

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def read(self, size: int = -1) -> bytes:
        if self.left:
            count = min(size, self.left)
            self.left -= count
            data = b"x" * count
        else:
            data, self.tail = self.tail[:size], self.tail[size:]
        self.position += len(data)
        return data


def test_a_line_of_hundreds_of_megabytes_is_skipped_holding_about_the_bound() -> None:
    """Regression: a file with no newline in gigabytes (CR-only line ends, a JSON array misnamed
    .jsonl) was assembled into one record: the whole file in memory, then the tokenizer's copies."""
    size, bound = 256 << 20, 1 << 20
    tracemalloc.start()
    try:
        found = list(iter_lines_in_range(cast(BinaryIO, _Endless(size)), 0, sys.maxsize, bound))
        blocks = list(iter_line_blocks(cast(BinaryIO, _Endless(size)), 0, sys.maxsize, 1 << 20, bound))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert found == [LongLine(size), b"short"]
    assert blocks == [LongLine(size), b"short\n"]
    assert peak < bound + 4 * line_reader.LINE_BLOCK < size // 4, f"held {peak} bytes for a {size}-byte line"
