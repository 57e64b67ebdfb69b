"""The tokenize stage's intermediate file: every document's token ids and text as raw bytes,
then a small Arrow IPC table of per-document metadata.

Layout (little-endian):
- data: batch after batch, a batch's token ids (the snapshot's token dtype, no EOS) back to back,
  then its UTF-8 texts back to back, both in the same document order: order-key order for the
  tokenize stage (any key range is one run of each per batch), else input order;
- metadata: an uncompressed Arrow IPC file, one record batch per tokenize batch, rows in input
  order, with the columns of METADATA_COLUMNS, then in a build with metadata fields the
  documents' metadata (`metadata`, large strings); `text_offset` and `tokens_offset` are absolute
  file offsets, so readers never depend on the data region's order;
- footer: the metadata's offset (u64), then the magic `PREPINT2`.

Raw bytes let shard assembly copy a key range's tokens (and text) with a few positional reads per
intermediate (a part has a few batches); dedup, shuffle planning and lineage read the small
table alone. Chosen by measurement over Parquet and compressed Arrow IPC (docs/performance.md).
"""

from __future__ import annotations

import itertools
import os
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
from prep.tokenizer.spans import offsets_of
from prep.workfiles.columns import (
    bool_column,
    fixed_binary_column_of,
    int_column,
    string_column,
    zero_based_metadata,
    zero_based_strings,
)
from prep.workfiles.keys import order_keys

MAGIC = b"PREPINT2"  # the layout of the data region is the offsets' business: readers follow them
_FOOTER = struct.Struct("<Q8s")
METADATA_COLUMNS = ("row", "id", "text_hash", "text_bytes", "n_tokens", "special", "text_offset", "tokens_offset")
METADATA = "metadata"
"""The optional last column: each document's metadata (prep.inputs.metadata), only in the
intermediates of a build with metadata fields (the others keep the layout they always had)."""
COLUMNS = (*METADATA_COLUMNS, METADATA)  # every column a reader can ask for


def schema(dtype: np.dtype[Any], with_metadata: bool = False) -> pa.Schema:
    """The metadata table's schema; its metadata names the token dtype of the data region."""
    documents = [(METADATA, pa.large_string())] if with_metadata else []
    return pa.schema([
        ("row", pa.int64()),
        ("id", pa.string()),
        ("text_hash", pa.binary(16)),
        ("text_bytes", pa.int64()),
        ("n_tokens", pa.int32()),
        ("special", pa.bool_()),
        ("text_offset", pa.int64()),
        ("tokens_offset", pa.int64()),
        *documents,
    ], metadata={"token_dtype": little_endian(dtype).str})


LAYOUT_BYTES = 1 << 20
"""Bytes of a batch put in key order at a time (bounds that copy)."""


