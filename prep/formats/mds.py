"""Mosaic MDS shards (mosaicml-streaming's format version 2) and the `index.json` that lists them.

One sample per document with three variable-size columns, in the sorted order MDSWriter uses:
`id` and `text` ('str', UTF-8) and `tokens` ('ndarray:uint16' or 'ndarray:int32': a 1-D array
whose shape is stored per sample); in a build with metadata fields a fourth, `metadata` ('json').
Without compression or hashes, and with prep's fixed size limit, a shard is byte-equal to what
streaming's MDSWriter writes for the same samples (docs/formats-mds.md). Every offset is a uint32,
so a shard holds at most SIZE_LIMIT bytes.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType, TracebackType
from typing import Any

import numpy as np
import numpy.typing as npt

from prep.errors import InputError, IntegrityError
from prep.formats import as_tokens, little_endian
from prep.hashing import Digest, HashingWriter

VERSION = 2
FORMAT = "mds"
COLUMN_NAMES = ("id", "text", "tokens")
"""Sorted, as MDSWriter orders columns: a sample's sizes and data follow this order."""
METADATA_COLUMN = "metadata"
"""The column a build with metadata fields adds (between `id` and `text`, sorted): each document's
metadata object in streaming's `json` encoding (json.dumps with its defaults), which
StreamingDataset decodes to a dict."""
METADATA_ENCODING = "json"
TEXT_ENCODING = "str"
TOKEN_ENCODINGS: Mapping[np.dtype[Any], str] = MappingProxyType(
    {np.dtype("<u2"): "ndarray:uint16", np.dtype("<i4"): "ndarray:int32"})
"""The `tokens` column of each snapshot token dtype: streaming decodes it to that dtype, no glue."""
COMPRESSION = None
HASHES: tuple[str, ...] = ()
SIZE_LIMIT = 2**32 - 1
"""The largest shard: offsets are uint32 (MDSWriter refuses a size_limit of 2**32 or more)."""
INDEX_BASENAME = "index.json"
CHUNK_BYTES = 8 << 20
"""Sample bytes laid out at once by `encode_samples`."""
UINT32 = np.dtype("<u4")
"""Sample count, offsets and column sizes: little-endian uint32."""
SAMPLE_HEAD = 4 * len(COLUMN_NAMES)
"""A sample's first bytes: one uint32 size per variable-size column (4 more with metadata)."""

_SHAPE_LIMITS = np.array([1 << 8, 1 << 16, 1 << 32], dtype=np.int64)  # a shape takes the first width it is below
_BASENAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")

Offsets = npt.NDArray[np.int64]


def token_encoding(dtype: npt.DTypeLike) -> str:
    """The `tokens` column's encoding for a snapshot's token dtype."""
    resolved = little_endian(dtype)
    if resolved not in TOKEN_ENCODINGS:
        raise ValueError(f"MDS shards hold uint16 or int32 token ids, not {resolved}")
    return TOKEN_ENCODINGS[resolved]


def shard_config(dtype: npt.DTypeLike, with_metadata: bool = False) -> dict[str, Any]:
    """The writer settings every shard repeats (in its file and in `index.json`)."""
    names = ["id", *([METADATA_COLUMN] if with_metadata else []), "text", "tokens"]
    encodings = [TEXT_ENCODING, *([METADATA_ENCODING] if with_metadata else []), TEXT_ENCODING, token_encoding(dtype)]
    return {"column_encodings": encodings, "column_names": names, "column_sizes": [None] * len(names),
            "compression": COMPRESSION, "format": FORMAT, "hashes": list(HASHES), "size_limit": SIZE_LIMIT,
            "version": VERSION}


def _streaming_json(value: Any) -> bytes:
    # Exactly MDSWriter's spelling: sort_keys=True, default separators, ASCII escapes.
    return json.dumps(value, sort_keys=True).encode("ascii")


def metadata_value(metadata: bytes) -> bytes:
    """A document's metadata (prep.inputs.metadata's spelling) as streaming's `json` encoding
    spells the object it decodes to: json.dumps with its defaults, keys in their (sorted) order."""
    return json.dumps(json.loads(metadata)).encode("utf-8")


