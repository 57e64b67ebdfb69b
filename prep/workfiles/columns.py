"""Arrow columns made from and read into numpy and Python values through their buffers.

pyarrow's own conversions (`pa.array`, `pa.scalar`, `to_numpy`, `to_pylist`, and compute functions
given Python values) import pandas on first use when
it is installed, which costs a worker about half a second; the stages' columns are plain
integers, booleans, fixed-size hashes and strings, so their buffers are built and read directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa


def _integer_dtype(arrow_type: pa.DataType) -> np.dtype[Any]:
    if not pa.types.is_integer(arrow_type):
        raise TypeError(f"not an integer column: {arrow_type}")
    kind = "i" if pa.types.is_signed_integer(arrow_type) else "u"
    return np.dtype(f"<{kind}{arrow_type.bit_width // 8}")


def int_column(values: Sequence[int] | np.ndarray[Any, Any], arrow_type: pa.DataType) -> pa.Array:
    """An integer column without nulls of the integer type `arrow_type`."""
    dtype = _integer_dtype(arrow_type)
    data = np.ascontiguousarray(np.asarray(values, dtype=dtype))
    return pa.Array.from_buffers(arrow_type, len(data), [None, pa.py_buffer(data)])


def bool_column(values: Sequence[bool] | np.ndarray[Any, Any]) -> pa.Array:
    bits = np.packbits(np.asarray(values, dtype=bool), bitorder="little")
    return pa.Array.from_buffers(pa.bool_(), len(values), [None, pa.py_buffer(bits)])


def fixed_binary_column_of(data: bytes, width: int, count: int) -> pa.Array:
    """A fixed-size binary column of `count` values of `width` bytes laid end to end in `data`."""
    if len(data) != width * count:
        raise ValueError(f"every value must be {width} bytes")
    return pa.Array.from_buffers(pa.binary(width), count, [None, pa.py_buffer(data)])


def string_column(values: Sequence[str | None]) -> pa.Array:
    """A string column; None becomes null."""
    if None not in values:
        joined = "".join(values)  # type: ignore[arg-type]  # no None, checked
        if joined.isascii():  # O(1) in CPython: one encode for all, lengths are character counts
            offsets = np.zeros(len(values) + 1, dtype="<i4")
            offsets[1:] = np.cumsum(np.fromiter(map(len, values), dtype=np.int64, count=len(values)))  # type: ignore[arg-type]
            return pa.Array.from_buffers(pa.string(), len(values), [None, pa.py_buffer(offsets),
                                                                    pa.py_buffer(joined.encode("ascii"))])
    encoded = [b"" if value is None else value.encode("utf-8") for value in values]
    offsets = np.zeros(len(values) + 1, dtype="<i4")
    offsets[1:] = np.cumsum(np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded)))
    valid = np.fromiter((value is not None for value in values), dtype=bool, count=len(values))
    validity = None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.Array.from_buffers(pa.string(), len(values), [validity, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))],
                                 null_count=int(len(values) - valid.sum()))


def metadata_column(values: Sequence[bytes]) -> pa.Array:
    """A large-string column without nulls of these UTF-8 values (documents' metadata), laid out
    from 0 so that equal columns serialize to equal bytes however they were cut or joined."""
    offsets = np.zeros(len(values) + 1, dtype="<i8")
    np.cumsum(np.fromiter(map(len, values), dtype=np.int64, count=len(values)), out=offsets[1:])
    return pa.Array.from_buffers(pa.large_string(), len(values), [None, pa.py_buffer(offsets),
                                                                  pa.py_buffer(b"".join(values))])


def zero_based_metadata(column: pa.Array) -> pa.Array:
    """A metadata column (large strings, no nulls) laid out as `metadata_column` lays it out."""
    values, offsets = string_bytes(column)
    return pa.Array.from_buffers(pa.large_string(), len(column), [None, pa.py_buffer(offsets.astype("<i8")),
                                                                  pa.py_buffer(values)])


def string_bytes(column: pa.Array) -> tuple[bytes, np.ndarray[Any, np.dtype[np.int64]]]:
    """A string or large-string column's value bytes (from its first value to its last) and its
    n + 1 offsets into them, from 0; a null's value is empty."""
    _, offsets_buffer, data = column.buffers()
    width = "<i8" if pa.types.is_large_string(column.type) else "<i4"
    offsets = np.frombuffer(offsets_buffer, dtype=width, count=len(column) + 1,
                            offset=column.offset * np.dtype(width).itemsize).astype(np.int64)
    first, last = int(offsets[0]), int(offsets[-1])
    return (bytes(memoryview(data)[first:last]) if data is not None else b""), offsets - first


def zero_based_strings(column: pa.Array) -> pa.Array:
    """A string column laid out as string_column lays it out (buffers starting at its first value,
    a validity bitmap only with nulls), so equal columns serialize to equal bytes however they
    were cut or joined."""
    if column.null_count:
        return string_column([None] * len(column) if column.null_count == len(column) else to_strings(column))
    values, offsets = string_bytes(column)
    return pa.Array.from_buffers(pa.string(), len(column), [None, pa.py_buffer(offsets.astype("<i4")),
                                                            pa.py_buffer(values)])


def join_pieces(pool: np.ndarray, starts: np.ndarray,
                lengths: np.ndarray) -> tuple[bytes, np.ndarray]:
    """Row i of the result is `pool[starts[i, k]:starts[i, k] + lengths[i, k]]` for k = 0, 1, ...
    concatenated; returns all rows one after another and the n + 1 offsets of the rows."""
    totals = lengths.sum(axis=1)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(totals, out=offsets[1:])
    flat_lengths = lengths.reshape(-1)
    size = int(flat_lengths.sum())
    shift = np.repeat(starts.reshape(-1) - (np.cumsum(flat_lengths) - flat_lengths), flat_lengths)
    return pool[shift + np.arange(size, dtype=np.int64)].tobytes(), offsets


def scalar_of(value: int | str | bytes, arrow_type: pa.DataType) -> pa.Scalar:
    """`value` as an Arrow scalar of `arrow_type` (an integer, string or fixed-size binary type),
    for comparing a column with: `pa.scalar` converts through the same path as `pa.array`."""
    if pa.types.is_integer(arrow_type) and isinstance(value, int):
        return int_column([value], arrow_type)[0]
    if pa.types.is_string(arrow_type) and isinstance(value, str):
        return string_column([value])[0]
    if pa.types.is_fixed_size_binary(arrow_type) and isinstance(value, bytes):
        return fixed_binary_column_of(value, arrow_type.byte_width, 1)[0]
    raise TypeError(f"no {arrow_type} scalar of {type(value).__name__}")


def row_of(batch: pa.RecordBatch, index: int) -> dict[str, Any]:
    """Row `index` of `batch` as {column: Python value} (scalar by scalar, not `to_pylist`)."""
    return {name: batch.column(name)[index].as_py() for name in batch.schema.names}


FALSE = bool_column([False])[0]
"""A false Arrow scalar (for `pc.fill_null`), made without `pa.scalar`."""


def _chunks(column: pa.Array | pa.ChunkedArray) -> list[pa.Array]:
    return list(column.chunks) if isinstance(column, pa.ChunkedArray) else [column]


def to_numbers(column: pa.Array | pa.ChunkedArray) -> np.ndarray[Any, Any]:
    """An integer or boolean column without nulls as a numpy array (a copy)."""
    parts = []
    for chunk in _chunks(column):
        if chunk.null_count:
            raise ValueError("column has nulls")
        buffer = chunk.buffers()[1]
        if pa.types.is_boolean(chunk.type):
            bits = np.frombuffer(buffer, dtype=np.uint8) if buffer is not None else np.zeros(0, np.uint8)
            parts.append(np.unpackbits(bits, bitorder="little", count=chunk.offset + len(chunk))[chunk.offset:].astype(bool))
        else:
            dtype = _integer_dtype(chunk.type)
            parts.append(np.frombuffer(buffer, dtype=dtype, count=len(chunk), offset=chunk.offset * dtype.itemsize)
                         if len(chunk) else np.zeros(0, dtype))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def to_strings(column: pa.Array | pa.ChunkedArray) -> list[str | None]:
    """A string column as Python strings, None for nulls."""
    out: list[str | None] = []
    for chunk in _chunks(column):
        validity, offsets_buffer, data = chunk.buffers()
        width = "<i8" if pa.types.is_large_string(chunk.type) else "<i4"
        offsets = np.frombuffer(offsets_buffer, dtype=width, count=len(chunk) + 1,
                                offset=chunk.offset * np.dtype(width).itemsize).tolist() if len(chunk) else [0]
        raw = data.to_pybytes() if data is not None else b""
        valid = (np.unpackbits(np.frombuffer(validity, dtype=np.uint8), bitorder="little",
                               count=chunk.offset + len(chunk))[chunk.offset:].astype(bool).tolist()
                 if validity is not None and chunk.null_count else [True] * len(chunk))
        out.extend(raw[start:end].decode("utf-8") if ok else None
                   for start, end, ok in zip(offsets[:-1], offsets[1:], valid))
    return out
