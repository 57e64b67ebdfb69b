"""Gathering many small spans of the intermediates into one buffer, with few system calls.

A shard window is a key range: in each batch of each intermediate (laid out in key order by
tokenize) its tokens are one run and its texts another. Reading each document with its own
`preadv` would cost a system call and a Python iteration per document, which dominates short
documents. Instead the spans are sorted by (part, offset), neighbours closer than MERGE_GAP bytes
are read as one run into a staging buffer (the gap bytes are read and dropped: copying a few KiB
from the page cache is cheaper than a system call), and numpy copies every span from the staging
buffer to its place in the output, STAGE_BYTES of runs at a time. Memory: the staging buffer and
its index arrays, never the intermediates.
"""

from __future__ import annotations

import functools
import os
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from prep.errors import IntegrityError
from prep.workfiles.intermediate import pread_into

MAX_OPEN_FILES = 256
MERGE_GAP = 8192
"""Spans this close in one file are read with one system call (about a syscall's cost in copying)."""
STAGE_BYTES = 512 << 10
"""Bytes of runs read before numpy places their spans (bounds the staging buffer and its indexes)."""
DIRECT_BYTES = 1 << 10
"""Spans at least this large are read straight to their place, one call each: per-byte index
arithmetic costs far more than a call for them (long documents)."""
_PART_SHIFT = 44  # (part << 44) + offset sorts spans by file then offset; intermediates stay below 16 TiB


class PartReader:
    """Positional reads from the intermediates, keeping a bounded number of files open.

    Not memory maps: the kernel maps whole large page-cache folios on each fault, so mapped
    intermediates show up as resident memory of the size of the corpus."""

    def __init__(self, paths: Sequence[Path]) -> None:
        self._paths = list(paths)
        self._open: OrderedDict[int, int] = OrderedDict()
        self._stage = bytearray(0)

    def read_into(self, part: int, offset: int, view: memoryview) -> None:
        """Fill `view` from `part` at `offset`; IntegrityError when the file is shorter."""
        if pread_into(self._fd(part), view, offset) < len(view):  # a truncated intermediate
            raise IntegrityError(f"{self._paths[part]}: shorter than its metadata says")

    def gather(self, out: np.ndarray, parts: np.ndarray, offsets: np.ndarray, sizes: np.ndarray,
               targets: np.ndarray) -> None:
        """Copy span i (`sizes[i]` bytes of `parts[i]` at `offsets[i]`) to `out[targets[i]:]`
        for every span, reading neighbouring spans of a file with one system call."""
        sizes = np.asarray(sizes, dtype=np.int64)
        large = np.flatnonzero(sizes >= DIRECT_BYTES)
        if len(large):
            self._read_direct(out, np.asarray(parts, dtype=np.int64)[large], np.asarray(offsets, dtype=np.int64)[large],
                              sizes[large], np.asarray(targets, dtype=np.int64)[large])
        used = np.flatnonzero((sizes > 0) & (sizes < DIRECT_BYTES))
        if not len(used):
            return
        spans = _Spans.sorted(np.asarray(parts, dtype=np.int64)[used], np.asarray(offsets, dtype=np.int64)[used],
                              np.asarray(sizes, dtype=np.int64)[used], np.asarray(targets, dtype=np.int64)[used])
        run_first, run_start, run_end = spans.runs()
        run_bytes = run_end - run_start
        batch = (np.cumsum(run_bytes) - run_bytes) // STAGE_BYTES
        edges = np.flatnonzero(np.diff(batch, prepend=-1, append=batch[-1] + 1))
        for low, high in zip(edges[:-1].tolist(), edges[1:].tolist()):
            self._gather_batch(out, spans, run_first, run_start, run_end, low, high)

    def _read_direct(self, out: np.ndarray, parts: np.ndarray, offsets: np.ndarray, sizes: np.ndarray,
                     targets: np.ndarray) -> None:
        """Read each span straight into its place in `out`, in file order."""
        view = memoryview(out.data).cast("B")
        spans = _Spans.sorted(parts, offsets, sizes, targets)
        for part, offset, size, target in zip(spans.part.tolist(), spans.offset.tolist(), spans.size.tolist(),
                                              spans.target.tolist()):
            self.read_into(part, offset, view[target:target + size])

    def _gather_batch(self, out: np.ndarray, spans: _Spans, run_first: np.ndarray, run_start: np.ndarray,
                      run_end: np.ndarray, low: int, high: int) -> None:
        """Read runs [low, high) into the staging buffer, then place their spans."""
        run_at = np.cumsum(run_end[low:high] - run_start[low:high])
        total = int(run_at[-1])
        run_at -= run_end[low:high] - run_start[low:high]
        if len(self._stage) < total:
            self._stage = bytearray(max(total, STAGE_BYTES))
        view = memoryview(self._stage)
        for part, start, end, at in zip(spans.part[run_first[low:high]].tolist(), run_start[low:high].tolist(),
                                        run_end[low:high].tolist(), run_at.tolist()):
            self.read_into(part, start, view[at:at + end - start])
        first = int(run_first[low])
        last = int(run_first[high]) if high < len(run_first) else len(spans.part)
        counts = np.diff(np.append(run_first[low:high], last))
        stage_at = np.repeat(run_at - run_start[low:high], counts) + spans.offset[first:last]
        place(out, spans.target[first:last], np.frombuffer(self._stage, dtype=np.uint8), stage_at, spans.size[first:last])

    def _fd(self, part: int) -> int:
        fd = self._open.get(part)
        if fd is None:
            if len(self._open) >= MAX_OPEN_FILES:
                os.close(self._open.popitem(last=False)[1])
            fd = self._open[part] = os.open(self._paths[part], os.O_RDONLY)
        return fd

    def close(self) -> None:
        for fd in self._open.values():
            os.close(fd)
        self._open.clear()
        self._stage = bytearray(0)


