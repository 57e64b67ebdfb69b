"""The tokenize stage's intermediate file: every document's text and token ids as raw bytes,
then a small Arrow IPC table of per-document metadata.

Layout (little-endian):
- data: per document, its token ids (the snapshot's token dtype, no EOS) then its UTF-8 text,
  documents back to back;
- metadata: an uncompressed Arrow IPC file, one record batch per tokenize batch, with the
  columns of METADATA_COLUMNS; `text_offset` and `tokens_offset` are absolute file offsets;
- footer: the metadata's offset (u64), then the magic `PREPINT2`.

Raw bytes let shard assembly copy any document's tokens and text with one positional read (into
the tar's .npy and .txt members at once), in whatever order the shuffle asks; dedup, shuffle
planning and lineage read the small table alone. Chosen by measurement over Parquet and
compressed Arrow IPC (docs/performance.md).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from prep.errors import IntegrityError, StorageIOError
from prep.formats import little_endian
from prep.hashing import Digest, HashingWriter
from prep.stages.columns import bool_column, fixed_binary_column_of, int_column, string_column, zero_based_strings
from prep.tokenizer.spans import offsets_of

MAGIC = b"PREPINT2"  # the layout of the data region is the offsets' business: readers follow them
_FOOTER = struct.Struct("<Q8s")
METADATA_COLUMNS = ("row", "id", "text_hash", "text_bytes", "n_tokens", "special", "text_offset", "tokens_offset")
COLUMNS = METADATA_COLUMNS  # every column a reader can ask for


def schema(dtype: np.dtype[Any]) -> pa.Schema:
    """The metadata table's schema; its metadata names the token dtype of the data region."""
    return pa.schema([
        ("row", pa.int64()),
        ("id", pa.string()),
        ("text_hash", pa.binary(16)),
        ("text_bytes", pa.int64()),
        ("n_tokens", pa.int32()),
        ("special", pa.bool_()),
        ("text_offset", pa.int64()),
        ("tokens_offset", pa.int64()),
    ], metadata={"token_dtype": little_endian(dtype).str})


_INTERLEAVE_BYTES = 1 << 20  # bytes interleaved at a time, so they stay in the CPU cache
_MASKED_DOCUMENTS = 64  # fewer documents in a window are copied span by span


def _interleaved(first: np.ndarray[Any, Any], first_sizes: np.ndarray[Any, Any], second: np.ndarray[Any, Any],
                 second_sizes: np.ndarray[Any, Any]) -> memoryview:
    """Spans of `first` and `second` (uint8, with these sizes) alternating: first[0], second[0], ..."""
    out = np.empty(len(first) + len(second), dtype=np.uint8)
    first_at, second_at = offsets_of(first_sizes), offsets_of(second_sizes)
    out_at = first_at + second_at
    start = 0
    while start < len(first_sizes):
        end = max(start + 1, int(np.searchsorted(out_at, out_at[start] + _INTERLEAVE_BYTES, "right")) - 1)
        if end - start < _MASKED_DOCUMENTS:
            for doc in range(start, end):
                middle = out_at[doc] + first_sizes[doc]
                out[out_at[doc]:middle] = first[first_at[doc]:first_at[doc + 1]]
                out[middle:out_at[doc + 1]] = second[second_at[doc]:second_at[doc + 1]]
        else:
            sizes = np.column_stack((first_sizes[start:end], second_sizes[start:end])).reshape(-1)
            from_first = np.repeat(np.tile(np.array([True, False]), end - start), sizes)
            window = out[out_at[start]:out_at[end]]
            window[from_first] = first[first_at[start]:first_at[end]]
            window[~from_first] = second[second_at[start]:second_at[end]]
        start = end
    return memoryview(out.data)


@contextmanager
def _io_errors(operation: str, path: Path) -> Iterator[None]:
    """Turn an OSError (Arrow's I/O errors are OSErrors too) into a StorageIOError naming `path`."""
    try:
        yield
    except OSError as exc:
        raise StorageIOError.from_os_error(operation, path, exc) from exc


