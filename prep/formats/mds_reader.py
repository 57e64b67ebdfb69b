"""Reading prep's Mosaic MDS shards back (`show --at`, `verify`, tests): an `index.json`, and one
shard's samples by index through bounded positional reads that never go past the file.

Only what `prep.formats.mds` writes is accepted; anything else is an IntegrityError naming the file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import numpy.typing as npt

from prep.errors import IntegrityError, NotFoundError
from prep.formats.mds import (
    METADATA_COLUMN,
    SAMPLE_HEAD,
    TOKEN_ENCODINGS,
    UINT32,
    Sample,
    ShardEntry,
    config_bytes,
    header_size,
    index_bytes,
)
from prep.hashing import Digest, digest_descriptor
from prep.regular import open_regular

_CONFIGS = tuple((dtype, with_metadata) for dtype in TOKEN_ENCODINGS for with_metadata in (False, True))
_CONFIG_SIZES = frozenset(len(config_bytes(*config)) for config in _CONFIGS)


def _entry_of(shard: Any) -> ShardEntry:
    encoding = shard["column_encodings"][-1]
    dtype = next((dtype for dtype, known in TOKEN_ENCODINGS.items() if known == encoding), None)
    if dtype is None:
        raise ValueError(f"unknown tokens encoding {encoding!r}")
    raw = shard["raw_data"]
    return ShardEntry(raw["basename"], raw["bytes"], shard["samples"], dtype, METADATA_COLUMN in shard["column_names"])


def parse_index(data: bytes, name: str) -> tuple[ShardEntry, ...]:
    """The shards an `index.json` lists; IntegrityError naming `name` unless prep would write it so."""
    try:
        entries = tuple(_entry_of(shard) for shard in json.loads(data)["shards"])
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise IntegrityError(f"{name}: not an MDS index prep writes ({exc})") from None
    if index_bytes(entries) != data:
        raise IntegrityError(f"{name}: not an MDS index prep writes (its bytes differ from the canonical ones)")
    return entries


def _read_at(fd: int, offset: int, size: int, name: str) -> bytes:
    data = os.pread(fd, size, offset)
    if len(data) != size:  # the file shrank since its header was checked
        raise IntegrityError(f"{name}: the file ends at byte {offset + len(data)}, before {offset + size}")
    return data


def _dtype_of_config(config: bytes, name: str) -> tuple[np.dtype[Any], bool]:
    """The token dtype of a shard's config, and whether its samples have the metadata column."""
    for dtype, with_metadata in _CONFIGS:
        if config == config_bytes(dtype, with_metadata):
            return dtype, with_metadata
    raise IntegrityError(f"{name}: not an MDS shard prep writes (its config is {config[:80]!r})")


def _check_offsets(offsets: npt.NDArray[np.int64], first: int, size: int, name: str, head: int) -> None:
    if offsets[0] != first or offsets[-1] != size:
        raise IntegrityError(f"{name}: sample offsets run from {offsets[0]} to {offsets[-1]}, "
                             f"not from {first} to the file's {size} bytes")
    if np.any(np.diff(offsets) < head):
        raise IntegrityError(f"{name}: sample offsets are not {head} or more bytes apart")


def _decode_tokens(column: bytes, dtype: np.dtype[Any]) -> npt.NDArray[Any] | None:
    """A `tokens` column's 1-D array, or None if its head or length is wrong."""
    if not column or column[0] >> 2 != 1:
        return None
    width = 1 << (column[0] & 3)
    if len(column) < 1 + width:
        return None
    count = int.from_bytes(column[1:1 + width], "little")
    if count < 1 or len(column) != 1 + width + count * dtype.itemsize:
        return None
    return np.frombuffer(column, dtype=dtype, offset=1 + width)