def place(out: np.ndarray, targets: np.ndarray, source: np.ndarray, sources: np.ndarray, sizes: np.ndarray) -> None:
    """Copy `sizes[i]` bytes of `source` at `sources[i]` to `out` at `targets[i]`, for every i, in
    a few numpy calls: one index per item of the widest unit (8, 4, 2 or 1 bytes) that every
    offset and size is a multiple of, so token ids move 4 bytes per index rather than 1."""
    common = int(np.bitwise_or.reduce(targets | sources | sizes)) if len(sizes) else 0
    unit = 8 if common % 8 == 0 else 4 if common % 4 == 0 else 2 if common % 2 == 0 else 1
    if unit > 1:
        out, source = _units(out, unit), _units(source, unit)
        targets, sources, sizes = targets // unit, sources // unit, sizes // unit
    before = np.cumsum(sizes) - sizes
    within = np.arange(int(sizes.sum()), dtype=np.int64) - np.repeat(before, sizes)
    out[np.repeat(targets, sizes) + within] = source[np.repeat(sources, sizes) + within]


def _units(data: np.ndarray, unit: int) -> np.ndarray:
    """`data` (contiguous bytes) viewed as items of `unit` bytes; a trailing part item is left out."""
    return data[:len(data) - len(data) % unit].view(f"<u{unit}")


class _Spans:
    """Spans sorted by (part, offset): where each comes from and where it goes."""

    def __init__(self, part: np.ndarray, offset: np.ndarray, size: np.ndarray, target: np.ndarray) -> None:
        self.part, self.offset, self.size, self.target = part, offset, size, target

    @classmethod
    def sorted(cls, part: np.ndarray, offset: np.ndarray, size: np.ndarray, target: np.ndarray) -> _Spans:
        order = np.argsort((part << _PART_SHIFT) + offset, kind="stable")
        return cls(part[order], offset[order], size[order], target[order])

    def runs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(first span, start offset, end offset) of each run: spans of one file whose gaps are
        at most MERGE_GAP, cut where a run would pass STAGE_BYTES."""
        ends = self.offset + self.size
        reach = np.maximum.accumulate((self.part << _PART_SHIFT) + ends) - (self.part << _PART_SHIFT)
        new = np.ones(len(ends), dtype=bool)
        new[1:] = (self.part[1:] != self.part[:-1]) | (self.offset[1:] > reach[:-1] + MERGE_GAP)
        group_start = self.offset[new][np.cumsum(new) - 1]
        piece = (self.offset - group_start) // STAGE_BYTES
        new[1:] |= piece[1:] != piece[:-1]
        first = np.flatnonzero(new)
        return first, self.offset[first], np.maximum.reduceat(reach, first)


def scatter_blocks(blocks: np.ndarray, rows: np.ndarray, column: int, data: np.ndarray, sources: np.ndarray,
                   lengths: np.ndarray) -> None:
    """Copy piece i, `data[sources[i]:][:lengths[i]]`, into `blocks` (an (n, width) uint8 array)
    from byte `column` of row `rows[i]` on, running on into the rows after it; the rest of each
    piece's last row becomes zero. Bytes [0, column) of a piece's first row are left garbage (the
    caller writes them next). Whole rows are copied, one index per row instead of per byte, and
    the tails masked after: a tar member's data and padding in a few numpy calls."""
    width = blocks.shape[1]
    span = column + np.asarray(lengths, dtype=np.int64)
    counts = -(-span // width) * (span > 0)
    total = int(counts.sum())
    if not total:
        return
    first = np.cumsum(counts) - counts
    within = np.arange(total, dtype=np.int64) - np.repeat(first, counts)
    padded = np.zeros(len(data) + 2 * width, dtype=np.uint8)  # a row before and after: no row leaves it
    padded[width:width + len(data)] = data
    windows = np.lib.stride_tricks.as_strided(padded, shape=(len(padded) - width + 1, width), strides=(1, 1))
    targets = np.repeat(np.asarray(rows, dtype=np.int64), counts) + within
    blocks[targets] = windows[np.repeat(np.asarray(sources, dtype=np.int64) + width - column, counts) + within * width]
    used = counts > 0
    last = (first + counts - 1)[used]
    blocks[targets[last]] &= _row_masks(width)[(span - (counts - 1) * width)[used]]


@functools.cache
def _row_masks(width: int) -> np.ndarray:
    """Row f keeps the first f bytes of a row and zeroes the rest (f = 0..width)."""
    return np.where(np.arange(width)[None, :] < np.arange(width + 1)[:, None], 255, 0).astype(np.uint8)