class IntermediateWriter:
    """Writes a new intermediate batch by batch, hashing while writing; `digest` is the file's
    SHA-256 and size once closed (so storing it needs no second read). I/O errors name the file."""

    def __init__(self, path: Path, dtype: np.dtype[Any], durable: bool = True) -> None:
        self.path = path
        self.dtype = little_endian(dtype)
        self.schema = schema(dtype)
        with _io_errors("writing", path):
            self._file = HashingWriter(path, durable)
        self._metadata: list[pa.RecordBatch] = []
        self.digest: Digest | None = None

    def write_batch(self, rows: Sequence[int], ids: Sequence[str | None], texts: Sequence[bytes],
                    text_hashes: Sequence[bytes], specials: Sequence[bool] | np.ndarray[Any, Any],
                    tokens: Sequence[np.ndarray[Any, Any]]) -> None:
        """Append one batch of documents given one by one: their UTF-8 texts and token arrays."""
        flat = np.concatenate([np.asarray(t, dtype=self.dtype) for t in tokens]) if tokens else np.zeros(0, self.dtype)
        self.write_columns(rows, string_column(ids), b"".join(texts), offsets_of([len(text) for text in texts]),
                           b"".join(text_hashes), specials, flat, offsets_of([len(t) for t in tokens]))

    def write_columns(self, rows: Sequence[int] | np.ndarray[Any, Any], ids: pa.Array, blob: bytes,
                      text_offsets: np.ndarray[Any, Any], text_hashes: bytes,
                      specials: Sequence[bool] | np.ndarray[Any, Any], tokens: np.ndarray[Any, Any],
                      token_offsets: np.ndarray[Any, Any]) -> None:
        """Append one batch of documents: texts `blob[text_offsets[i]:text_offsets[i + 1]]`, token
        ids `tokens[token_offsets[i]:token_offsets[i + 1]]`, 16-byte text hashes end to end."""
        text_lengths = np.diff(text_offsets).astype(np.int64)
        token_counts = np.diff(token_offsets).astype(np.int64)
        token_sizes = token_counts * self.dtype.itemsize
        token_bytes = np.ascontiguousarray(tokens[token_offsets[0]:token_offsets[-1]], dtype=self.dtype).view(np.uint8)
        starts = self._file.tell() + np.cumsum(token_sizes + text_lengths) - token_sizes - text_lengths
        with _io_errors("writing", self.path):
            self._file.write(_interleaved(token_bytes, token_sizes, np.frombuffer(blob, dtype=np.uint8), text_lengths))
        self._metadata.append(pa.RecordBatch.from_arrays([
            int_column(rows, pa.int64()),
            zero_based_strings(ids),
            fixed_binary_column_of(text_hashes, 16, len(text_lengths)),
            int_column(text_lengths, pa.int64()),
            int_column(token_counts, pa.int32()),
            bool_column(specials),
            int_column(starts + token_sizes, pa.int64()),
            int_column(starts, pa.int64()),
        ], schema=self.schema))

    def close(self) -> Digest:
        if self.digest is None:
            metadata_offset = self._file.tell()
            sink = pa.BufferOutputStream()
            with ipc.new_file(sink, self.schema) as writer:
                for batch in self._metadata:
                    writer.write_batch(batch)
            with _io_errors("writing", self.path):
                self._file.write(memoryview(sink.getvalue()))
                self._file.write(_FOOTER.pack(metadata_offset, MAGIC))
                self.digest = self._file.close()
        return self.digest

    def __enter__(self) -> IntermediateWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is None:
            self.close()
        else:
            with suppress(OSError):  # closing flushes, which fails again on a full disk
                self._file.__exit__(exc_type, exc, tb)


class Intermediate:
    """Read access to one intermediate's metadata: column projection, batch by batch."""

    def __init__(self, path: Path, columns: Sequence[str] = METADATA_COLUMNS) -> None:
        unknown = set(columns) - set(METADATA_COLUMNS)
        if unknown:
            raise ValueError(f"unknown intermediate columns: {sorted(unknown)}")
        with _io_errors("reading", path):
            mapped = pa.memory_map(str(path), "r")
            size = mapped.size()
            if size < _FOOTER.size:
                raise IntegrityError(f"{path}: {size} bytes is too short for an intermediate")
            mapped.seek(size - _FOOTER.size)
            metadata_offset, magic = _FOOTER.unpack(mapped.read(_FOOTER.size))
            if magic != MAGIC or metadata_offset > size - _FOOTER.size:
                raise IntegrityError(f"{path}: not a prep intermediate (bad footer)")
            mapped.seek(metadata_offset)
            table = mapped.read_buffer(size - _FOOTER.size - metadata_offset)
        fields = [METADATA_COLUMNS.index(name) for name in columns]
        self._reader = ipc.open_file(table, options=ipc.IpcReadOptions(included_fields=fields))

    @property
    def token_dtype(self) -> np.dtype[Any]:
        """The dtype of the token ids in the data region."""
        dtype: np.dtype[Any] = np.dtype(self._reader.schema.metadata[b"token_dtype"].decode())
        return dtype

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
    """The given metadata columns of every document, in row order."""
    return Intermediate(path, columns).table()


def hash_pairs(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A `text_hash` column as an (n, 2) array of little-endian uint64 halves."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    buffer = array.buffers()[1]
    if buffer is None or len(array) == 0:
        return np.zeros((0, 2), dtype="<u8")
    return np.frombuffer(buffer, dtype="<u8", count=2 * len(array), offset=array.offset * 16).reshape(-1, 2)
