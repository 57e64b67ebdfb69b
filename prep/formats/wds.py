"""WebDataset shards: uncompressed ustar archives, one sample (three members) per document.

Every byte is a function of the samples alone (fixed header fields, no timestamps, no owners),
and a sample's bytes do not depend on its neighbours, so the shuffle plan can fix every
sample's offset up front, before any shard is written.
"""

from __future__ import annotations

import functools
import io
import json
import os
import struct
import tarfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from prep.errors import InputError, IntegrityError, NotFoundError
from prep.formats import as_tokens, little_endian

KEYDECIMAL_WIDTH = 10
BLOCK_SIZE = 512
END_OF_ARCHIVE = bytes(2 * BLOCK_SIZE)
"""Two zero blocks close the archive; prep does not pad further to a 10240-byte record."""

JSON_SUFFIX = "json"
TOKENS_SUFFIX = "tokens.npy"
TEXT_SUFFIX = "txt"
MEMBER_SUFFIXES = (JSON_SUFFIX, TOKENS_SUFFIX, TEXT_SUFFIX)
"""Member suffixes in archive order (sorted member names)."""

MEMBER_MODE = 0o644
MAX_NAME_BYTES = 99  # the ustar name field is 100 bytes; keep a NUL so every reader agrees
MAX_MEMBER_SIZE = 8**11 - 1  # 11 octal digits in the size field

# name mode uid gid size mtime chksum type linkname magic version uname gname devmaj devmin prefix pad
_USTAR = struct.Struct("<100s8s8s8s12s12s8sc100s6s2s32s32s8s8s155s12s")
_CHECKSUM_OFFSET = 148
_CHECKSUM_END = _CHECKSUM_OFFSET + 8

_NPY_MAGIC = b"\x93NUMPY\x01\x00"  # format version 1.0
_NPY_ALIGN = 64
_NPY_GROWTHDECIMAL_WIDTH = 21  # numpy pads the shape so the header can be rewritten in place


def sample_key(position: int) -> str:
    """The key of the document at `position` in the snapshot: 10-digit zero-padded decimal."""
    if not 0 <= position < 10**KEYDECIMAL_WIDTH:
        raise ValueError(f"sample position {position} does not fit in {KEYDECIMAL_WIDTH} digits")
    return f"{position:0{KEYDECIMAL_WIDTH}d}"


def member_name(key: str, suffix: str) -> str:
    """`<key>.<suffix>`, refusing keys that readers would split differently or ustar cannot hold."""
    if not key or not key.isascii() or not key.isprintable() or "." in key or "/" in key:
        raise ValueError(f"sample key {key!r} must be printable ASCII without '.' or '/'")
    name = f"{key}.{suffix}"
    if len(name) > MAX_NAME_BYTES:
        raise ValueError(f"member name {name!r} is longer than {MAX_NAME_BYTES} bytes")
    return name


def _check_member_size(size: int) -> None:
    if size < 0:
        raise ValueError(f"member size must not be negative, got {size}")
    if size > MAX_MEMBER_SIZE:
        raise InputError(
            f"a WebDataset member of {size} bytes exceeds the ustar limit of {MAX_MEMBER_SIZE} bytes"
        )


_Sizes = TypeVar("_Sizes", int, npt.NDArray[np.int64])