@functools.cache
def config_bytes(dtype: np.dtype[Any], with_metadata: bool = False) -> bytes:
    """The config JSON a shard file carries between its offsets and its samples."""
    return _streaming_json(shard_config(dtype, with_metadata))


def header_size(dtype: np.dtype[Any], samples: int, with_metadata: bool = False) -> int:
    """Bytes before the first sample: the count, n + 1 offsets and the config."""
    return 4 + 4 * (samples + 1) + len(config_bytes(dtype, with_metadata))


def _offsets(offsets: npt.ArrayLike, size: int, what: str) -> Offsets:
    array = np.asarray(offsets)
    if array.ndim != 1 or array.dtype.kind not in "iu" or len(array) == 0:
        raise ValueError(f"{what} offsets must be a non-empty 1-D array of integers")
    result = array.astype(np.int64)
    if result[0] != 0 or result[-1] != size or np.any(np.diff(result) < 0):
        raise ValueError(f"{what} offsets must rise from 0 to {size}")
    return result


def _check_utf8(blob: bytes, offsets: Offsets, what: str) -> None:
    """Every piece is UTF-8: the whole buffer is, and no piece starts inside a character."""
    try:
        blob.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{what} are not UTF-8 (byte {exc.start})") from None
    starts = offsets[:-1][offsets[:-1] < len(blob)]
    if np.any(np.frombuffer(blob, dtype=np.uint8)[starts] & 0xC0 == 0x80):
        raise ValueError(f"{what} offsets split a UTF-8 character")


@dataclass(frozen=True, eq=False)
class Sample:
    """One document as an MDS sample: its token ids, text and id, and in a shard with metadata
    its `metadata` column's bytes (streaming's `json` encoding)."""

    tokens: npt.NDArray[Any]
    text: str
    id: str
    metadata: bytes | None = None


@dataclass(frozen=True)
class SampleSizes:
    """Per document of a window: token count, UTF-8 bytes of the text and of the id (and of the
    metadata column, in a shard with metadata)."""

    tokens: npt.NDArray[np.int64]
    texts: npt.NDArray[np.int64]
    ids: npt.NDArray[np.int64]
    metadata: npt.NDArray[np.int64] | None = None

    def sample_bytes(self, dtype: npt.DTypeLike) -> npt.NDArray[np.int64]:
        """Bytes each document's sample takes in a shard of token ids of `dtype`."""
        if len(self.tokens) and self.tokens.min() < 1:
            raise ValueError("an MDS sample needs at least one token (streaming's ndarray encoding refuses 0)")
        extra = 0 if self.metadata is None else 4 + self.metadata
        return SAMPLE_HEAD + extra + self.ids + self.texts + _token_column_bytes(self.tokens,
                                                                                 little_endian(dtype).itemsize)

    def slice(self, start: int, end: int) -> SampleSizes:
        """The sizes of documents [start, end)."""
        return SampleSizes(self.tokens[start:end], self.texts[start:end], self.ids[start:end],
                           None if self.metadata is None else self.metadata[start:end])


