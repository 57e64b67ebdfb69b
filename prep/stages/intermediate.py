"""The tokenize stage's intermediate file: Arrow IPC (file format) with LZ4-compressed buffers,
one record batch per tokenize batch.

Chosen by measurement (docs/performance.md): IPC writes and reads several times faster than
Parquet for this data, and readers can project columns (dedup reads only the 16-byte hashes)
and fetch one record batch at a time (shard assembly).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from prep.cas import Digest, HashingWriter

COMPRESSION = "lz4"
COLUMNS = ("row", "id", "text", "text_hash", "text_bytes", "n_tokens", "special", "tokens")


def schema(dtype: np.dtype[Any]) -> pa.Schema:
    token_type = pa.uint16() if dtype == np.uint16 else pa.int32()
    return pa.schema([
        ("row", pa.int64()),
        ("id", pa.string()),
        ("text", pa.large_string()),
        ("text_hash", pa.binary(16)),
        ("text_bytes", pa.int64()),
        ("n_tokens", pa.int32()),
        ("special", pa.bool_()),
        ("tokens", pa.large_list(token_type)),
    ])


class IntermediateWriter:
    """Writes record batches to a new intermediate file, hashing while writing; `digest` is
    the file's SHA-256 and size once closed (so storing it needs no second read)."""

    def __init__(self, path: Path, dtype: np.dtype[Any]) -> None:
        self.schema = schema(dtype)
        self._hashing = HashingWriter(path)
        self._sink = pa.PythonFile(self._hashing, mode="w")
        self._writer = ipc.new_file(self._sink, self.schema,
                                    options=ipc.IpcWriteOptions(compression=COMPRESSION))
        self.digest: Digest | None = None

    def write(self, columns: Sequence[pa.Array]) -> None:
        self._writer.write_batch(pa.RecordBatch.from_arrays(list(columns), schema=self.schema))

    def close(self) -> None:
        if self.digest is None:
            self._writer.close()
            self.digest = self._hashing.close()

    def __enter__(self) -> IntermediateWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class Intermediate:
    """Read access to one intermediate file: column projection, batch by batch."""

    def __init__(self, path: Path, columns: Sequence[str] = COLUMNS) -> None:
        unknown = set(columns) - set(COLUMNS)
        if unknown:
            raise ValueError(f"unknown intermediate columns: {sorted(unknown)}")
        fields = [COLUMNS.index(name) for name in columns]
        self._reader = ipc.open_file(pa.memory_map(str(path), "r"),
                                     options=ipc.IpcReadOptions(included_fields=fields))

    @property
    def num_batches(self) -> int:
        return int(self._reader.num_record_batches)

    def batch(self, index: int) -> pa.RecordBatch:
        return self._reader.get_batch(index)

    def batches(self) -> Iterator[pa.RecordBatch]:
        for index in range(self.num_batches):
            yield self.batch(index)

    def table(self) -> pa.Table:
        return self._reader.read_all()


def read_columns(path: Path, columns: Sequence[str]) -> pa.Table:
    """The given columns of every row, in row order."""
    return Intermediate(path, columns).table()


def hash_pairs(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A `text_hash` column as an (n, 2) array of little-endian uint64 halves."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    buffer = array.buffers()[1]
    if buffer is None or len(array) == 0:
        return np.zeros((0, 2), dtype="<u8")
    return np.frombuffer(buffer, dtype="<u8", count=2 * len(array), offset=array.offset * 16).reshape(-1, 2)
