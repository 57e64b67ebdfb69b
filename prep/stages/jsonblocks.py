"""JSON Lines read a block at a time: Arrow's JSON parser fills the text and id columns of many
lines in one call, with no Python object per line.

Arrow's parser is not Python's `json`: it skips blank lines, reads two objects on one line, takes
a leading BOM, nesting `json` cannot recurse into and invalid UTF-8 in fields it ignores, and
refuses lone surrogate escapes, repeated keys and integer ids. So a block is taken from it only
when it surely reads every line as `json.loads` does: the block is valid UTF-8 without a BOM,
every line holds an object nested at most MAX_BRACKETS_PER_LINE deep, Arrow reads one row per
line, and no text or id is missing. Any other block is read line by line (`read.line_rows`), so
every decision and error message stays the per-line reader's; so is a block of long lines when
pysimdjson is installed (it is faster there, and a few calls per block cost nothing), and every
block of a task that reads metadata fields (their values may be any JSON).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.json as pa_json

from prep.inputs.lines import LongLine, iter_line_blocks
from prep.inputs.sources import open_decoded
from prep.stages import read
from prep.stages.read import BadRecord, ReadTask, line_rows
from prep.stages.textcolumns import TextColumns, chunks_of
from prep.workfiles.columns import string_bytes

BLOCK_BYTES = 8 << 20
# Blocks of lines this long on average go line by line when pysimdjson is installed: it parses long
# strings several times faster than Arrow, and the cost per line no longer matters.
LONG_LINE_BYTES = 1024
MAX_BRACKETS_PER_LINE = 100  # the per-line reader sends deeper lines to json (see read._MAX_FAST_DEPTH)
_BOM = b"\xef\xbb\xbf"
_ID_TYPES = (pa.string(), pa.int64())  # json's ids are strings or integers; int64 fits most integers


def _line_bounds(data: np.ndarray[Any, np.dtype[np.uint8]]) -> np.ndarray[Any, np.dtype[np.int64]]:
    """Offsets where each line of a block starts, then the block's end."""
    newlines = np.flatnonzero(data == ord("\n"))
    starts = np.concatenate(([0], newlines + 1)).astype(np.int64)
    return starts if starts[-1] == len(data) else np.append(starts, len(data))


def _per_span(data: np.ndarray[Any, np.dtype[np.uint8]], bounds: np.ndarray[Any, np.dtype[np.int64]],
              chars: str) -> np.ndarray[Any, Any]:
    """How many of the bytes `chars` each span [bounds[i], bounds[i + 1]) of `data` holds (one pass)."""
    codes = [ord(char) for char in chars]
    found = data == codes[0]
    for code in codes[1:]:
        found |= data == code
    return np.diff(np.searchsorted(np.flatnonzero(found), bounds))


def _has_bom(data: np.ndarray[Any, np.dtype[np.uint8]]) -> bool:
    """Whether a UTF-8 BOM stands anywhere in `data` (numpy finds its first byte several times
    faster than `bytes` finds all three)."""
    first = data == _BOM[0]
    if not first.any():
        return False
    at = np.flatnonzero(first)
    at = at[at + 2 < len(data)]
    return bool(((data[at + 1] == _BOM[1]) & (data[at + 2] == _BOM[2])).any())


def _object_lines(block: bytes, bounds: np.ndarray[Any, np.dtype[np.int64]]) -> np.ndarray[Any, Any] | None:
    """Each line's count of `{` and `[` when every line is valid UTF-8 without a BOM and has a `{`,
    else None. A line that starts with `{` has one; only a block with other lines counts `{` alone."""
    data = np.frombuffer(block, dtype=np.uint8)
    if _has_bom(data) or not valid_utf8(block):
        return None
    if not (data[bounds[:-1]] == ord("{")).all() and not _per_span(data, bounds, "{").all():
        return None
    return _per_span(data, bounds, "{[")


_ESCAPED_BRACKETS = re.compile(rb"\\u00(5b|5B|7b|7B)")


def _shallow_lines(block: bytes, bounds: np.ndarray[Any, np.dtype[np.int64]], opening: np.ndarray[Any, Any],
                   blob: bytes, offsets: np.ndarray[Any, np.dtype[np.int64]]) -> bool:
    """True when no line nests deeper than MAX_BRACKETS_PER_LINE. A line's brackets outside its
    text bound its depth; they are its brackets (`opening` counts its `{` and `[`) less its text's,
    unless a text may spell one as an escape; lines still over the bound are measured (`nesting_depth`)."""
    if opening.max(initial=0) <= MAX_BRACKETS_PER_LINE:
        return True
    data = np.frombuffer(block, dtype=np.uint8)
    if not _ESCAPED_BRACKETS.search(block):
        opening = opening - _per_span(np.frombuffer(blob, dtype=np.uint8), offsets, "{[")
    crowded = np.flatnonzero(opening > MAX_BRACKETS_PER_LINE).tolist()
    return all(nesting_depth(data[bounds[line]:bounds[line + 1]]) <= MAX_BRACKETS_PER_LINE for line in crowded)