def padded_size(size: _Sizes) -> _Sizes:
    """`size` (or each of an array of sizes) rounded up to whole 512-byte blocks."""
    return -(-size // BLOCK_SIZE) * BLOCK_SIZE


def member_span(size: int) -> int:
    """Bytes one member takes in the archive: its header block plus its padded data."""
    _check_member_size(size)
    return BLOCK_SIZE + padded_size(size)


def _octal_field(value: int, width: int) -> bytes:
    return f"{value:0{width - 1}o}".encode("ascii") + b"\0"


def _pack_fields(name: bytes, size: int) -> bytes:
    """A header block field by field, with its checksum field still eight spaces."""
    return _USTAR.pack(name, _octal_field(MEMBER_MODE, 8), _octal_field(0, 8), _octal_field(0, 8),
                       _octal_field(size, 12), _octal_field(0, 12), b" " * 8, tarfile.REGTYPE, b"", b"ustar\0",
                       b"00", b"", b"", b"", b"", b"", b"")


def _header_template() -> tuple[bytes, int]:
    """The header block with an empty name and size 0, and its byte sum (checksum field as spaces)."""
    block = _pack_fields(b"", 0)
    return block, sum(block)


_TEMPLATE, _TEMPLATE_SUM = _header_template()
_FIELDS_END = 265  # the template's bytes after mode .. version are all zero
_TEMPLATE_FIELDS = np.frombuffer(_TEMPLATE[MAX_NAME_BYTES + 1:_FIELDS_END], dtype=np.uint8)
_SIZE_OFFSET = 124
_ZERO_SIZE_SUM = sum(_octal_field(0, 12))


def member_header(name: str, size: int) -> bytes:
    """The ustar header block of a regular file: mode 0644, owner 0:0, no names, mtime 0.

    Only the name, size and checksum differ between members, so they are patched into a
    template (shard assembly makes three headers per document)."""
    encoded = name.encode("ascii")
    if not encoded or len(encoded) > MAX_NAME_BYTES or b"\0" in encoded:
        raise ValueError(f"member name {name!r} must be 1..{MAX_NAME_BYTES} ASCII bytes")
    _check_member_size(size)
    size_field = _octal_field(size, 12)
    header = bytearray(_TEMPLATE)
    header[: len(encoded)] = encoded
    header[_SIZE_OFFSET : _SIZE_OFFSET + 12] = size_field
    # The checksum is summed with its own field as spaces, then stored as 6 octal digits, NUL, space.
    checksum = _TEMPLATE_SUM + sum(encoded) + sum(size_field) - _ZERO_SIZE_SUM
    header[_CHECKSUM_OFFSET : _CHECKSUM_END - 1] = f"{checksum:06o}".encode("ascii") + b"\0"
    return bytes(header)


_DECIMAL_PLACES = 10 ** np.arange(KEYDECIMAL_WIDTH - 1, -1, -1, dtype=np.int64)
_OCTAL_SIZE_SHIFTS = 3 * np.arange(10, -1, -1, dtype=np.int64)  # 11 octal digits
_OCTAL_CHECKSUM_SHIFTS = 3 * np.arange(5, -1, -1, dtype=np.int64)  # 6 octal digits
_HEX_SHIFTS = (4 * np.arange(15, -1, -1)).astype(np.uint64)  # 16 hex digits of a u64, most significant first
_HEXDECIMAL_WIDTH = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)


