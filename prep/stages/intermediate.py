"""The tokenize stage's intermediate file: every document's token ids and text as raw bytes,
then a small Arrow IPC table of per-document metadata.

Layout (little-endian):
- data: every document's token ids (the snapshot's token dtype, no EOS) back to back, then every
  document's UTF-8 text back to back, both in the same document order: order-key order for the
  tokenize stage (any key range is one run of each), else input order;
- metadata: an uncompressed Arrow IPC file, one record batch per tokenize batch, rows in input
  order, with the columns of METADATA_COLUMNS; `text_offset` and `tokens_offset` are absolute
  file offsets, so readers never depend on the data region's order;
- footer: the metadata's offset (u64), then the magic `PREPINT2`.

Raw bytes let shard assembly copy a key range's tokens (and text) with a few positional reads per
intermediate; dedup, shuffle planning and lineage read the small table alone. Chosen by
measurement over Parquet and compressed Arrow IPC (docs/performance.md).
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
from prep.stages.keys import order_keys
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


WRITE_BYTES = 8 << 20
"""Bytes of the data region put in layout order and written at a time (bounds that copy)."""


def _spans_column(data: np.ndarray[Any, Any], sizes: np.ndarray[Any, Any]) -> pa.Array:
    """Consecutive spans of `data` (uint8) with these sizes, as an Arrow array over the same memory."""
    offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    return pa.Array.from_buffers(pa.large_binary(), len(sizes), [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _values(spans: pa.Array) -> memoryview:
    """The bytes of every span of a large_binary array, end to end."""
    offsets = np.frombuffer(spans.buffers()[1], dtype=np.int64, count=len(spans) + 1, offset=spans.offset * 8)
    data = spans.buffers()[2]
    return memoryview(data)[int(offsets[0]):int(offsets[-1])] if data is not None else memoryview(b"")


@contextmanager
def _io_errors(operation: str, path: Path) -> Iterator[None]:
    """Turn an OSError (Arrow's I/O errors are OSErrors too) into a StorageIOError naming `path`."""
    try:
        yield
    except OSError as exc:
        raise StorageIOError.from_os_error(operation, path, exc) from exc


class IntermediateWriter:
    """Writes a new intermediate, hashing while writing; `digest` is the file's SHA-256 and size
    once closed (so storing it needs no second read). I/O errors name the file.

    Batches are held (their token and text buffers, not copies) until `close` writes the data
    region: with an `order_seed`, documents in order-key order (prep.stages.keys), so that any key
    range of the part is one contiguous run of tokens and one of text, and a shard window reads a
    few large runs per intermediate instead of one span per document; without one, in input order.
    Memory: the part's tokens and text, which its read task bounds (prep.stages.read.RANGE_BYTES)."""

    def __init__(self, path: Path, dtype: np.dtype[Any], durable: bool = True, order_seed: int | None = None) -> None:
        self.path = path
        self.dtype = little_endian(dtype)
        self.schema = schema(dtype)
        self.order_seed = order_seed
        with _io_errors("writing", path):
            self._file = HashingWriter(path, durable)
        self._tokens: list[pa.Array] = []
        self._texts: list[pa.Array] = []
        self._hashes: list[bytes] = []
        self._columns: list[list[pa.Array]] = []
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
        token_bytes = np.ascontiguousarray(tokens[token_offsets[0]:token_offsets[-1]], dtype=self.dtype).view(np.uint8)
        texts = np.frombuffer(blob, dtype=np.uint8)[int(text_offsets[0]):int(text_offsets[-1])]
        self._tokens.append(_spans_column(token_bytes, token_counts * self.dtype.itemsize))
        self._texts.append(_spans_column(texts, text_lengths))
        self._hashes.append(text_hashes)
        self._columns.append([
            int_column(rows, pa.int64()),
            zero_based_strings(ids),
            fixed_binary_column_of(text_hashes, 16, len(text_lengths)),
            int_column(text_lengths, pa.int64()),
            int_column(token_counts, pa.int32()),
            bool_column(specials),
        ])

    def _layout_order(self) -> np.ndarray[Any, Any]:
        """Documents in the order the data region holds them (ties keep input order)."""
        count = sum(len(column) for column in self._texts)
        if self.order_seed is None or count < 2:
            return np.arange(count, dtype=np.int64)
        hashes = np.frombuffer(b"".join(self._hashes), dtype="<u8").reshape(-1, 2)
        key_hi, key_lo = order_keys(hashes, self.order_seed)
        return np.lexsort((key_lo, key_hi))

    def _write_region(self, spans: list[pa.Array], order: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """Write every span of `spans` (one array per batch) in `order`; returns each one's file offset."""
        sizes = np.concatenate([np.diff(np.frombuffer(column.buffers()[1], dtype=np.int64)) for column in spans]) \
            if spans else np.zeros(0, dtype=np.int64)
        laid = sizes[order]
        ends = np.cumsum(laid)
        starts = np.empty(len(order), dtype=np.int64)
        starts[order] = self._file.tell() + ends - laid
        column = pa.chunked_array(spans, type=pa.large_binary())
        identity = self.order_seed is None
        low = 0
        while low < len(order):
            base = int(ends[low - 1]) if low else 0
            high = max(low + 1, int(np.searchsorted(ends, base + WRITE_BYTES, "right")))
            taken = column.slice(low, high - low) if identity else column.take(pa.array(order[low:high]))
            for chunk in taken.chunks:
                self._file.write(_values(chunk))
            low = high
        return starts

    def close(self) -> Digest:
        if self.digest is None:
            with _io_errors("writing", self.path):
                order = self._layout_order()
                tokens_at = self._write_region(self._tokens, order)
                text_at = self._write_region(self._texts, order)
                self._tokens, self._texts = [], []
                metadata_offset = self._file.tell()
                self._file.write(memoryview(self._metadata(tokens_at, text_at)))
                self._file.write(_FOOTER.pack(metadata_offset, MAGIC))
                self.digest = self._file.close()
        return self.digest

    def _metadata(self, tokens_at: np.ndarray[Any, Any], text_at: np.ndarray[Any, Any]) -> pa.Buffer:
        """The metadata table: one record batch per written batch, with every document's offsets."""
        sink = pa.BufferOutputStream()
        first = 0
        with ipc.new_file(sink, self.schema) as writer:
            for columns in self._columns:
                last = first + len(columns[0])
                writer.write_batch(pa.RecordBatch.from_arrays(
                    [*columns, int_column(text_at[first:last], pa.int64()), int_column(tokens_at[first:last], pa.int64())],
                    schema=self.schema))
                first = last
        return sink.getvalue()

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