def nesting_depth(line: np.ndarray[Any, np.dtype[np.uint8]]) -> int:
    """How deep a valid JSON line's objects and arrays nest (brackets inside strings do not count)."""
    backslash = line == ord("\\")
    quotes = np.flatnonzero(line == ord('"'))
    if quotes.size:
        positions = np.arange(len(line))
        last_other = np.maximum.accumulate(np.where(backslash, -1, positions))  # last non-backslash at or before i
        before = quotes - 1
        run = np.where(before >= 0, before - last_other[np.maximum(before, 0)], 0)
        quotes = quotes[run % 2 == 0]  # a quote after an odd run of backslashes is escaped
    inside = np.zeros(len(line) + 1, dtype=np.int8)
    np.add.at(inside, quotes[0::2], 1)
    np.add.at(inside, quotes[1::2] + 1, -1)
    outside = np.cumsum(inside[:-1]) == 0
    step = ((line == ord("{")) | (line == ord("["))).astype(np.int64) - ((line == ord("}")) | (line == ord("]")))
    depth = np.cumsum(np.where(outside, step, 0))
    return int(depth.max()) if depth.size else 0


def valid_utf8(data: bytes) -> bool:
    """True when `data` is UTF-8 as Python's strict decoder takes it (Arrow's validator, no copy)."""
    if data.isascii():
        return True
    offsets = np.array([0, len(data)], dtype=np.int64)
    value = pa.Array.from_buffers(pa.large_binary(), 1, [None, pa.py_buffer(offsets), pa.py_buffer(data)])
    try:
        value.cast(pa.large_string())
    except pa.ArrowInvalid:
        return False
    return True


class _ArrowLines:
    """Arrow's reading of one task's blocks; remembers which id type the task's ids have."""

    def __init__(self, task: ReadTask) -> None:
        self.task = task
        self.id_types = list(_ID_TYPES)

    def _parse(self, block: bytes, id_type: pa.DataType | None) -> pa.Table | None:
        fields = [(self.task.text_field, pa.string())] + ([(self.task.id_field, id_type)] if id_type else [])
        try:
            return pa_json.read_json(pa.BufferReader(block),
                                     read_options=pa_json.ReadOptions(use_threads=False, block_size=len(block) + 1),
                                     parse_options=pa_json.ParseOptions(explicit_schema=pa.schema(fields),
                                                                        unexpected_field_behavior="ignore"))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return None

    def columns(self, block: bytes, lines: int) -> tuple[pa.Array, pa.Array] | None:
        """The block's texts and ids when Arrow reads exactly one row per line and no value is missing."""
        for id_type in self.id_types if self.task.id_field is not None else [None]:
            table = self._parse(block, id_type)
            if table is None or table.num_rows != lines:
                continue
            texts = table.column(0).combine_chunks()
            ids = table.column(1).combine_chunks() if id_type is not None else None
            if texts.null_count or (ids is not None and ids.null_count):
                return None
            if id_type is not None and id_type != self.id_types[0]:
                self.id_types.sort(key=lambda kind: kind != id_type)  # try this task's id type first
            return texts, (ids.cast(pa.string()) if ids is not None else pa.nulls(lines, pa.string()))
        return None


def _block_items(task: ReadTask, arrow: _ArrowLines, block: bytes, first_local: int,
                 parse: Any) -> tuple[list[TextColumns | BadRecord], int]:
    """The block's documents and bad records in order, and how many lines it held."""
    bounds = _line_bounds(np.frombuffer(block, dtype=np.uint8))
    lines = max(1, len(bounds) - 1)  # an empty block is one empty line
    if task.metadata_fields or parse is not None and len(block) >= LONG_LINE_BYTES * lines:
        return _by_lines(task, parse, block, lines, first_local), lines  # metadata: any value, spelled by json
    if len(block) > task.max_document_bytes and int(np.diff(bounds).max()) > task.max_document_bytes:
        return _by_lines(task, parse, block, lines, first_local), lines  # it refuses the long lines
    opening = _object_lines(block, bounds)
    if opening is not None and (found := arrow.columns(block, lines)) is not None:
        blob, offsets = string_bytes(found[0])
        if _shallow_lines(block, bounds, opening, blob, offsets):
            rows = np.arange(first_local, first_local + lines, dtype=np.int64)
            return [TextColumns(rows, found[1], blob, offsets)], lines
    return _by_lines(task, parse, block, lines, first_local), lines


def _by_lines(task: ReadTask, parse: Any, block: bytes, lines: int, first_local: int) -> list[TextColumns | BadRecord]:
    """The block read by the per-line reader."""
    return list(chunks_of(line_rows(task, parse, block.split(b"\n")[:lines], first_local)))


def jsonl_chunks(task: ReadTask, stats: dict[str, int]) -> Iterator[TextColumns | BadRecord]:
    """A JSON Lines task's documents in chunks of consecutive lines, bad records in between, as the
    per-line reader reads them; `stats["lines"]` ends as the number of lines the task consumed."""
    arrow, parse = _ArrowLines(task), read.fast_line_parser()
    local = 0
    try:
        with open_decoded(task.source) as stream:
            end = task.end if not task.source.compressed else sys.maxsize
            for block in iter_line_blocks(stream, task.start, end, BLOCK_BYTES, task.max_document_bytes):
                if isinstance(block, LongLine):
                    yield read.long_line(task, local, block.length)
                    local += 1
                    continue
                items, lines = _block_items(task, arrow, block, local, parse)
                local += lines
                yield from items
    finally:
        stats["lines"] = local