def member_headers(positions: npt.ArrayLike, suffix: str, sizes: npt.ArrayLike) -> npt.NDArray[np.uint8]:
    """`member_header(member_name(sample_key(p), suffix), size)` for many members at once, as an
    (n, 512) array: numpy arithmetic instead of three Python-built headers per document."""
    keys = np.asarray(positions, dtype=np.int64)
    if keys.size and (keys.min() < 0 or keys.max() >= 10**KEYDECIMAL_WIDTH):
        raise ValueError(f"sample positions must have at most {KEYDECIMAL_WIDTH} digits")
    return headers_for_keys((keys[:, None] // _DECIMAL_PLACES % 10 + 48).astype(np.uint8), suffix, sizes)


def hex_key_chars(key_hi: npt.ArrayLike, key_lo: npt.ArrayLike) -> npt.NDArray[np.uint8]:
    """The (n, 32) ASCII bytes of `order_key_name` for many keys at once."""
    halves = [np.asarray(half, dtype=np.uint64) for half in (key_hi, key_lo)]
    nibbles = np.concatenate([(half[:, None] >> _HEX_SHIFTS) & np.uint64(15) for half in halves], axis=1)
    return _HEXDECIMAL_WIDTH[nibbles.astype(np.int64)]


def order_key_name(key_hi: int, key_lo: int) -> str:
    """The sample key of a document: its 128-bit order key as 32 lowercase hex digits, so keys
    sort in sample order and say nothing about where the sample sits in the snapshot."""
    return f"{key_hi:016x}{key_lo:016x}"


def headers_for_keys(key_chars: npt.NDArray[np.uint8], suffix: str, sizes: npt.ArrayLike) -> npt.NDArray[np.uint8]:
    """Member headers named `<key>.<suffix>` from an (n, width) array of each key's ASCII bytes."""
    headers = np.zeros((len(np.asarray(sizes)), BLOCK_SIZE), dtype=np.uint8)
    place_headers(headers, np.arange(len(headers)), key_chars, suffix, sizes)
    return headers


def place_headers(blocks: npt.NDArray[np.uint8], rows: npt.NDArray[np.int64], key_chars: npt.NDArray[np.uint8],
                  suffix: str, sizes: npt.ArrayLike, key_sums: npt.NDArray[np.int64] | None = None) -> None:
    """`headers_for_keys` written into `rows` of zero-filled (m, 512) blocks: only the bytes that
    are not zero. `key_sums` (each key's byte sum) may be given when several suffixes share keys."""
    lengths = np.asarray(sizes, dtype=np.int64)
    if lengths.size and not 0 <= lengths.min() <= lengths.max() <= MAX_MEMBER_SIZE:
        raise ValueError(f"member sizes must be within 0..{MAX_MEMBER_SIZE}")
    width, rest = (key_chars.shape[1] if key_chars.ndim == 2 else 0), ("." + suffix).encode("ascii")
    if width + len(rest) > MAX_NAME_BYTES:
        raise ValueError(f"member names of {width + len(rest)} bytes are longer than {MAX_NAME_BYTES}")
    head = np.zeros((len(lengths), _CHECKSUM_END), dtype=np.uint8)  # name .. checksum, built in place
    head[:, :width] = key_chars
    head[:, width:width + len(rest)] = np.frombuffer(rest, dtype=np.uint8)
    head[:, MAX_NAME_BYTES + 1:] = _TEMPLATE_FIELDS[:_CHECKSUM_END - MAX_NAME_BYTES - 1]
    size_digits = ((lengths[:, None] >> _OCTAL_SIZE_SHIFTS) & 7) + 48
    head[:, _SIZE_OFFSET:_SIZE_OFFSET + 11] = size_digits
    checksum = _TEMPLATE_SUM - _ZERO_SIZE_SUM + sum(rest) + (
        key_chars.reshape(len(lengths), width).sum(axis=1, dtype=np.int64) if key_sums is None else key_sums)
    for column in range(size_digits.shape[1]):  # the size field's NUL adds nothing
        checksum += size_digits[:, column]
    head[:, _CHECKSUM_OFFSET:_CHECKSUM_OFFSET + 6] = ((checksum[:, None] >> _OCTAL_CHECKSUM_SHIFTS) & 7) + 48
    head[:, _CHECKSUM_OFFSET + 6] = 0
    blocks[rows, :_CHECKSUM_END] = head
    blocks[rows, _CHECKSUM_END:_FIELDS_END] = _TEMPLATE_FIELDS[_CHECKSUM_END - MAX_NAME_BYTES - 1:]


def _member_header_reference(name: str, size: int) -> bytes:
    """The same header built field by field (kept to test the template against)."""
    header = bytearray(_pack_fields(name.encode("ascii"), size))
    # The checksum is summed with its own field as spaces, then stored as 6 octal digits, NUL, space.
    checksum = sum(header)
    header[_CHECKSUM_OFFSET : _CHECKSUM_END - 1] = f"{checksum:06o}".encode("ascii") + b"\0"
    return bytes(header)


def member_bytes(name: str, data: bytes) -> bytes:
    """One complete member: header, data, and zero padding to the next block."""
    padding = padded_size(len(data)) - len(data)
    return member_header(name, len(data)) + data + bytes(padding)


def npy_header(count: int, dtype: npt.DTypeLike) -> bytes:
    """The NPY 1.0 header numpy writes for a 1-D array of `count` little-endian `dtype` items."""
    return npy_header_function(dtype)(count)


def npy_header_function(dtype: npt.DTypeLike) -> Callable[[int], bytes]:
    """`npy_header(count, dtype)` as a function of the count alone, for one call per document."""
    prefix, tails = _npy_header_parts(little_endian(dtype).str)

    def header(count: int) -> bytes:
        digits = str(count).encode("ascii")
        return prefix + digits + tails[len(digits)]

    return header


@functools.cache
def _npy_header_parts(descr: str) -> tuple[bytes, dict[int, bytes]]:
    """What surrounds the count's digits in a 1-D header: numpy pads the shape so every count
    below 10**21 gives a header of the same length, hence one tail per digit count."""
    def build(count: str) -> bytes:
        text = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': ({count},), }}"
        text += " " * (_NPY_GROWTHDECIMAL_WIDTH - len(count))
        text_size = len(text) + 1  # the closing newline
        padding = _NPY_ALIGN - (len(_NPY_MAGIC) + 2 + text_size) % _NPY_ALIGN
        length = struct.pack("<H", text_size + padding)
        return _NPY_MAGIC + length + text.encode("ascii") + b" " * padding + b"\n"

    prefix = build("0")[: build("0").index(b"(") + 1]
    tails = {}
    for width in range(1, _NPY_GROWTHDECIMAL_WIDTH + 1):
        sample = build("1" * width)
        tails[width] = sample[len(prefix) + width:]
    return prefix, tails


def npy_size(count: int, dtype: npt.DTypeLike) -> int:
    """Size of `npy_bytes` for `count` tokens of `dtype`, without building it."""
    return len(npy_header(count, dtype)) + count * little_endian(dtype).itemsize


def npy_sizes(counts: npt.ArrayLike, dtype: npt.DTypeLike) -> npt.NDArray[np.int64]:
    """`npy_size` for many token counts at once; the 1-D header length does not depend on the count."""
    return len(npy_header(0, dtype)) + np.asarray(counts, dtype=np.int64) * little_endian(dtype).itemsize


def npy_bytes(tokens: npt.ArrayLike) -> bytes:
    """A 1-D token array as a .npy file, byte-equal to `np.save` of the little-endian array."""
    array = as_tokens(tokens)
    return npy_header(array.size, array.dtype) + array.tobytes()


def sample_json(doc_id: str, source: str, line: int, tokens: int, metadata: bytes | None = None) -> bytes:
    """The `.json` member: canonical JSON {"id","line","source","tokens"} (sorted, compact, UTF-8),
    with `"metadata"` (the document's metadata object, prep.inputs.metadata) in a build with
    metadata fields.

    Spelled out directly, since shard assembly makes one per document: the same bytes as
    canonical.dumps (keys in sorted order, strings escaped as json.dumps does without
    ensure_ascii, integers in decimal; metadata floats as json.dumps spells them)."""
    nested = b"" if metadata is None else b',"metadata":' + metadata
    return (f'{{"id":{_json_string(doc_id)},"line":{int(line)}'.encode() + nested
            + f',"source":{_json_string(source)},"tokens":{int(tokens)}}}'.encode())


_json_string = json.encoder.encode_basestring
_POWERS = (10 ** np.arange(19, -1, -1, dtype=np.uint64)).astype(np.uint64)  # 20 digits hold any u64
DECIMAL_WIDTH = len(_POWERS)  # columns of `decimal_digits`
_ASCENDING = _POWERS[-2::-1].copy()  # 10, 100, ..., 10**19


def decimal_digits(values: npt.ArrayLike) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]:
    """`str(v)` of many non-negative integers: an (n, 20) array of ASCII digits, right-aligned
    (leading zeros before each number's own digits), and each number's digit count. One
    division per digit of the largest number, not 20 uint64 divisions per number."""
    numbers = np.asarray(values, dtype=np.int64)
    if numbers.size and numbers.min() < 0:
        raise ValueError("decimal_digits takes non-negative integers")
    digits = np.full((len(numbers), DECIMAL_WIDTH), 48, dtype=np.uint8)
    rest, column = numbers.copy(), DECIMAL_WIDTH - 1
    while column >= 0 and rest.any():
        quotient = rest // 10
        digits[:, column] += (rest - quotient * 10).astype(np.uint8)
        rest, column = quotient, column - 1
    return digits, 1 + np.searchsorted(_ASCENDING, numbers.astype(np.uint64), side="right")


def npy_headers(counts: npt.ArrayLike, dtype: npt.DTypeLike) -> npt.NDArray[np.uint8]:
    """`npy_header(count, dtype)` of many counts at once, as an (n, header size) array."""
    prefix, tails = _npy_header_parts(little_endian(dtype).str)
    numbers = np.asarray(counts, dtype=np.int64)
    digits, widths = decimal_digits(numbers)
    size = len(prefix) + 1 + len(tails[1])
    headers = np.zeros((len(numbers), size), dtype=np.uint8)
    headers[:, :len(prefix)] = np.frombuffer(prefix, dtype=np.uint8)
    for width in np.unique(widths).tolist():
        rows = widths == width
        headers[rows, len(prefix):len(prefix) + width] = digits[rows, DECIMAL_WIDTH - width:]
        headers[rows, len(prefix) + width:] = np.frombuffer(tails[width], dtype=np.uint8)
    return headers


def sample_span(json_size: int, npy_size: int, txt_size: int) -> int:
    """Bytes one sample takes in the archive; the key does not matter (names fit one block)."""
    return member_span(json_size) + member_span(npy_size) + member_span(txt_size)


def sample_spans(json_sizes: npt.ArrayLike, npy_sizes: npt.ArrayLike, txt_sizes: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """`sample_span` for many samples at once (element-wise), for planning whole shards."""
    columns = [np.asarray(sizes, dtype=np.int64) for sizes in (json_sizes, npy_sizes, txt_sizes)]
    spans = np.zeros(np.broadcast_shapes(*(column.shape for column in columns)), dtype=np.int64)
    for column in columns:
        if column.size:
            _check_member_size(int(column.min()))
            _check_member_size(int(column.max()))
        spans += BLOCK_SIZE + padded_size(column)
    return spans


def archive_size(sample_spans: Iterable[int]) -> int:
    """Size of a shard holding samples of these spans, end-of-archive blocks included."""
    return sum(sample_spans) + len(END_OF_ARCHIVE)


def sample_bytes(key: str, json_bytes: bytes, npy_bytes: bytes, txt_bytes: bytes) -> bytes:
    """The exact bytes of one sample's three members, to be written at the sample's offset."""
    members = zip(MEMBER_SUFFIXES, (json_bytes, npy_bytes, txt_bytes), strict=True)
    return b"".join(member_bytes(member_name(key, suffix), data) for suffix, data in members)


@dataclass(frozen=True)
class Sample:
    """One document as WebDataset members: key, `.json`, `.tokens.npy` and `.txt` bytes."""

    key: str
    json: bytes
    tokens: bytes
    text: bytes

    @classmethod
    def build(
        cls, position: int, doc_id: str, source: str, line: int, tokens: npt.ArrayLike, text: str
    ) -> Sample:
        """The sample of the document at `position`, encoded exactly as prep writes it."""
        array = as_tokens(tokens)
        return cls(
            key=sample_key(position),
            json=sample_json(doc_id, source, line, int(array.size)),
            tokens=npy_bytes(array),
            text=text.encode("utf-8"),
        )

    @property
    def span(self) -> int:
        """Bytes this sample takes in the archive."""
        return sample_span(len(self.json), len(self.tokens), len(self.text))

    def to_bytes(self) -> bytes:
        """The sample's archive bytes (see `sample_bytes`)."""
        return sample_bytes(self.key, self.json, self.tokens, self.text)


def write_shard(path: str | os.PathLike[str], samples: Iterable[Sample]) -> int:
    """Write a whole shard sequentially (overwrites `path`); returns its size in bytes."""
    written = 0
    with open(path, "wb") as out:
        for sample in samples:
            written += out.write(sample.to_bytes())
        written += out.write(END_OF_ARCHIVE)
    return written


def iter_samples(path: str | os.PathLike[str]) -> Iterator[tuple[str, dict[str, bytes]]]:
    """Yield (key, {suffix: bytes}) per sample of a shard, in archive order.

    Raises IntegrityError naming the file for unreadable archives, non-file members, or a key
    whose members are not adjacent.
    """
    name = os.fspath(path)
    if not Path(path).is_file():
        raise NotFoundError(f"{name}: no such file")
    seen: set[str] = set()
    key: str | None = None
    members: dict[str, bytes] = {}
    try:
        with tarfile.open(name, mode="r|") as archive:
            for info in archive:
                if not info.isreg() or "." not in info.name or "/" in info.name:
                    raise IntegrityError(f"{name}: unexpected member {info.name!r}")
                member_key, suffix = info.name.split(".", 1)
                if member_key != key:
                    if key is not None:
                        yield key, members
                    if member_key in seen:
                        raise IntegrityError(f"{name}: members of sample {member_key} are not adjacent")
                    seen.add(member_key)
                    key, members = member_key, {}
                if suffix in members:
                    raise IntegrityError(f"{name}: duplicate member {info.name!r}")
                extracted = archive.extractfile(info)
                assert extracted is not None  # regular files always extract
                members[suffix] = extracted.read()
    except tarfile.TarError as exc:
        raise IntegrityError(f"{name}: not a readable tar archive: {exc}") from None
    if key is not None:
        yield key, members


def load_npy(data: bytes) -> npt.NDArray[Any]:
    """Decode a `.tokens.npy` member without allowing pickled objects."""
    array: npt.NDArray[Any] = np.load(io.BytesIO(data), allow_pickle=False)
    return array
