"""Ids must be unique within an input file. A tokenize task checks its own part; a file cut into
several parts has its ids checked across all of them here, in memory that does not grow with the
file: a file of more than IDS_PER_PARTITION documents has its ids spilled to local files by a
hash of the id (one pass), and each of those partitions is checked on its own.
"""

from __future__ import annotations

import struct
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np

from prep.errors import InputError
from prep.faults import crash_point
from prep.workfiles.entries import NO_ID, gather_bytes, pack_id_column
from prep.workfiles.intermediate import Intermediate, io_errors
from prep.workfiles.keys import splitmix64

IDS_PER_PARTITION = 1 << 20
"""Ids checked in memory at once: about (longest id + 8) bytes each, sorted (18 MB for 1M
10-byte ids). A file with more is checked in ceil(ids / IDS_PER_PARTITION) partitions."""
_CHUNK = struct.Struct("<Q")  # a spilled chunk: its id count, then positions, lengths, UTF-8


def check_unique_ids(source: str, paths: Iterable[Path], spill_dir: Path | None = None) -> None:
    """Fail (InputError naming `source` and the first id seen twice, in file order) when the
    parts at `paths`, in file order, repeat an id; ids after the first missing one are not
    checked. A large file spills its ids to a temporary folder in `spill_dir`."""
    paths = list(paths)
    total = sum(batch.num_rows for path in paths for batch in _opened(path).batches())
    partitions = -(-total // IDS_PER_PARTITION)
    if partitions <= 1:
        batches = list(_id_batches(paths))
        lengths = np.concatenate([lens for _, lens, _ in batches] or [np.zeros(0, np.int64)])
        first = _first_repeat(np.arange(len(lengths), dtype=np.uint64), lengths, b"".join(b for _, _, b in batches))
    else:
        with tempfile.TemporaryDirectory(prefix="prep-idcheck-", dir=spill_dir) as folder:
            first = _check_spilled(_id_batches(paths), partitions, Path(folder))
    if first is not None:
        raise InputError(f"{source}: duplicate id {first[1]!r}")


def _opened(path: Path) -> Intermediate:
    with io_errors("reading", path):
        return Intermediate(path, ["id"])


def _id_batches(paths: list[Path]) -> Iterator[tuple[np.ndarray, np.ndarray, bytes]]:
    """(positions in the file, lengths, UTF-8) of the file's ids batch by batch, up to the first missing one."""
    position = 0
    for path in paths:
        for batch in _opened(path).batches():
            _, packed, blob = pack_id_column(batch.column(0))
            missing = np.flatnonzero(packed == NO_ID)
            cut = int(missing[0]) if len(missing) else len(packed)
            lengths = packed[:cut].astype(np.int64)  # the ids before a missing one lead the blob
            yield np.arange(position, position + cut, dtype=np.uint64), lengths, blob[:int(lengths.sum())]
            if len(missing):
                return
            position += cut


def _rows(lengths: np.ndarray, blob: bytes, pad: int) -> np.ndarray:
    """Each id zero-padded to one width (a multiple of `pad` bytes), then its length as 8 bytes."""
    longest = int(lengths.max()) if len(lengths) else 0
    width = -(-longest // pad) * pad
    rows = np.zeros((len(lengths), width + 8), dtype=np.uint8)
    rows[:, :width][np.arange(width) < lengths[:, None]] = np.frombuffer(blob, dtype=np.uint8, count=int(lengths.sum()))
    rows[:, width:] = lengths.astype("<u8").view(np.uint8).reshape(-1, 8)
    return rows


def _first_repeat(positions: np.ndarray, lengths: np.ndarray, blob: bytes) -> tuple[int, str] | None:
    """(position, id) of the lowest position that repeats an id at a lower one, or None;
    `positions` rise with the index."""
    if len(lengths) < 2:
        return None
    rows = _rows(lengths, blob, 1)
    keys = rows.view(f"S{rows.shape[1]}").reshape(-1)  # equal rows of one width are equal S values
    order = np.argsort(keys, kind="stable")
    repeats = order[1:][keys[order[1:]] == keys[order[:-1]]]
    if not len(repeats):
        return None
    first = int(repeats.min())
    return int(positions[first]), rows[first, :int(lengths[first])].tobytes().decode("utf-8")


def _partition_of(lengths: np.ndarray, blob: bytes, partitions: int) -> np.ndarray:
    """A hash of every byte of each id and its length, modulo `partitions`: the same for the same
    id in any batch (each id's own words are mixed, never the padding up to its batch's longest)."""
    rows = _rows(lengths, blob, 8)
    words = rows[:, :-8].view("<u8")
    needed = -(-lengths // 8)  # the words an id's bytes fill
    mixed = np.zeros(len(lengths), dtype=np.uint64)
    for column in range(words.shape[1]):
        mixed = np.where(column < needed, splitmix64(mixed ^ words[:, column]), mixed)
    mixed = splitmix64(mixed ^ lengths.astype(np.uint64))
    return (mixed % np.uint64(partitions)).astype(np.int64)


def _check_spilled(batches: Iterator[tuple[np.ndarray, np.ndarray, bytes]], partitions: int,
                   folder: Path) -> tuple[int, str] | None:
    """Spill the ids into `partitions` files by hash, then check each file in memory."""
    paths = [folder / f"{index:05d}.ids" for index in range(partitions)]
    handles: list[BinaryIO] = []
    with io_errors("writing", folder):
        try:
            handles = [open(path, "wb") for path in paths]  # noqa: SIM115 -- closed below, all at once
            for positions, lengths, blob in batches:
                _spill(handles, positions, lengths, blob, _partition_of(lengths, blob, partitions))
                crash_point("idcheck.mid_spill")
        finally:
            for handle in handles:
                handle.close()
    found = [repeat for path in paths if (repeat := _check_partition(path)) is not None]
    return min(found) if found else None


def _spill(handles: list[BinaryIO], positions: np.ndarray, lengths: np.ndarray, blob: bytes,
           partition: np.ndarray) -> None:
    """Append each partition's share of one batch to its file, as one chunk."""
    starts = (np.cumsum(lengths) - lengths).astype(np.uint64)
    data = np.frombuffer(blob, dtype=np.uint8)
    by_partition = np.argsort(partition, kind="stable")  # each partition's ids stay in file order
    present, first = np.unique(partition[by_partition], return_index=True)
    for index, low, high in zip(present.tolist(), first.tolist(), [*first[1:].tolist(), len(by_partition)]):
        chosen = by_partition[low:high]
        handle = handles[index]
        handle.write(_CHUNK.pack(len(chosen)))
        handle.write(positions[chosen].astype("<u8").tobytes())
        handle.write(lengths[chosen].astype("<u4").tobytes())
        handle.write(gather_bytes(data, starts[chosen], lengths[chosen]))


def _check_partition(path: Path) -> tuple[int, str] | None:
    """(position, id) of the first repeat among one partition's spilled ids, or None."""
    with io_errors("reading", path):
        data = path.read_bytes()
    positions, lengths, blobs = [], [], []
    at = 0
    while at < len(data):
        (count,) = _CHUNK.unpack_from(data, at)
        at += _CHUNK.size
        positions.append(np.frombuffer(data, dtype="<u8", count=count, offset=at))
        at += 8 * count
        chunk_lengths = np.frombuffer(data, dtype="<u4", count=count, offset=at).astype(np.int64)
        at += 4 * count
        size = int(chunk_lengths.sum())
        lengths.append(chunk_lengths)
        blobs.append(data[at:at + size])
        at += size
    if not positions:
        return None
    return _first_repeat(np.concatenate(positions), np.concatenate(lengths), b"".join(blobs))
