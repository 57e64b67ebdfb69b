"""Megatron MMapIndexedDataset files: `.bin` (token ids back to back) and `.idx` (its index).

The layout is megatron-core's (datasets/indexed_dataset.py, _IndexWriter/_IndexReader), with one
sequence per document and explicit little-endian bytes, so equal inputs give equal files.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
import numpy.typing as npt

from prep.errors import IntegrityError, NotFoundError
from prep.formats import as_tokens, little_endian

INDEX_MAGIC = b"MMIDIDX\x00\x00"
INDEX_VERSION = 1
# magic, version u64, dtype code u8, sequence count u64, document-index count u64; no padding.
_HEADER = struct.Struct("<9sQBQQ")
HEADER_SIZE = _HEADER.size

DTYPE_CODES: Mapping[np.dtype[Any], int] = MappingProxyType(
    {
        np.dtype("u1"): 1,
        np.dtype("i1"): 2,
        np.dtype("<i2"): 3,
        np.dtype("<i4"): 4,
        np.dtype("<i8"): 5,
        np.dtype("<f8"): 6,
        np.dtype("<f4"): 7,
        np.dtype("<u2"): 8,
    }
)
"""Megatron's numeric code for each token dtype it can store (its DType enum)."""

_DTYPES_BY_CODE = {code: dtype for dtype, code in DTYPE_CODES.items()}
_INT32_MAX = 2**31 - 1

PathLike = str | os.PathLike[str]


def bin_path(prefix: PathLike) -> Path:
    """The `.bin` file of a dataset prefix (Megatron names both files prefix + suffix)."""
    return Path(f"{os.fspath(prefix)}.bin")


def idx_path(prefix: PathLike) -> Path:
    """The `.idx` file of a dataset prefix."""
    return Path(f"{os.fspath(prefix)}.idx")


def dtype_code(dtype: npt.DTypeLike) -> int:
    """Megatron's code for `dtype`; ValueError for a dtype Megatron cannot store."""
    resolved = little_endian(dtype)
    if resolved not in DTYPE_CODES:
        raise ValueError(f"Megatron cannot store tokens of dtype {resolved}")
    return DTYPE_CODES[resolved]


def _as_lengths(lengths: npt.ArrayLike) -> npt.NDArray[np.int64]:
    array = np.asarray(lengths)
    if array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
        raise ValueError("sequence lengths must be a 1-D array of integers")
    array = array.astype(np.int64)
    if array.size and (array.min() < 0 or array.max() > _INT32_MAX):
        raise ValueError("sequence lengths must be between 0 and 2**31 - 1 (stored as int32)")
    return array


def sequence_pointers(lengths: npt.ArrayLike, dtype: npt.DTypeLike) -> npt.NDArray[np.int64]:
    """Byte offset of each sequence in the `.bin` file: where the shard stage writes its tokens."""
    counts = _as_lengths(lengths)
    itemsize = little_endian(dtype).itemsize
    pointers = np.zeros(counts.size, dtype=np.int64)
    np.cumsum(counts[:-1] * itemsize, out=pointers[1:])
    return pointers


def bin_size(lengths: npt.ArrayLike, dtype: npt.DTypeLike) -> int:
    """Exact size in bytes of the `.bin` file holding sequences of these lengths."""
    return int(_as_lengths(lengths).sum()) * little_endian(dtype).itemsize


def index_size(sequence_count: int) -> int:
    """Exact size in bytes of the `.idx` file for `sequence_count` one-sequence documents."""
    return HEADER_SIZE + sequence_count * (4 + 8) + (sequence_count + 1) * 8


def index_bytes(lengths: npt.ArrayLike, dtype: npt.DTypeLike) -> bytes:
    """The whole `.idx` content for one document per sequence with these token counts."""
    return b"".join(index_pieces(lengths, dtype))


INDEX_PIECE = 1 << 20  # sequences per piece of index_pieces


def index_pieces(lengths: npt.ArrayLike, dtype: npt.DTypeLike) -> Iterator[bytes]:
    """`index_bytes` in pieces of at most INDEX_PIECE sequences, so writing it holds no more."""
    return index_pieces_of_runs([lengths], dtype)


def index_pieces_of_runs(runs: Sequence[npt.ArrayLike], dtype: npt.DTypeLike) -> Iterator[bytes]:
    """The pieces of `index_pieces` for the lengths of `runs`, one after another (a shard's
    windows): each run is kept as int32 and nothing is joined, so writing holds 4 bytes a sequence."""
    counts = [_as_lengths(run).astype("<i4") for run in runs]
    total = sum(run.size for run in counts)
    itemsize = little_endian(dtype).itemsize
    yield _HEADER.pack(INDEX_MAGIC, INDEX_VERSION, dtype_code(dtype), total, total + 1)
    for run in counts:
        for low in range(0, run.size, INDEX_PIECE):
            yield run[low:low + INDEX_PIECE].tobytes()
    base = 0
    for run in counts:
        for low in range(0, run.size, INDEX_PIECE):
            piece = run[low:low + INDEX_PIECE].astype(np.int64) * itemsize
            yield (base + np.cumsum(piece) - piece).astype("<i8").tobytes()
            base += int(piece.sum())
    for low in range(0, total + 1, INDEX_PIECE):
        yield np.arange(low, min(low + INDEX_PIECE, total + 1), dtype="<i8").tobytes()


def sequence_bytes(tokens: npt.ArrayLike, dtype: npt.DTypeLike) -> bytes:
    """The `.bin` bytes of one sequence, to be written at its `sequence_pointers` offset."""
    dtype_code(dtype)
    return as_tokens(tokens, dtype).tobytes()


