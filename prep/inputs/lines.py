"""Lines of a JSON Lines stream split into byte ranges, read in blocks, holding at most about
`max_line` bytes of any one line: a longer line is skipped unread and reported as a LongLine
(a file with no newline in gigabytes must not become one gigabyte-sized record in memory).

A line belongs to the range holding its first byte, so adjacent ranges split a file without
overlap or loss; end = sys.maxsize reads a whole (e.g. decompressed) stream.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

LINE_BLOCK = 8 << 20  # lines are split out of blocks this large (readline per line is slower)
_PROBE = 64 << 10  # reads while finding where a range's first line starts


@dataclass(frozen=True)
class LongLine:
    """A line longer than the reader's bound, skipped: its length in bytes, without its newline."""

    length: int


def iter_lines_in_range(stream: BinaryIO, start: int, end: int,
                        max_line: int | None = None) -> Iterator[bytes | LongLine]:
    """Lines (without their newline) that START within [start, end) of a stream; a line longer
    than `max_line` comes as a LongLine instead."""
    for run in _line_runs(stream, start, end, LINE_BLOCK, max_line):
        if isinstance(run, LongLine):
            yield run
        else:
            yield from (run[:-1] if run.endswith(b"\n") else run).split(b"\n")


def iter_line_blocks(stream: BinaryIO, start: int, end: int, block_bytes: int,
                     max_line: int | None = None) -> Iterator[bytes | LongLine]:
    """The lines `iter_lines_in_range` yields, as blocks of about `block_bytes` of whole lines,
    each line ended by its newline (but a last line without one at the end of the stream); a
    line of more than `max_line` bytes that spans blocks comes as a LongLine (one within a block
    is the caller's to check)."""
    yield from _line_runs(stream, start, end, block_bytes, max_line)


def _line_runs(stream: BinaryIO, start: int, end: int, read_bytes: int,
               max_line: int | None) -> Iterator[bytes | LongLine]:
    """Runs of whole lines as read, or a LongLine for a line outgrowing `max_line` unended."""
    bound = sys.maxsize if max_line is None else max_line
    position = _line_start(stream, start)  # where the pending bytes start: always a line start
    pending: list[bytes] = []  # the bytes after the last newline, joined once one comes (not per read)
    held, carry = 0, b""
    while position < end:
        chunk, carry = (carry, b"") if carry else (stream.read(read_bytes), b"")
        if not chunk:
            if pending:
                yield b"".join(pending)  # a last line without a newline
            return
        cut = chunk.rfind(b"\n") + 1
        if not cut:
            pending.append(chunk)
            held += len(chunk)
            if held > bound:
                skipped, ended, carry = _rest_of_line(stream, read_bytes)
                yield LongLine(held + skipped)
                position += held + skipped + ended
                pending, held = [], 0
            continue
        whole = b"".join([*pending, chunk[:cut]]) if pending else chunk[:cut]
        pending, held = ([chunk[cut:]] if cut < len(chunk) else []), len(chunk) - cut
        if position + len(whole) > end:  # lines starting at or after `end` belong to the next range
            yield whole[:whole.find(b"\n", end - position - 1) + 1]
            return
        yield whole
        position += len(whole)


def _line_start(stream: BinaryIO, start: int) -> int:
    """Seek to the first line starting at or after `start` (the line holding byte start - 1 is
    the previous range's) and return its offset, reading the line it skips a block at a time."""
    if start > 0:
        stream.seek(start - 1)
        while chunk := stream.read(_PROBE):
            if (found := chunk.find(b"\n")) >= 0:
                return stream.seek(found + 1 - len(chunk), os.SEEK_CUR)
    return stream.tell()


def _rest_of_line(stream: BinaryIO, read_bytes: int) -> tuple[int, bool, bytes]:
    """Read past the end of the current line: the bytes skipped before its newline, whether one
    came (not at the end of the stream), and what the last read held after it."""
    skipped = 0
    while chunk := stream.read(read_bytes):
        if (found := chunk.find(b"\n")) >= 0:
            return skipped + found, True, chunk[found + 1:]
        skipped += len(chunk)
    return skipped, False, b""
