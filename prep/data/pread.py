"""Token rows read by position (os.pread) from files held open by descriptor, never through a memory
map: a file cut short while it is read (a `truncate`, a tool rewriting it in place) or a disk that
fails to return its bytes (EIO) is a one-line prep error naming the file, where a mapped read would
kill the process with SIGBUS.

A batch's read is planned as pieces: one per row, in the caller's order; or, when some rows overlap
or lie within GAP_BYTES of each other, one per run of such neighbours, in stream order; a piece is
split where it crosses shards. Each piece is one system call (os.pread, mapped over the pieces so
no Python runs between the calls), and one numpy assignment places and converts every row from the
pieces' bytes back to back (a strided view picks rows out of runs). A file is held by its
descriptor, so unlinking it (a cache eviction) or renaming another file over it does not change
what is read.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from prep.errors import IntegrityError, StorageIOError

# Rows whose bytes lie closer than this are read as one run: a page in between costs less to copy
# than another system call.
GAP_BYTES = 4096


class TokenFile:
    """A verified file held open for positional reads: its descriptor, path and recorded size."""

    __slots__ = ("fd", "path", "size", "note", "kind")

    def __init__(self, fd: int, path: Path, size: int, note: str = "", kind: str = "shard") -> None:
        self.fd, self.path, self.size, self.note, self.kind = fd, path, size, note, kind

    def close(self) -> None:
        """Close the descriptor (once)."""
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)

    def __del__(self) -> None:
        self.close()

    def read(self, offset: int = 0, size: int | None = None) -> bytes:
        """`size` bytes (default: to the recorded end) from `offset`, all of them or a prep error."""
        return read_pieces({0: self}, Pieces([0], [offset], [self.size - offset if size is None else size]))[0]

    def truncated(self) -> IntegrityError:
        """The error for a read that met the end of the file before the recorded size."""
        try:
            now = f"; {os.fstat(self.fd).st_size} bytes now"
        except OSError:
            now = ""
        return IntegrityError(f"{self.path}: {self.kind} is shorter than its recorded {self.size} bytes "
                              f"(truncated while being read{now}{self.note})")

    def failed(self, exc: OSError) -> StorageIOError:
        """The error for a read the system refused (EIO from a failing disk, say)."""
        reason = exc.strerror or str(exc) or type(exc).__name__
        return StorageIOError(f"reading {self.kind}", self.path, f"{reason}{self.note}", exc.errno)


@dataclass(frozen=True)
class Pieces:
    """Reads that make rows of tokens: piece i is `sizes[i]` bytes of shard `shards[i]` from byte
    `offsets[i]`; in order, the pieces are the rows' bytes back to back."""

    shards: list[int]
    offsets: list[int]
    sizes: list[int]

    def groups(self, width: int) -> Iterator[tuple[list[int], list[int]]]:
        """(shards, the positions of their pieces) for at most `width` shards at a time, in ascending
        shard order: a batch reading more files than a process may hold open reads them in turns."""
        by_shard: dict[int, list[int]] = {}
        for at, shard in enumerate(self.shards):
            by_shard.setdefault(shard, []).append(at)
        touched = sorted(by_shard)
        for first in range(0, len(touched), width):
            chosen = touched[first:first + width]
            yield chosen, sorted(at for shard in chosen for at in by_shard[shard])

    def take(self, positions: Sequence[int]) -> Pieces:
        """The pieces at `positions`, in that order."""
        return Pieces([self.shards[at] for at in positions], [self.offsets[at] for at in positions],
                      [self.sizes[at] for at in positions])


def read_in_groups(pieces: Pieces, width: int, read: Callable[[list[int], Pieces], list[bytes]]) -> list[bytes]:
    """Every piece, read `width` shards at a time (`read(shards, their pieces)`), back in piece order."""
    parts: list[bytes] = [b""] * len(pieces.shards)
    for shards, positions in pieces.groups(width):
        for at, part in zip(positions, read(shards, pieces.take(positions))):
            parts[at] = part
    return parts


@dataclass(frozen=True)
class RowReads:
    """A batch's read: `pieces`, and where its rows lie in their bytes back to back. Without `order`,
    the rows are back to back in the caller's order; with it, row `order[k]` (k-th by start) starts
    `at[k]` tokens in (rows closer than GAP_BYTES share a run)."""

    pieces: Pieces
    order: np.ndarray | None = None
    at: np.ndarray | None = None