def decode_sample(data: bytes, dtype: np.dtype[Any], where: str, with_metadata: bool = False) -> Sample:
    """One sample's bytes as a Sample; IntegrityError naming `where` on any inconsistency."""
    head = SAMPLE_HEAD + 4 * with_metadata
    sizes = np.frombuffer(data[:head], dtype=UINT32).astype(np.int64).tolist() if len(data) >= head else []
    if not sizes or head + sum(sizes) != len(data):
        raise IntegrityError(f"{where}: column sizes {sizes} do not fill its {len(data)} bytes")
    ends = np.cumsum([head, *sizes]).tolist()
    columns = [data[start:end] for start, end in zip(ends, ends[1:])]
    metadata = columns.pop(1) if with_metadata else None
    doc_id, text, column = columns
    tokens = _decode_tokens(column, dtype)
    if tokens is None:
        raise IntegrityError(f"{where}: its tokens column is not a 1-D {dtype} array")
    try:
        return Sample(tokens, text.decode("utf-8"), doc_id.decode("utf-8"), metadata)
    except UnicodeDecodeError:
        raise IntegrityError(f"{where}: its text or id is not UTF-8") from None


def _open(path: Path, digest: Digest | None) -> int:
    """A descriptor on regular file `path`, having checked its digest when one is given."""
    try:
        fd = open_regular(path)
    except FileNotFoundError:
        raise NotFoundError(f"{path}: no such file") from None
    try:
        if digest is not None and digest_descriptor(fd) != digest:
            raise IntegrityError(f"{path}: its size or SHA-256 is not those of {digest.id} ({digest.size} bytes)")
    except BaseException:
        os.close(fd)
        raise
    return fd


class ShardReader:
    """Samples of one shard file by index; IntegrityError naming the file for a truncated or corrupt one."""

    def __init__(self, path: Path, digest: Digest | None = None) -> None:
        # hazard: a flipped byte of a token id or a text keeps the layout valid; only `digest` finds it
        self.path, self.name = path, os.fspath(path)
        self._fd = _open(path, digest)
        try:
            self.dtype, self.with_metadata, self.offsets = self._read_header(os.fstat(self._fd).st_size)
        except BaseException:
            self.close()
            raise

    def _read_header(self, size: int) -> tuple[np.dtype[Any], bool, npt.NDArray[np.int64]]:
        if size < 4:
            raise IntegrityError(f"{self.name}: {size} bytes is shorter than an MDS sample count")
        count = int(np.frombuffer(_read_at(self._fd, 0, 4, self.name), dtype=UINT32)[0])
        if 4 + 4 * (count + 1) > size:
            raise IntegrityError(f"{self.name}: {size} bytes cannot hold the offsets of {count} samples")
        offsets = np.frombuffer(_read_at(self._fd, 4, 4 * (count + 1), self.name), dtype=UINT32).astype(np.int64)
        config_size = int(offsets[0]) - 4 - 4 * (count + 1)
        if config_size not in _CONFIG_SIZES:
            raise IntegrityError(f"{self.name}: not an MDS shard prep writes (a config of {config_size} bytes)")
        dtype, with_metadata = _dtype_of_config(_read_at(self._fd, 4 + 4 * (count + 1), config_size, self.name),
                                                self.name)
        _check_offsets(offsets, header_size(dtype, count, with_metadata), size, self.name,
                       SAMPLE_HEAD + 4 * with_metadata)
        return dtype, with_metadata, offsets

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, index: int) -> Sample:
        """Sample `index` (negative counts from the end)."""
        if not -len(self) <= index < len(self):
            raise IndexError(f"{self.name}: sample {index} out of range for {len(self)} samples")
        index %= len(self)
        start, end = int(self.offsets[index]), int(self.offsets[index + 1])
        return decode_sample(_read_at(self._fd, start, end - start, self.name), self.dtype,
                             f"{self.name}: sample {index}", self.with_metadata)

    def __iter__(self) -> Iterator[Sample]:
        return (self[index] for index in range(len(self)))

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> ShardReader:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
