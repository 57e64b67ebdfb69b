"""Arrow inputs opened and decoded: the record batches of an Arrow file in either IPC format, and
a column's Python values with a string that is not UTF-8 marked rather than raised (nothing
validates an Arrow file's strings, on write or read)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

_FILE_MAGIC = b"ARROW1"  # the random-access format's; a stream starts with a message


@dataclass(frozen=True)
class InvalidUTF8:
    """A string value whose bytes are not UTF-8."""

    start: int  # the first bad byte


def column_values(column: Any) -> list[Any]:
    """A column's Python values; a string that is not valid UTF-8 becomes an InvalidUTF8."""
    try:
        return list(column.to_pylist())
    except UnicodeDecodeError:
        import pyarrow as pa

        return [_decoded(value) for value in column.cast(pa.large_binary()).to_pylist()]


def _decoded(value: bytes | None) -> str | InvalidUTF8 | None:
    """`value` decoded as UTF-8, or where it is not."""
    try:
        return None if value is None else value.decode("utf-8")
    except UnicodeDecodeError as exc:
        return InvalidUTF8(exc.start)


def arrow_batches(handle: BinaryIO) -> tuple[list[str], Iterator[Any]]:
    """An Arrow file's column names and record batches: a stream (what `datasets` writes) or the
    random-access file format."""
    import pyarrow
    import pyarrow.ipc

    magic = handle.read(len(_FILE_MAGIC))
    handle.seek(0)
    if magic == _FILE_MAGIC:
        file = pyarrow.ipc.open_file(handle)
        return file.schema.names, (file.get_batch(i) for i in range(file.num_record_batches))
    try:
        reader = pyarrow.ipc.open_stream(handle)
    except pyarrow.ArrowInvalid as exc:  # a stream's first bytes read as a message length: "Expected to read 1684611707 ..."
        raise ValueError(f"not an Arrow IPC stream or file ({str(exc).splitlines()[0]})") from None
    return reader.schema.names, iter(reader)