def _shape_widths(counts: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Bytes of each 1-D shape: the smallest of uint8/16/32/64 holding it (streaming's rule)."""
    return np.left_shift(1, np.searchsorted(_SHAPE_LIMITS, counts, side="right")).astype(np.int64)


def _token_column_bytes(counts: npt.NDArray[np.int64], itemsize: int) -> npt.NDArray[np.int64]:
    """The `tokens` column of each sample: a byte (ndim, shape width), the shape, the ids."""
    return 1 + _shape_widths(counts) + counts * itemsize


@dataclass(frozen=True)
class Documents:
    """A window of a shard's documents: tokens, UTF-8 texts and ids back to back, each with n + 1 offsets."""

    tokens: npt.NDArray[Any]
    token_offsets: Offsets
    texts: bytes
    text_offsets: Offsets
    ids: bytes
    id_offsets: Offsets
    metadata: bytes | None = None  # the metadata column's values (streaming's json), in a shard with metadata
    metadata_offsets: Offsets | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "tokens", as_tokens(self.tokens))
        for name, size in (("token", self.tokens.size), ("text", len(self.texts)), ("id", len(self.ids))):
            object.__setattr__(self, f"{name}_offsets", _offsets(getattr(self, f"{name}_offsets"), size, name))
        if not len(self.token_offsets) == len(self.text_offsets) == len(self.id_offsets):
            raise ValueError("token, text and id offsets must count the same documents")
        _check_utf8(self.texts, self.text_offsets, "texts")
        _check_utf8(self.ids, self.id_offsets, "ids")
        if self.metadata is not None:
            offsets = _offsets(self.metadata_offsets if self.metadata_offsets is not None else [], len(self.metadata),
                               "metadata")
            object.__setattr__(self, "metadata_offsets", offsets)
            if len(offsets) != len(self.id_offsets):
                raise ValueError("metadata offsets must count the same documents as the ids")
            _check_utf8(self.metadata, offsets, "metadata")

    def __len__(self) -> int:
        return len(self.token_offsets) - 1

    @classmethod
    def of(cls, samples: Sequence[Sample], dtype: npt.DTypeLike) -> Documents:
        """The window of these documents, token ids as `dtype`."""
        texts = [sample.text.encode("utf-8") for sample in samples]
        ids = [sample.id.encode("utf-8") for sample in samples]
        tokens = [as_tokens(sample.tokens, dtype) for sample in samples]
        metadata = [sample.metadata or b"" for sample in samples] if samples and samples[0].metadata is not None else None
        return cls(np.concatenate(tokens) if tokens else np.empty(0, little_endian(dtype)), _ends(map(len, tokens)),
                   b"".join(texts), _ends(map(len, texts)), b"".join(ids), _ends(map(len, ids)),
                   None if metadata is None else b"".join(metadata), None if metadata is None else _ends(map(len, metadata)))

    @property
    def with_metadata(self) -> bool:
        return self.metadata is not None

    def sizes(self) -> SampleSizes:
        """What a shard's layout needs of these documents."""
        metadata = None if self.metadata_offsets is None else np.diff(self.metadata_offsets)
        return SampleSizes(np.diff(self.token_offsets), np.diff(self.text_offsets), np.diff(self.id_offsets), metadata)


def _ends(lengths: Iterable[int]) -> Offsets:
    """Offsets 0, l0, l0 + l1, ... of pieces of these lengths."""
    return np.concatenate([[0], np.cumsum(np.fromiter(lengths, dtype=np.int64))]).astype(np.int64)


@dataclass(frozen=True, eq=False)
class ShardLayout:
    """Where every sample of a shard starts: the uint32 offsets its header lists (n + 1)."""

    dtype: np.dtype[Any]
    offsets: npt.NDArray[np.uint32]
    with_metadata: bool = False

    @classmethod
    def plan(cls, dtype: npt.DTypeLike, sizes: Iterable[SampleSizes], with_metadata: bool = False) -> ShardLayout:
        """The layout of a shard of these windows (with a metadata column or not); InputError past SIZE_LIMIT."""
        resolved, ends, total = little_endian(dtype), [], 0
        header = header_size(resolved, 0, with_metadata)
        for window in sizes:
            window_ends = total + np.cumsum(window.sample_bytes(resolved))
            total = int(window_ends[-1]) if len(window_ends) else total
            header += 4 * len(window_ends)
            if header + total > SIZE_LIMIT:
                raise InputError(f"an MDS shard of more than {SIZE_LIMIT} bytes exceeds its uint32 offsets")
            ends.append(window_ends.astype(UINT32))
        return cls(resolved, np.uint32(header) + np.concatenate([np.zeros(1, UINT32), *ends]), with_metadata)

    @property
    def samples(self) -> int:
        return len(self.offsets) - 1

    @property
    def size(self) -> int:
        """Bytes of the whole shard file."""
        return int(self.offsets[-1])

    def header(self) -> bytes:
        """Sample count, offsets and config: the bytes before the first sample."""
        return (np.array([self.samples], UINT32).tobytes() + self.offsets.tobytes()
                + config_bytes(self.dtype, self.with_metadata))


def _chunk_ends(sample_bytes: npt.NDArray[np.int64], limit: int) -> list[int]:
    """Ends of runs of documents of about `limit` bytes each (at least one document each)."""
    ends, start, totals = [], 0, np.cumsum(sample_bytes)
    while start < len(sample_bytes):
        base = int(totals[start - 1]) if start else 0
        start = max(start + 1, int(np.searchsorted(totals, base + limit, "right")))
        ends.append(start)
    return ends


def _copy_pieces(out: memoryview, at: Offsets, source: memoryview, starts: Offsets, lengths: Offsets) -> None:
    for to, start, length in zip(at.tolist(), starts.tolist(), lengths.tolist()):
        out[to:to + length] = source[start:start + length]


def _place_rows(out: npt.NDArray[np.uint8], at: Offsets, rows: npt.NDArray[np.uint8]) -> None:
    out[at[:, None] + np.arange(rows.shape[1])] = rows


def _place_token_heads(raw: npt.NDArray[np.uint8], at: Offsets, counts: npt.NDArray[np.int64]) -> None:
    """Each `tokens` column's first byte (ndim 1 << 2 | the shape width's code) and its shape."""
    widths = _shape_widths(counts)
    for width in np.unique(widths).tolist():
        rows = widths == width
        code = np.full((int(rows.sum()), 1), 4 | (width.bit_length() - 1), dtype=np.uint8)
        shape = counts[rows].astype(f"<u{width}").view(np.uint8).reshape(-1, width)
        _place_rows(raw, at[rows], np.concatenate([code, shape], axis=1))


def _encode_run(docs: Documents, sizes: SampleSizes, first: int) -> bytes:
    """The sample bytes of the documents of `sizes`, from `first` on: sizes, id, (metadata,) text, tokens."""
    itemsize = docs.tokens.dtype.itemsize
    spans = sizes.sample_bytes(docs.tokens.dtype)
    starts = np.cumsum(spans) - spans
    buffer = bytearray(int(spans.sum()))
    raw, view = np.frombuffer(buffer, dtype=np.uint8), memoryview(buffer)
    metadata = [] if sizes.metadata is None else [sizes.metadata]
    heads = np.stack([sizes.ids, *metadata, sizes.texts, _token_column_bytes(sizes.tokens, itemsize)],
                     axis=1).astype(UINT32)
    _place_rows(raw, starts, heads.view(np.uint8).reshape(-1, heads.shape[1] * 4))
    end = first + len(spans)
    at = starts + heads.shape[1] * 4
    _copy_pieces(view, at, memoryview(docs.ids), docs.id_offsets[first:end], sizes.ids)
    at = at + sizes.ids
    if docs.metadata is not None and docs.metadata_offsets is not None and sizes.metadata is not None:
        _copy_pieces(view, at, memoryview(docs.metadata), docs.metadata_offsets[first:end], sizes.metadata)
        at = at + sizes.metadata
    _copy_pieces(view, at, memoryview(docs.texts), docs.text_offsets[first:end], sizes.texts)
    at = at + sizes.texts
    _place_token_heads(raw, at, sizes.tokens)
    _copy_pieces(view, at + 1 + _shape_widths(sizes.tokens), docs.tokens.data.cast("B"),
                 docs.token_offsets[first:end] * itemsize, sizes.tokens * itemsize)
    return bytes(buffer)


def encode_samples(docs: Documents, limit: int = CHUNK_BYTES) -> Iterator[bytes]:
    """The window's sample bytes, one after another, in pieces of about `limit` bytes."""
    sizes, start = docs.sizes(), 0
    for end in _chunk_ends(sizes.sample_bytes(docs.tokens.dtype), limit):
        yield _encode_run(docs, sizes.slice(start, end), start)
        start = end


class ShardWriter:
    """One shard file written front to back (planned header, then window after window), hashed as written."""

    def __init__(self, path: Path, layout: ShardLayout, durable: bool = True) -> None:
        _check_basename(path.name)
        self.path, self.layout = path, layout
        self._written = 0
        self._out = HashingWriter(path, durable)
        try:
            self._out.write(layout.header())
        except BaseException as exc:
            self._discard(exc)
            raise

    def write(self, docs: Documents) -> None:
        """Append the samples of the next window; ValueError if they are not the planned ones."""
        if docs.tokens.dtype != self.layout.dtype:
            raise ValueError(f"{self.path}: tokens of {docs.tokens.dtype}, the shard holds {self.layout.dtype}")
        if docs.with_metadata != self.layout.with_metadata:
            raise ValueError(f"{self.path}: documents {'with' if docs.with_metadata else 'without'} metadata")
        planned = np.diff(self.layout.offsets[self._written:self._written + len(docs) + 1].astype(np.int64))
        if not np.array_equal(planned, docs.sizes().sample_bytes(self.layout.dtype)):
            raise ValueError(f"{self.path}: documents {self._written}.. are not the ones the layout was planned for")
        for chunk in encode_samples(docs):
            self._out.write(chunk)
        self._written += len(docs)

    def close(self) -> tuple[ShardEntry, Digest]:
        """Finish the file (fsynced when durable): its `index.json` entry and its digest."""
        try:
            if self._written != self.layout.samples:
                raise ValueError(f"{self.path}: {self._written} of {self.layout.samples} samples written")
            digest = self._out.close()
            if digest.size != self.layout.size:
                raise IntegrityError(f"{self.path}: wrote {digest.size} bytes, the layout has {self.layout.size}")
        except BaseException as exc:
            self._discard(exc)
            raise
        return ShardEntry(self.path.name, digest.size, self.layout.samples, self.layout.dtype,
                          self.layout.with_metadata), digest

    def _discard(self, exc: BaseException) -> None:
        """Close and remove the unfinished file."""
        self._out.__exit__(type(exc), exc, exc.__traceback__)
        self.path.unlink(missing_ok=True)

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc is not None:
            self._discard(exc)
        elif not self._out.closed:
            self.close()


def write_shard(path: Path, dtype: npt.DTypeLike, windows: Callable[[], Iterable[Documents]],
                durable: bool = True) -> tuple[ShardEntry, Digest]:
    """A whole shard from a window source read twice (sizes, then bytes); its entry and digest."""
    first = next(iter(windows()), None)
    layout = ShardLayout.plan(dtype, (docs.sizes() for docs in windows()), first is not None and first.with_metadata)
    with ShardWriter(path, layout, durable) as writer:
        for docs in windows():
            writer.write(docs)
        return writer.close()


def _check_basename(basename: str) -> None:
    if not _BASENAME.fullmatch(basename) or basename == INDEX_BASENAME:
        raise ValueError(f"MDS shard basename {basename!r} must be a plain file name of [A-Za-z0-9._-]")


@dataclass(frozen=True)
class ShardEntry:
    """What `index.json` says of one shard: file name (beside the index), bytes, samples, token dtype."""

    basename: str
    bytes: int
    samples: int
    dtype: np.dtype[Any]
    with_metadata: bool = False  # whether its samples have the metadata column

    def __post_init__(self) -> None:
        _check_basename(self.basename)
        object.__setattr__(self, "dtype", little_endian(self.dtype))
        token_encoding(self.dtype)
        if type(self.bytes) is not int or type(self.samples) is not int:
            raise TypeError(f"{self.basename}: bytes and samples must be integers")
        if (not 0 <= self.samples <= (self.bytes - header_size(self.dtype, 0, self.with_metadata)) // 4
                or self.bytes > SIZE_LIMIT):
            raise ValueError(f"{self.basename}: {self.bytes} bytes cannot hold {self.samples} MDS samples")

    def to_json(self) -> dict[str, Any]:
        """The shard's object in `index.json`: its config, file and sample count."""
        raw = {"basename": self.basename, "bytes": self.bytes, "hashes": {}}
        return {**shard_config(self.dtype, self.with_metadata), "raw_data": raw, "samples": self.samples,
                "zip_data": None}


def index_bytes(entries: Sequence[ShardEntry]) -> bytes:
    """`index.json` listing these shards in this order, spelled as MDSWriter spells it."""
    names = [entry.basename for entry in entries]
    if len(set(names)) != len(names):
        raise ValueError("MDS shard basenames must be unique within an index")
    return _streaming_json({"shards": [entry.to_json() for entry in entries], "version": VERSION})