def _spans_column(data: np.ndarray[Any, Any], sizes: np.ndarray[Any, Any]) -> pa.Array:
    """Consecutive spans of `data` (uint8) with these sizes, as an Arrow array over the same memory."""
    offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    return pa.Array.from_buffers(pa.large_binary(), len(sizes), [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _laid_out(data: np.ndarray[Any, Any], sizes: np.ndarray[Any, Any],
              order: np.ndarray[Any, Any] | None) -> Iterator[memoryview]:
    """The spans of `data` (uint8, consecutive, with these sizes) in `order` (as they are for
    None), LAYOUT_BYTES at a time: Arrow's take puts them in order without a copy of the batch."""
    if order is None:
        yield memoryview(data.data)
        return
    spans = _spans_column(data, sizes)
    ends = np.cumsum(sizes[order])
    low = 0
    while low < len(order):
        base = int(ends[low - 1]) if low else 0
        high = max(low + 1, int(np.searchsorted(ends, base + LAYOUT_BYTES, "right")))
        values = spans.take(int_column(order[low:high], pa.int64())).buffers()[2]
        if values is not None:
            yield memoryview(values)[:int(ends[high - 1]) - base]
        low = high


def _placed(sizes: np.ndarray[Any, Any], order: np.ndarray[Any, Any] | None, base: int) -> np.ndarray[Any, Any]:
    """Each span's file offset when spans of these sizes are written from `base` in `order`."""
    laid = sizes if order is None else sizes[order]
    starts: np.ndarray[Any, Any] = base + np.cumsum(laid) - laid
    if order is None:
        return starts
    placed: np.ndarray[Any, Any] = np.empty_like(starts)
    placed[order] = starts
    return placed


@contextmanager
def io_errors(operation: str, path: Path) -> Iterator[None]:
    """Turn an OSError (Arrow's I/O errors are OSErrors too) into a StorageIOError naming `path`."""
    try:
        yield
    except OSError as exc:
        raise StorageIOError.from_os_error(operation, path, exc) from exc


def pread_into(fd: int, view: memoryview, offset: int) -> int:
    """Fill `view` from `fd` at `offset` (positional reads: the file offset is untouched); the
    bytes read, fewer only at the end of the file."""
    done = 0
    while done < len(view) and (got := os.preadv(fd, [view[done:]], offset + done)):
        done += got
    return done


class IntermediateWriter:
    """Writes a new intermediate batch by batch, hashing while writing; `digest` is the file's
    SHA-256 and size once closed (so storing it needs no second read). I/O errors name the file.

    With an `order_seed`, each batch is laid out in order-key order (prep.workfiles.keys): its
    documents' tokens, then their texts, each sorted by key. Any key range of the part is then
    one run of tokens and one of text per batch (a part has a few batches), so a shard window
    reads a few large runs per intermediate instead of one span per document; and the writer
    never holds more than one batch. Without one, batches keep their documents in input order."""

    def __init__(self, path: Path, dtype: np.dtype[Any], durable: bool = True, order_seed: int | None = None,
                 with_metadata: bool = False) -> None:
        self.path = path
        self.dtype = little_endian(dtype)
        self.schema = schema(dtype, with_metadata)
        self.order_seed = order_seed
        with io_errors("writing", path):
            self._file = HashingWriter(path, durable)
        self._metadata: list[pa.RecordBatch] = []
        self._key_runs: list[np.ndarray[Any, Any]] = []
        self.digest: Digest | None = None

    def write_batch(self, rows: Sequence[int], ids: Sequence[str | None], texts: Sequence[bytes],
                    text_hashes: Sequence[bytes], specials: Sequence[bool] | np.ndarray[Any, Any],
                    tokens: Sequence[np.ndarray[Any, Any]]) -> None:
        """Append one batch of documents given one by one: their UTF-8 texts and token arrays."""
        flat = np.concatenate([np.asarray(t, dtype=self.dtype) for t in tokens]) if tokens else np.zeros(0, self.dtype)
        self.write_columns(rows, string_column(ids), b"".join(texts), offsets_of([len(text) for text in texts]),
                           b"".join(text_hashes), specials, flat, offsets_of([len(t) for t in tokens]))

    def _batch_order(self, text_hashes: bytes, count: int) -> np.ndarray[Any, Any] | None:
        """The order a batch's documents are laid out in: by the high half of the order key (what
        shard ranges cut), ties in input order; None for input order."""
        if self.order_seed is None or count < 2:
            return None
        key_hi, _ = order_keys(np.frombuffer(text_hashes, dtype="<u8", count=2 * count).reshape(-1, 2),
                               self.order_seed)
        return np.argsort(key_hi, kind="stable")

    def write_columns(self, rows: Sequence[int] | np.ndarray[Any, Any], ids: pa.Array, blob: bytes,
                      text_offsets: np.ndarray[Any, Any], text_hashes: bytes,
                      specials: Sequence[bool] | np.ndarray[Any, Any], tokens: np.ndarray[Any, Any],
                      token_offsets: np.ndarray[Any, Any], metadata: pa.Array | None = None) -> None:
        """Append one batch of documents: texts `blob[text_offsets[i]:text_offsets[i + 1]]`, token
        ids `tokens[token_offsets[i]:token_offsets[i + 1]]`, 16-byte text hashes end to end, and
        `metadata` (large strings) when the writer was made `with_metadata`."""
        if (metadata is not None) != (METADATA in self.schema.names):
            raise ValueError(f"{self.path}: a batch {'with' if metadata is not None else 'without'} metadata, "
                             f"for an intermediate {'with' if metadata is None else 'without'} it")
        text_lengths = np.diff(text_offsets).astype(np.int64)
        token_counts = np.diff(token_offsets).astype(np.int64)
        token_sizes = token_counts * self.dtype.itemsize
        token_bytes = np.ascontiguousarray(tokens[token_offsets[0]:token_offsets[-1]], dtype=self.dtype).view(np.uint8)
        texts = np.frombuffer(blob, dtype=np.uint8)[int(text_offsets[0]):int(text_offsets[-1])]
        order = self._batch_order(text_hashes, len(text_lengths))
        written = sum(batch.num_rows for batch in self._metadata)
        self._key_runs.append(written + (order if order is not None else np.arange(len(text_lengths))))
        tokens_at = _placed(token_sizes, order, self._file.tell())
        text_at = _placed(text_lengths, order, self._file.tell() + int(token_sizes.sum()))
        with io_errors("writing", self.path):
            for piece in itertools.chain(_laid_out(token_bytes, token_sizes, order), _laid_out(texts, text_lengths, order)):
                self._file.write(piece)
        self._metadata.append(pa.RecordBatch.from_arrays([
            int_column(rows, pa.int64()),
            zero_based_strings(ids),
            fixed_binary_column_of(text_hashes, 16, len(text_lengths)),
            int_column(text_lengths, pa.int64()),
            int_column(token_counts, pa.int32()),
            bool_column(specials),
            int_column(text_at, pa.int64()),
            int_column(tokens_at, pa.int64()),
            *([zero_based_metadata(metadata)] if metadata is not None else []),
        ], schema=self.schema))

    def key_runs(self) -> np.ndarray[Any, Any]:
        """Every row written so far, batch by batch, each batch's rows in the order it was laid out
        in (its key order, with an order seed): sorting these by key sorts sorted runs."""
        return np.concatenate(self._key_runs) if self._key_runs else np.zeros(0, dtype=np.int64)

    def metadata(self) -> pa.Table:
        """The metadata rows written so far, in input order (held until close in any case)."""
        return pa.Table.from_batches(self._metadata, self.schema)

    def close(self) -> Digest:
        if self.digest is None:
            metadata_offset = self._file.tell()
            sink = pa.BufferOutputStream()
            with ipc.new_file(sink, self.schema) as writer:
                for batch in self._metadata:
                    writer.write_batch(batch)
            with io_errors("writing", self.path):
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
        unknown = set(columns) - set(COLUMNS)
        if unknown:
            raise ValueError(f"unknown intermediate columns: {sorted(unknown)}")
        with io_errors("reading", path):
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
        fields = [COLUMNS.index(name) for name in columns]
        if METADATA in columns and METADATA not in ipc.open_file(table).schema.names:
            raise IntegrityError(f"{path}: an intermediate without documents' metadata")
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


def _text_spans(path: Path, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The text offsets and byte sizes of the documents at these rows of the part (each row must be
    in it), in the order given, from the part's row and text span columns (24 bytes a document)."""
    spans = read_columns(path, ["row", "text_offset", "text_bytes"])
    held = spans.column("row").to_numpy()
    order = np.argsort(held, kind="stable")
    at = order[np.minimum(np.searchsorted(held, rows, sorter=order), len(held) - 1)] if len(held) else order
    if not len(held) or bool((held[at] != rows).any()):
        raise IntegrityError(f"{path}: the intermediate holds no document at some of rows {rows[:5].tolist()}")
    return spans.column("text_offset").to_numpy()[at], spans.column("text_bytes").to_numpy()[at]


def read_text_sizes(path: Path, rows: np.ndarray) -> np.ndarray:
    """The UTF-8 byte sizes of the texts at these rows of the part, in the order given, without
    reading a text: what a reader budgets its `read_texts` calls by."""
    return _text_spans(path, rows)[1]


def read_texts(path: Path, rows: np.ndarray) -> list[bytes]:
    """The UTF-8 texts of the documents at these rows of the part (each row must be in it), in the
    order given: the part's row and text spans are read (24 bytes a document), then each text."""
    starts, sizes = _text_spans(path, rows)
    with io_errors("reading", path), open(path, "rb") as handle:
        return [os.pread(handle.fileno(), int(size), int(start)) for start, size in zip(starts, sizes)]