def write_index(path: PathLike, lengths: npt.ArrayLike, dtype: npt.DTypeLike) -> None:
    """Write the `.idx` file for sequences of these lengths (overwrites `path`)."""
    Path(path).write_bytes(index_bytes(lengths, dtype))


def write_dataset(prefix: PathLike, sequences: Iterable[npt.ArrayLike], dtype: npt.DTypeLike) -> None:
    """Write `prefix.bin` and `prefix.idx` from whole sequences, one document each, in order."""
    lengths: list[int] = []
    with open(bin_path(prefix), "wb") as out:
        for sequence in sequences:
            data = sequence_bytes(sequence, dtype)
            out.write(data)
            lengths.append(len(data) // little_endian(dtype).itemsize)
    write_index(idx_path(prefix), np.array(lengths, dtype=np.int64), dtype)


@dataclass(frozen=True, eq=False)
class MegatronIndex:
    """A parsed `.idx` file; arrays are read-only views of the file's bytes."""

    dtype: np.dtype[Any]
    lengths: npt.NDArray[np.int32]
    pointers: npt.NDArray[np.int64]
    document_indices: npt.NDArray[np.int64]

    @property
    def sequence_count(self) -> int:
        """Number of sequences (equal to the number of documents in prep's files)."""
        return int(self.lengths.size)

    @property
    def bin_size(self) -> int:
        """Size the matching `.bin` file must have."""
        return int(self.lengths.sum(dtype=np.int64)) * self.dtype.itemsize


def parse_index(data: bytes, name: str) -> MegatronIndex:
    """Parse and check `.idx` bytes; IntegrityError naming `name` on any inconsistency."""
    if len(data) < HEADER_SIZE:
        raise IntegrityError(f"{name}: {len(data)} bytes is shorter than the {HEADER_SIZE}-byte index header")
    magic, version, code, count, document_count = _HEADER.unpack_from(data)
    if magic != INDEX_MAGIC:
        raise IntegrityError(f"{name}: not a Megatron index (magic {magic!r})")
    if version != INDEX_VERSION:
        raise IntegrityError(f"{name}: unsupported Megatron index version {version}")
    if code not in _DTYPES_BY_CODE:
        raise IntegrityError(f"{name}: unknown Megatron dtype code {code}")
    expected = HEADER_SIZE + count * (4 + 8) + document_count * 8
    if len(data) != expected:
        raise IntegrityError(
            f"{name}: {len(data)} bytes, expected {expected} for {count} sequences "
            f"and {document_count} document indices"
        )
    dtype = _DTYPES_BY_CODE[code]
    lengths = np.frombuffer(data, dtype="<i4", count=count, offset=HEADER_SIZE)
    pointers = np.frombuffer(data, dtype="<i8", count=count, offset=HEADER_SIZE + 4 * count)
    documents = np.frombuffer(data, dtype="<i8", count=document_count, offset=HEADER_SIZE + 12 * count)
    if count and lengths.min() < 0:
        raise IntegrityError(f"{name}: negative sequence length")
    if not np.array_equal(pointers, sequence_pointers(lengths, dtype)):
        raise IntegrityError(f"{name}: sequence pointers do not match the sequence lengths")
    if document_count == 0 or documents[0] != 0 or documents[-1] != count or np.any(np.diff(documents) < 0):
        raise IntegrityError(f"{name}: document indices must rise from 0 to the sequence count {count}")
    return MegatronIndex(dtype=dtype, lengths=lengths, pointers=pointers, document_indices=documents)


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise NotFoundError(f"{path}: no such file") from None


def read_index(path: PathLike) -> MegatronIndex:
    """Read and check a `.idx` file (see `parse_index`)."""
    return parse_index(_read_bytes(Path(path)), os.fspath(path))


class MegatronReader:
    """Random access to the sequences of a `.bin`/`.idx` pair through a read-only memory map."""

    def __init__(
        self,
        prefix: PathLike | None = None,
        *,
        bin_file: PathLike | None = None,
        idx_file: PathLike | None = None,
    ) -> None:
        if prefix is not None and bin_file is None and idx_file is None:
            self.bin_path, self.idx_path = bin_path(prefix), idx_path(prefix)
        elif prefix is None and bin_file is not None and idx_file is not None:
            self.bin_path, self.idx_path = Path(bin_file), Path(idx_file)
        else:
            raise ValueError("give either a path prefix or both bin_file and idx_file")
        self.index = read_index(self.idx_path)
        try:
            actual = self.bin_path.stat().st_size
        except FileNotFoundError:
            raise NotFoundError(f"{self.bin_path}: no such file") from None
        if actual != self.index.bin_size:
            raise IntegrityError(
                f"{self.bin_path}: {actual} bytes, but {self.idx_path.name} describes {self.index.bin_size}"
            )
        self._tokens: npt.NDArray[Any]
        if actual == 0:  # numpy cannot map an empty file
            self._tokens = np.empty(0, dtype=self.index.dtype)
        else:
            self._tokens = np.memmap(self.bin_path, dtype=self.index.dtype, mode="r")

    @property
    def dtype(self) -> np.dtype[Any]:
        """Token dtype recorded in the index."""
        return self.index.dtype

    def __len__(self) -> int:
        return self.index.sequence_count

    def __getitem__(self, position: int) -> npt.NDArray[Any]:
        """The tokens of sequence `position` (negative counts from the end), as a read-only view."""
        count = len(self)
        if not -count <= position < count:
            raise IndexError(f"sequence {position} out of range for {count} sequences")
        position %= count
        start = int(self.index.pointers[position]) // self.index.dtype.itemsize
        return self._tokens[start : start + int(self.index.lengths[position])]