def plan_rows(token_starts: np.ndarray, starts: np.ndarray, length: int, itemsize: int) -> RowReads:
    """The read of `length` tokens from each of `starts` of a stream whose shard i holds tokens
    [token_starts[i], token_starts[i + 1]): a run per row, unless some lie closer than GAP_BYTES:
    then runs of neighbours, in stream order. IndexError for a row outside the stream."""
    if not len(starts):
        return RowReads(Pieces([], [], []))
    first = starts.copy()
    first.sort()  # methods and count_nonzero, not np.* wrappers and .all(): on a small batch, calls cost
    if first[0] < 0 or first[-1] + length > token_starts[-1]:
        raise IndexError(f"tokens outside 0..{int(token_starts[-1])}")
    if not length:
        return RowReads(Pieces([], [], []))
    apart = first[1:] - first[:-1] > length + GAP_BYTES // itemsize
    if np.count_nonzero(apart) == len(apart):  # the common case: a run per row, read in the caller's order
        return RowReads(_row_each(token_starts, starts, length, itemsize))
    order = starts.argsort(kind="stable")
    begins = np.concatenate(([True], apart))
    run = np.cumsum(begins) - 1  # each sorted row's run
    lo = first[begins]
    hi = first[np.append(np.flatnonzero(begins)[1:] - 1, len(first) - 1)] + length  # rows of one length: the last ends it
    base = np.concatenate(([0], np.cumsum(hi - lo)[:-1]))
    return RowReads(_split_runs(token_starts, lo, hi, itemsize), order, base[run] + (first - lo[run]))


def _row_each(token_starts: np.ndarray, starts: np.ndarray, length: int, itemsize: int) -> Pieces:
    """A piece per row (more for a row crossing shards), in the rows' order."""
    after = token_starts.searchsorted(starts, side="right")  # each row's shard + 1
    shard = after - 1
    if np.count_nonzero(starts + length <= token_starts[after]) == len(starts):  # none crosses a shard's end
        return Pieces(shard.tolist(), ((starts - token_starts[shard]) * itemsize).tolist(), [length * itemsize] * len(starts))
    return _split_runs(token_starts, starts, starts + length, itemsize)


def _split_runs(token_starts: np.ndarray, lo: np.ndarray, hi: np.ndarray, itemsize: int) -> Pieces:
    """The pieces that read token ranges [lo, hi) (none empty), in their order: one per range, more for
    a range crossing shards (empty shards skipped)."""
    first = token_starts.searchsorted(lo, side="right") - 1
    last = token_starts.searchsorted(hi - 1, side="right") - 1
    if (first == last).all():  # vectorized: one piece per range
        return Pieces(first.tolist(), ((lo - token_starts[first]) * itemsize).tolist(), ((hi - lo) * itemsize).tolist())
    shards, offsets, sizes = [], [], []
    bounds = token_starts.tolist()
    for begin, end, a, b in zip(lo.tolist(), hi.tolist(), first.tolist(), last.tolist()):
        for shard in range(a, b + 1):
            start, stop = max(begin, bounds[shard]), min(end, bounds[shard + 1])
            if stop > start:
                shards.append(shard)
                offsets.append((start - bounds[shard]) * itemsize)
                sizes.append((stop - start) * itemsize)
    return Pieces(shards, offsets, sizes)


def read_pieces(files: dict[int, TokenFile], pieces: Pieces) -> list[bytes]:
    """Every piece from files[its shard]: one os.pread each, all of them or a prep error naming the
    file (a short read: the file was cut; an OSError: EIO, say)."""
    shards, offsets, sizes = pieces.shards, pieces.offsets, pieces.sizes
    fds = {shard: file.fd for shard, file in files.items()}
    try:
        parts = list(map(os.pread, map(fds.__getitem__, shards), sizes, offsets))
    except OSError:
        return _one_by_one([files[shard] for shard in shards], offsets, sizes)  # again, to name the file
    if sum(map(len, parts)) != sum(sizes):  # a pread never returns more than asked: some piece is short
        return _one_by_one([files[shard] for shard in shards], offsets, sizes)
    return parts


def _one_by_one(files: Sequence[TokenFile], offsets: Sequence[int], sizes: Sequence[int]) -> list[bytes]:
    """The pieces read one at a time; a regular file reads short only at its end, so a read that
    returns nothing before the piece is complete means the file was cut."""
    parts = []
    for file, offset, size in zip(files, offsets, sizes):
        chunks: list[bytes] = []
        try:
            while size:
                chunk = os.pread(file.fd, size, offset)
                if not chunk:
                    raise file.truncated()
                chunks.append(chunk)
                offset, size = offset + len(chunk), size - len(chunk)
        except OSError as exc:
            raise file.failed(exc) from None
        parts.append(b"".join(chunks))
    return parts


def fill(out: np.ndarray, reads: RowReads, parts: list[bytes], dtype: np.dtype[Any]) -> None:
    """`out` (rows of any integer dtype) from the bytes of `reads`' pieces, `parts`, in one
    assignment that places and converts every row."""
    if not out.size:
        return
    tokens = np.frombuffer(b"".join(parts), dtype=dtype)
    if reads.order is None or reads.at is None:
        out[...] = tokens.reshape(out.shape)
        return
    length = out.shape[1]  # below: row i of `windows` is tokens[i:i + length], a view
    windows = as_strided(tokens, (len(tokens) - length + 1, length), (dtype.itemsize,) * 2, writeable=False)
    out[reads.order] = windows[reads.at]
